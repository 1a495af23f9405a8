"""`python -m benchmarks [name ...]`: run bench_<name>.py modules (all by default) and
rewrite their sections of BENCHMARKS.md."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

from benchmarks.report import section, write_sections


def main(argv: list[str]) -> int:
    if argv[:1] == ["soak"]:  # the chaos soak (RELIABILITY.md), not a BENCHMARKS.md section
        from benchmarks.soak import main as soak

        return soak(argv[1:])
    here = Path(__file__).resolve().parent
    names = argv or sorted(p.stem.removeprefix("bench_") for p in here.glob("bench_*.py"))
    failed = 0
    for name in names:
        module = importlib.import_module(f"benchmarks.bench_{name}")
        started = time.monotonic()
        print(f"== bench_{name}", flush=True)
        rows = module.run()
        for row in rows:
            print("  " + row.markdown(), flush=True)
        notes = getattr(module, "NOTES", "")
        write_sections({f"bench_{name}": section(f"bench_{name}", rows, f"make bench  # python -m benchmarks {name}", notes)})
        failed += sum(1 for r in rows if r.met is False)
        print(f"   ({time.monotonic() - started:.0f} s)", flush=True)
    if failed:
        print(f"{failed} row(s) missed their goal; see BENCHMARKS.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
