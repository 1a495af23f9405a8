"""What every gRPC servicer shares: answering an error status, dropping a call whose
deadline passed while it waited, whether the front end tried the native route already.
Stateless, thread-safe."""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

from recserve.errors import RecserveError
from recserve.server.errors import grpc_code

__all__ = ["NATIVE_DECLINED", "abort", "check_deadline", "native_declined"]

# Metadata the gRPC front end (recserve.server.grpc_front) adds to a call it forwards after
# the native route declined it (and counted why): trying the route again would count it twice.
NATIVE_DECLINED = "x-recserve-native-declined"


def abort(context: grpc.ServicerContext, status: int, message: Any) -> NoReturn:
    """End the call with the gRPC code of recserve status `status`."""
    context.abort(grpc_code(status), str(message))
    raise AssertionError("grpc.ServicerContext.abort returned")  # it always raises


def check_deadline(context: grpc.ServicerContext) -> None:
    """A call whose deadline passed while it waited for its turn is dropped, not run."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise RecserveError("the call's deadline passed before its turn came; it was not run", status=504)


def native_declined(context: grpc.ServicerContext) -> bool:
    """Whether the front end tried this call on the native route already."""
    return any(key == NATIVE_DECLINED for key, _ in context.invocation_metadata())
