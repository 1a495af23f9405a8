"""The server's own errors, and how every error becomes an HTTP status or a gRPC code.

Processor errors keep their status (400, 503, 500); the server adds unknown model (404),
request too large (413), admin authentication (401) and conflicts with a model's state (409). Stateless, thread-safe.
"""

from __future__ import annotations

import grpc

from recserve.errors import RecserveError

__all__ = ["GRPC_CODES", "AdminAuthError", "ConflictError", "RequestTooLargeError", "UnknownModelError", "grpc_code"]


class UnknownModelError(RecserveError):
    status = 404


class RequestTooLargeError(RecserveError):
    status = 413


class AdminAuthError(RecserveError):
    status = 401


class ConflictError(RecserveError):
    """The call does not fit the model's state (e.g. saving a warmup sample never started)."""

    status = 409


GRPC_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def grpc_code(status: int) -> grpc.StatusCode:
    return GRPC_CODES.get(status, grpc.StatusCode.INTERNAL)
