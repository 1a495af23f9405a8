"""String tensors as ONNX Runtime's Python binding takes them.

Requests carry string values as bytes (the wire's `string_val`, TF Serving's DT_STRING).
The binding converts each element of an object array with `str()`, so a bytes element
b"abc" reaches the graph as the text "b'abc'", and it decodes a bytes-dtype ('S') array as
UTF-8. It holds strings as UTF-8 text, so an element that is not valid UTF-8 cannot be fed
at all: it is refused by name, never altered.
"""

from __future__ import annotations

import numpy as np

from recserve.errors import RequestError

__all__ = ["as_ort_strings"]


def as_ort_strings(name: str, values: np.ndarray) -> np.ndarray:
    """`values` (bytes, str or a mix; object or 'S' dtype) as an object array of str.
    Raises RequestError naming the input and the first element that is not UTF-8."""
    if values.dtype.kind == "U":
        return values
    flat = values.ravel()
    out = np.empty(flat.shape, dtype=object)
    for i, v in enumerate(flat):
        if isinstance(v, (bytes, np.bytes_)):
            try:
                v = bytes(v).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RequestError(
                    f"string input {name!r}: element {i} ({bytes(v)[:32]!r}) is not valid UTF-8 at byte "
                    f"{exc.start}; this model's string inputs run on ONNX Runtime's Python binding, which "
                    "holds strings as UTF-8 text"
                ) from None
        elif not isinstance(v, str):
            raise RequestError(f"string input {name!r}: element {i} is a {type(v).__name__}, not bytes or text")
        out[i] = v
    return out.reshape(values.shape)
