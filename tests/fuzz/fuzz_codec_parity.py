"""Atheris target: the native request decoder against the generated parser (upb) on
arbitrary bytes. rs_decode_request promises (native/codec.h) to succeed only where its
result is exactly what upb plus recserve.wire.codec's checks give, and to leave everything
else to them: so both paths must give the same arrays (bit for bit) or the same
RequestError message. tests/wire/test_codec_native.py checks this on generated requests;
here libFuzzer steers the bytes by the coverage of recserve.wire.

Run: python tests/fuzz/fuzz_codec_parity.py CORPUS_DIR [libFuzzer flags], or `make fuzz`.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["recserve.wire"]):
    from recserve.wire import codec

_spec = importlib.util.spec_from_file_location(
    "codec_cases", Path(__file__).resolve().parents[1] / "wire" / "test_codec_native.py")
assert _spec and _spec.loader
_cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cases)
if codec._native is None:
    raise SystemExit("the native decoder is off (RECSERVE_PURE_PYTHON=1): nothing to compare")


def test_one_input(data: bytes) -> None:
    native, generated = _cases.outcome(codec.decode_request, data), _cases.outcome(codec._decode_message, data)
    assert native == generated, (data.hex(), native, generated)


def main() -> None:
    # float_val beyond float16's range becomes inf on both paths, with numpy's warning.
    warnings.simplefilter("ignore", RuntimeWarning)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
