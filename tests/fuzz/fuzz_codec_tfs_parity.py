"""Atheris target: the native TF Serving request parser (rs_decode_tfs_request) against its
Python twin (recserve.wire.tfserving_codec) on arbitrary bytes: both must give the same
model spec and arrays (bit for bit but NaN payloads) or the same RequestError message.
tests/wire/test_tfserving_codec.py checks this on generated requests; here libFuzzer steers
the bytes by the coverage of recserve.wire.

Run: python tests/fuzz/fuzz_codec_tfs_parity.py CORPUS_DIR [libFuzzer flags], or `make fuzz`.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["recserve.wire"]):
    from recserve.wire import tfserving_codec as tfs

_spec = importlib.util.spec_from_file_location(
    "tfs_cases", Path(__file__).resolve().parents[1] / "wire" / "test_tfserving_codec.py")
assert _spec and _spec.loader
_cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cases)
if tfs._parse_tfs is None:
    raise SystemExit("the native decoder is off (RECSERVE_PURE_PYTHON=1): nothing to compare")


def test_one_input(data: bytes) -> None:
    native = _cases.outcome(tfs.parse_predict_request, data)
    twin = _cases.outcome(tfs.decode_predict_request, data)
    assert native == twin, (data.hex(), native, twin)


def main() -> None:
    warnings.simplefilter("ignore", RuntimeWarning)   # half values beyond float16's range
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
