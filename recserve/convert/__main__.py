"""`python -m recserve.convert SAVEDMODEL_DIR OUT_DIR [--signature NAME] [--check N]`: the
conversion process (TensorFlow is imported here only). Exit status 0 done, 2 refused (the
reason on stderr as `recserve: ...`), MISSING_EXTRA when TensorFlow or tf2onnx is missing."""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from recserve.errors import RecserveError
from recserve.model_store.savedmodel_conversion import MISSING_EXTRA


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recserve.convert")
    parser.add_argument("savedmodel_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--signature", default=None)
    parser.add_argument("--check", type=int, default=0)
    args = parser.parse_args(argv)
    if os.path.lexists(args.out_dir):
        print(f"recserve: {args.out_dir} already exists; recserve convert writes a new directory", file=sys.stderr)
        return 2
    try:
        import tensorflow  # noqa: F401
        import tf2onnx  # noqa: F401
    except ImportError as exc:
        print(f"recserve: {exc}", file=sys.stderr)
        return MISSING_EXTRA
    from recserve.convert.savedmodel import convert_savedmodel

    try:
        conversion = convert_savedmodel(args.savedmodel_dir, args.out_dir, args.signature)
        if args.check:
            from recserve.convert.parity import check_parity

            report = check_parity(args.savedmodel_dir, args.out_dir, conversion.signature, args.check,
                                  {lookup.input: lookup.padded for lookup in conversion.lookups},
                                  {lookup.weights: lookup.input for lookup in conversion.lookups if lookup.weights})
            print(report.summary())
    except RecserveError as exc:
        shutil.rmtree(args.out_dir, ignore_errors=True)  # ours (it did not exist): a refused conversion leaves nothing
        print(f"recserve: {exc.message}", file=sys.stderr)
        return 2
    for warning in conversion.warnings:
        print(f"warning: {warning}")
    defaults = {b.table: b.default for b in conversion.spec.embeddings}
    for lookup in conversion.lookups:
        default = defaults[lookup.table]
        missing = (f"; missing ids: row id mod {len(default.matrix)} of {default.rows_file}"
                   if default.matrix is not None else "")
        weighted = f" weighted by {lookup.weights!r}" if lookup.weights else ""
        print(f"lookup {lookup.input!r} -> table {lookup.table!r} (dim {lookup.dim}, {lookup.combiner}{weighted}{missing})")
    print(f"wrote {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
