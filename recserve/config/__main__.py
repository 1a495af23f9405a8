"""`python -m recserve.config`: render docs/config.md, or check a config file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from recserve.config.docs import render_markdown
from recserve.config.schema import parse_model_configs
from recserve.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recserve.config", description="Processor config tools.")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--markdown", action="store_true", help="print docs/config.md")
    group.add_argument("--check", metavar="FILE", help="validate a config file and print it, secrets hidden")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(render_markdown())
        return 0
    try:
        models = parse_model_configs(Path(args.check))
    except ConfigError as exc:
        print(f"{args.check}: {exc.message}", file=sys.stderr)
        return 2
    print(json.dumps({name: config.public_dict() for name, config in models}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
