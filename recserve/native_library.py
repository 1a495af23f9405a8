"""Opening one of recserve's own C libraries (a plain shared object beside its wrapper module)
with each function's ctypes signature declared, for the wrappers in wire/, embedding/,
runtime/ and processor/."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["open_library"]

Signatures = Mapping[str, tuple[Any, Sequence[Any]]]


def open_library(path: Path, what: str, signatures: Signatures, *, twin: bool = True) -> ctypes.CDLL:
    """`signatures`: function name -> (restype, argtypes). Raises ImportError naming `what` and
    how to build it (and, where a pure-Python twin exists, how to use it instead)."""
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        hint = ", or set RECSERVE_PURE_PYTHON=1" if twin else ""
        raise ImportError(f"recserve's {what} library is missing or broken ({exc}); build it with "
                          f"`python setup.py build_ext --inplace`{hint}") from exc
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, list(argtypes)
    return lib
