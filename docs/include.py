"""Inlines docs/*.md sections into README.md between include markers.

    <!-- include docs/config.md -->
    ...generated...
    <!-- end include -->

`python docs/include.py` rewrites README.md; `--check` exits 1 when it is stale. A doc whose
first line is a level-1 heading is demoted one level, so it nests under the README's title.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- include (\S+) -->\n).*?(<!-- end include -->)", re.S)


def _section(path: str) -> str:
    text = (ROOT / path).read_text(encoding="utf-8").strip("\n") + "\n"
    if text.startswith("# "):
        text = re.sub(r"^(#+ )", r"#\1", text, flags=re.M)
    return text


def render(readme: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + _section(m.group(2)) + m.group(3), readme)


def main(argv: list[str]) -> int:
    path = ROOT / "README.md"
    current = path.read_text(encoding="utf-8")
    wanted = render(current)
    if "--check" in argv:
        if wanted != current:
            print("README.md is stale: run `make docs` (python docs/include.py)", file=sys.stderr)
            return 1
        return 0
    path.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
