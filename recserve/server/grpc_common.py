"""What every gRPC servicer shares: answering an error status, dropping a call whose
deadline passed while it waited. Stateless, thread-safe."""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

from recserve.errors import RecserveError
from recserve.server.errors import grpc_code

__all__ = ["abort", "check_deadline"]


def abort(context: grpc.ServicerContext, status: int, message: Any) -> NoReturn:
    """End the call with the gRPC code of recserve status `status`."""
    context.abort(grpc_code(status), str(message))
    raise AssertionError("grpc.ServicerContext.abort returned")  # it always raises


def check_deadline(context: grpc.ServicerContext) -> None:
    """A call whose deadline passed while it waited for its turn is dropped, not run."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise RecserveError("the call's deadline passed before its turn came; it was not run", status=504)
