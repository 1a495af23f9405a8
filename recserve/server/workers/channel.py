"""The leader's and a worker's line to each other: messages both ways over a Unix socket.

Either side sends one-way messages (`send`) or calls the other and waits for its answer
(`call`). One reader thread per side hands incoming messages to `on_message` (one-way) or
`on_call` (answered; run on a small pool so a slow call never holds the line). A call
answered with an error raises it again on the caller's side as a RecserveError with the
same status and message. Built on multiprocessing.connection (framing, an authkey
handshake, pickling): both ends are recserve processes forked from one parent.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from recserve.errors import InternalError, RecserveError

__all__ = ["Channel", "ChannelClosed"]

log = logging.getLogger("recserve.server")


class ChannelClosed(RecserveError):
    """The other process went away."""

    status = 503


class Channel:
    """Thread-safe."""

    def __init__(
        self,
        connection: Connection,
        *,
        name: str,
        on_message: Callable[[str, dict[str, Any]], None],
        on_call: Callable[[str, dict[str, Any]], Any],
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._connection = connection
        self._name = name
        self._on_message = on_message
        self._on_call = on_call
        self._on_close = on_close
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, Future[Any]] = {}
        self._closed = threading.Event()
        self._calls = ThreadPoolExecutor(4, thread_name_prefix=f"recserve-{name}-calls")
        self._reader = threading.Thread(target=self._read, name=f"recserve-{name}", daemon=True)

    def start(self) -> Channel:
        self._reader.start()
        return self

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def send(self, kind: str, **fields: Any) -> None:
        self._write(("message", 0, kind, fields))

    def call(self, kind: str, timeout: float | None = 60.0, **fields: Any) -> Any:
        """The other side's answer to `kind`; raises its error, or ChannelClosed."""
        call_id = next(self._ids)
        future: Future[Any] = Future()
        self._pending[call_id] = future
        try:
            self._write(("call", call_id, kind, fields))
            return future.result(timeout)
        except TimeoutError as exc:
            raise InternalError(f"{self._name}: no answer to {kind!r} within {timeout:.0f} s") from exc
        finally:
            self._pending.pop(call_id, None)

    def _write(self, message: tuple[str, int, str, Any]) -> None:
        if self._closed.is_set():
            raise ChannelClosed(f"{self._name}: the other process has gone away")
        try:
            with self._send_lock:
                self._connection.send(message)
        except (OSError, EOFError, ValueError) as exc:
            self._shut()
            raise ChannelClosed(f"{self._name}: the other process has gone away ({exc})") from exc

    def _read(self) -> None:
        try:
            while True:
                try:
                    kind_of, call_id, kind, fields = self._connection.recv()
                except (OSError, EOFError):
                    return
                if kind_of == "reply":
                    future = self._pending.get(call_id)
                    if future is not None:
                        ok, value = fields
                        if ok:
                            future.set_result(value)
                        else:
                            future.set_exception(RecserveError(value[1], status=value[0]))
                elif kind_of == "call":
                    self._calls.submit(self._answer, call_id, kind, fields)
                else:
                    try:
                        self._on_message(kind, fields)
                    except Exception:  # one bad message must not cut the line
                        log.exception("%s: handling %r failed", self._name, kind)
        finally:
            self._shut()

    def _answer(self, call_id: int, kind: str, fields: dict[str, Any]) -> None:
        try:
            reply: tuple[bool, Any] = (True, self._on_call(kind, fields))
        except RecserveError as exc:
            reply = (False, (exc.status, exc.message))
        except Exception as exc:
            log.exception("%s: answering %r failed", self._name, kind)
            reply = (False, (500, f"internal error: {type(exc).__name__}: {exc}"))
        try:
            self._write(("reply", call_id, kind, reply))
        except ChannelClosed:
            pass

    def _shut(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        for future in list(self._pending.values()):
            if not future.done():
                future.set_exception(ChannelClosed(f"{self._name}: the other process has gone away"))
        try:
            self._connection.close()
        except OSError:
            pass
        self._calls.shutdown(wait=False)
        if self._on_close is not None:
            self._on_close()

    def close(self) -> None:
        self._shut()
