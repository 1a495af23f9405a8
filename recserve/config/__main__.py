import sys

from recserve.config.schema import main

sys.exit(main())
