"""KServe v2 tensor datatypes and their numpy dtypes: what the server's KServe routes and the
`recserve perf` client share. No protobuf here: recserve's generated "inference" messages
cannot share a process's protobuf pool with tritonclient.grpc's, and a client of the HTTP
routes needs neither."""

from __future__ import annotations

from typing import Any

import numpy as np

from recserve.errors import RequestError

__all__ = ["DATATYPE_NUMPY", "datatype_of"]

DATATYPE_NUMPY: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
_DATATYPE = {dtype: name for name, dtype in DATATYPE_NUMPY.items()}


def datatype_of(array: np.ndarray) -> str:
    datatype = _DATATYPE.get(array.dtype)
    if datatype is None:
        if array.dtype.kind in "SU":
            return "BYTES"
        raise RequestError(f"output dtype {array.dtype} has no KServe v2 datatype")
    return datatype
