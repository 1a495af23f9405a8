"""glibc's allocator policy for `recserve serve` (recserve.processor.heap), each case in a
fresh process (mallopt is process-wide): threads share at most ARENA_MAX arenas instead
of one each; a user's own MALLOC_ARENA_MAX is kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")

PROBE = """
import ctypes, sys, tempfile, threading
from recserve.processor import heap
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
limited = heap.limit_arenas() if sys.argv[1] == "limit" else False
ready = threading.Barrier(8)
def allocate():
    ready.wait()
    libc.malloc(1000)                     # a thread's first allocation picks its arena
threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
with tempfile.NamedTemporaryFile("r") as out:
    f = libc.fopen(out.name.encode(), b"w")
    libc.malloc_info(0, f)
    libc.fclose(f)
    print(limited, out.read().count("<heap nr="))
"""


def _probe(mode: str, **env: str) -> tuple[str, int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", PROBE, mode], check=False, capture_output=True, text=True,
                          timeout=60, env={**clean, **env})
    assert done.returncode == 0, done.stderr
    limited, arenas = done.stdout.split()
    return limited, int(arenas)


def test_threads_share_two_arenas() -> None:
    assert _probe("limit") == ("True", 2)


def test_glibcs_default_gives_each_thread_its_own() -> None:
    # What limit_arenas is for; if a future glibc stops doing this, it is no longer needed.
    limited, arenas = _probe("default")
    assert limited == "False" and arenas > 2, arenas


def test_the_users_own_malloc_arena_max_is_left_alone() -> None:
    assert _probe("limit", MALLOC_ARENA_MAX="4") == ("False", 4)
