"""One client connection of the load: send a prepared request, wait for the answer's
status. HTTP/1.1 keep-alive over an asyncio protocol with httptools' C parser (a few
microseconds of client CPU per request, so the client is rarely what limits the rate);
gRPC over grpc.aio with bytes in and out (no client-side protobuf work).

`send` returns the status as the error table shows it: "200" etc. for HTTP, the gRPC code
name ("OK", "UNAVAILABLE", ...), and raises ConnectionError when there was no answer.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol
from urllib.parse import urlsplit

import httptools

__all__ = ["OK", "Connection", "GrpcConnection", "HttpConnection", "open_connection"]

OK = frozenset({"200", "OK"})


class Connection(Protocol):
    async def connect(self, timeout: float) -> None: ...

    async def send(self, data: bytes, method: str, timeout: float) -> str: ...

    def close(self) -> None: ...


class _HttpProtocol(asyncio.Protocol):
    """Reads answers off one keep-alive connection; one request in flight at a time."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[str] | None = None
        self.transport: asyncio.Transport | None = None
        self.keep_alive = True
        self.lost = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"the answer is not HTTP/1.1 ({exc}); is --protocol right?"))

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(str(self.parser.get_status_code()))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._fail(ConnectionError("the server closed the connection"))

    def _fail(self, exc: Exception) -> None:
        self.lost = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


class HttpConnection:
    """Reconnects by itself when the server closed the previous connection."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._protocol: _HttpProtocol | None = None

    async def _connect(self) -> _HttpProtocol:
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await loop.create_connection(_HttpProtocol, self._host, self._port)
        except OSError as exc:
            raise ConnectionError(f"cannot connect to {self._host}:{self._port}: "
                                  f"{exc.strerror or exc}") from exc
        return protocol

    async def connect(self, timeout: float) -> None:
        """Opens the connection now, so the measured window does not pay for it."""
        if self._protocol is None:
            self._protocol = await asyncio.wait_for(self._connect(), timeout)

    async def send(self, data: bytes, method: str, timeout: float) -> str:
        protocol = self._protocol
        if protocol is None or protocol.lost or not protocol.keep_alive:
            self.close()
            protocol = self._protocol = await self._connect()
        assert protocol.transport is not None
        protocol.waiter = asyncio.get_running_loop().create_future()
        protocol.transport.write(data)
        try:
            return await asyncio.wait_for(protocol.waiter, timeout)
        except TimeoutError:
            self.close()
            raise

    def close(self) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()
        self._protocol = None


class GrpcConnection:
    """One HTTP/2 connection of its own (a local subchannel pool: channels to one target
    would otherwise share one connection)."""

    def __init__(self, target: str) -> None:
        import grpc.aio

        self._grpc = grpc
        self._channel = grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        self._calls: dict[str, Any] = {}

    async def connect(self, timeout: float) -> None:
        """Connects the channel now (HTTP/2 handshake included), so the measured window
        does not pay for it; a server that does not answer in `timeout` is a ConnectionError."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except TimeoutError:
            raise ConnectionError(f"gRPC channel not ready within {timeout:g} s") from None

    async def send(self, data: bytes, method: str, timeout: float) -> str:
        call = self._calls.get(method)
        if call is None:
            call = self._calls[method] = self._channel.unary_unary(method)
        try:
            await call(data, timeout=timeout)
        except self._grpc.aio.AioRpcError as exc:
            if exc.code() == self._grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError from None
            if exc.code() == self._grpc.StatusCode.UNAVAILABLE:
                raise ConnectionError(f"gRPC UNAVAILABLE: {exc.details()}") from None
            return str(exc.code().name)
        return "OK"

    def close(self) -> None:
        # grpc.aio's close is a coroutine; the loop that owns the channel ends with the run
        asyncio.get_running_loop().create_task(self._channel.close())


def open_connection(url: str, grpc: bool) -> Connection:
    return GrpcConnection(url) if grpc else HttpConnection(url)
