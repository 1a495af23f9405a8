"""The zygote: a copy of the leader made before it starts any thread, that forks workers.

Forking a process that runs threads (the leader's loaders, watchers, ONNX Runtime pools)
copies locks some thread may hold; forking this single-threaded copy never does. The
leader forks it right after importing everything and reserving the shared arena, so every
worker forked from it shares the interpreter's pages, the imported modules and the arena's
address range with the leader (DESIGN §9). It answers "spawn <index> <replacement>" with the new pid
and reports every exit with its status; it dies with the leader (PR_SET_PDEATHSIG) and
so do the workers with it.
"""

from __future__ import annotations

import ctypes
import gc
import os
import select
import signal
import socket
from collections.abc import Callable

__all__ = ["Zygote", "die_with_parent"]

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies (no orphans), also if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


class Zygote:
    """The leader's handle on its zygote. `spawn` is called from one thread; `events` from
    one (the supervisor's)."""

    def __init__(self, worker_main: Callable[[int, bool], int]) -> None:
        leader_end, zygote_end = socket.socketpair()
        leader = os.getpid()
        gc.collect()
        # Objects made so far are never collected, here or in the zygote and its workers: a
        # full collection writes to every tracked object it visits, so unfrozen, the leader's
        # first one (s3 polling triggers it within minutes) copied ~25 MiB of pages it shared
        # with the zygote, and the tree's memory rose by that much at once.
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            leader_end.close()
            die_with_parent(leader)
            code = 1
            try:
                code = _zygote_loop(zygote_end, worker_main)
            finally:
                os._exit(code)
        zygote_end.close()
        self.pid = pid
        self._socket = leader_end
        self._buffer = b""

    def spawn(self, index: int, *, replacement: bool = False) -> None:
        """Ask for worker `index` (`replacement`: of one that exited); its pid comes back as a
        ("started", index, pid) event."""
        self._socket.sendall(f"spawn {index} {int(replacement)}\n".encode())

    def stop(self) -> None:
        try:
            self._socket.sendall(b"exit\n")
        except OSError:
            pass

    def events(self, timeout: float) -> list[tuple[str, int, int, int]]:
        """("started", index, pid, 0) and ("exited", index, pid, wait status) since the last
        call, waiting up to `timeout` for the first; ("gone", -1, 0, 0) when the zygote died."""
        ready, _, _ = select.select([self._socket], [], [], timeout)
        if not ready:
            return []
        data = self._socket.recv(65536)
        if not data:
            return [("gone", -1, 0, 0)]
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        out = []
        for line in lines:
            kind, index, pid, status = line.decode().split()
            out.append((kind, int(index), int(pid), int(status)))
        return out


def _zygote_loop(sock: socket.socket, worker_main: Callable[[int, bool], int]) -> int:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the leader stops workers, then us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    me = os.getpid()
    workers: dict[int, int] = {}  # pid -> index
    buffer = b""
    while True:
        while workers:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            index = workers.pop(pid, -1)
            sock.sendall(f"exited {index} {pid} {status}\n".encode())
        ready, _, _ = select.select([sock], [], [], 0.1)
        if not ready:
            continue
        data = sock.recv(4096)
        if not data:
            return 0
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            words = line.decode().split()
            if words[0] == "exit":
                return 0
            index, replacement = int(words[1]), words[2:] == ["1"]
            pid = os.fork()
            if pid == 0:
                sock.close()
                die_with_parent(me)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                code = 1
                try:
                    code = worker_main(index, replacement)
                finally:
                    os._exit(code)
            workers[pid] = index
            sock.sendall(f"started {index} {pid} 0\n".encode())
