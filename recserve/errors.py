"""recserve's exceptions: one root, each carrying the status a caller sees.

    RecserveError                  status 500 unless a subclass says otherwise
    ├── ConfigError                a config field or value is invalid (at initialize)
    ├── RequestError               400: the request bytes or tensors are invalid
    ├── ModelNotReadyError         503: no model version is being served yet
    ├── ModelLoadError             a model dir or checkpoint cannot be used
    │   ├── VersionNotReadyError   MANIFEST missing or files still being written
    │   └── CorruptVersionError    a file's size or sha256 differs from the MANIFEST
    ├── StorageError               a storage backend (disk, OSS, HDFS, Redis) failed
    └── InternalError              500: a bug or an unexpected runtime failure

Errors from lower libraries (onnxruntime, protobuf, boto3, redis) are translated once,
at the boundary that calls them, with ``raise ... from exc``; ``message`` is what the user
reads and never holds secrets.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "CorruptVersionError",
    "InternalError",
    "ModelLoadError",
    "ModelNotReadyError",
    "RecserveError",
    "RequestError",
    "StorageError",
    "VersionNotReadyError",
]


class RecserveError(Exception):
    """Root of every error recserve raises on purpose."""

    status: int = 500

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status

    def __str__(self) -> str:
        return self.message


class ConfigError(RecserveError):
    """A config field is unknown or has a bad value; the message names both and the valid choices."""

    status = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class RequestError(RecserveError):
    status = 400


class ModelNotReadyError(RecserveError):
    status = 503


class ModelLoadError(RecserveError):
    pass


class VersionNotReadyError(ModelLoadError):
    pass


class CorruptVersionError(ModelLoadError):
    pass


class StorageError(RecserveError):
    pass


class InternalError(RecserveError):
    pass
