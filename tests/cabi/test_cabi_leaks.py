"""Memory ownership through the C ABI: valgrind over a C host finds no definite leak in
the shim, and loaded into a Python host the shim uses its interpreter and leaks no objects."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
import warnings

import pytest

from recserve.processor.cabi import library_path

# Frames between malloc and its caller that a leak found by valgrind may go through and
# still be the shim's (e.g. process -> PyBytes_FromStringAndSize -> ... -> malloc); deeper
# stacks are CPython's own start-up allocations, which it never frees by design.
SHIM_FRAMES = 8


# Runs repeated after the host died under valgrind outside recserve's code (finding 12).
ATTEMPTS_AFTER_A_FOREIGN_CRASH = 3


# A frame of the shim's (the leak check's concern), and of any recserve library (a crash there is ours).
SHIM_FILES = ("libserving_processor.so", "processor_shim.c")
RECSERVE_FILES = (*SHIM_FILES, "librecserve_")


def _ours(frame: str) -> bool:
    return any(name in frame for name in RECSERVE_FILES)


def _crash_stack(valgrind_log: str) -> list[str]:
    """The frames under valgrind's "Process terminating with default action of signal"."""
    at = valgrind_log.find("Process terminating with default action of signal")
    if at < 0:
        return []
    frames = []
    for line in valgrind_log[at:].splitlines()[1:]:
        match = re.match(r"^==\d+==\s+(?:at|by) 0x[0-9A-F]+: (.*)$", line)
        if match:
            frames.append(match[1])
        elif frames:
            break
    return frames


def _shim_leaks(valgrind_log: str) -> list[str]:
    records = re.split(r"^==\d+== \n", valgrind_log, flags=re.MULTILINE)
    leaks = []
    for record in records:
        if "definitely lost in loss record" not in record:
            continue
        frames = re.findall(r"^==\d+==\s+(?:at|by) 0x[0-9A-F]+: (.*)$", record, re.MULTILINE)
        if any(name in f for f in frames[:SHIM_FRAMES] for name in SHIM_FILES):
            leaks.append(record)
    return leaks


@pytest.mark.skipif(
    "libasan" in os.environ.get("LD_PRELOAD", ""),
    reason="valgrind cannot run AddressSanitizer builds (make test-sanitize checks memory with ASan)",
)
def test_valgrind_finds_no_definite_leak_in_the_shim(
    client, demo, processor, make_requests
) -> None:
    if shutil.which("valgrind") is None:
        if os.environ.get("RECSERVE_REQUIRE_VALGRIND") == "1":  # set by `make test`
            pytest.fail("valgrind is not installed; run `make valgrind` (apt-get install valgrind)")
        pytest.skip("valgrind is not installed (`make valgrind`)")
    # Batches of 6..8 make requests over 512 bytes: CPython takes those from malloc, not
    # from its arenas, so a leaked request object shows up too.
    requests = [*make_requests(demo, 8, batch=8, min_batch=6, seed=6), b"", b"\xff garbage"]
    expected = [processor.process_python(r) for r in requests]
    log = client.workdir / "valgrind.log"

    def run_under_valgrind() -> subprocess.CompletedProcess[str]:
        return client.run(
            "serve",
            demo.config_path,
            client.requests_file("leak.req", requests),
            client.replies_file("leak.exp", expected),
            1,
            1000,
            wrapper=[
                "valgrind",
                "--leak-check=full",
                "--show-leak-kinds=definite",
                "--undef-value-errors=no",
                f"--log-file={log}",
            ],
            timeout=300,
        )

    result = run_under_valgrind()
    deaths = []
    while result.returncode < 0 and len(deaths) < ATTEMPTS_AFTER_A_FOREIGN_CRASH:
        # Open finding (RELIABILITY.md, 12): now and then, only in full fresh-clone runs, the
        # host under valgrind dies of SIGBUS inside onnxruntime's Python binding, with no
        # recserve frame on the crashing stack. That death is logged and the run repeated; a
        # crash in recserve's code fails at once.
        kept = client.workdir / f"valgrind-signal{-result.returncode}-{len(deaths)}.log"
        shutil.copyfile(log, kept)
        stack = _crash_stack(kept.read_text())
        assert not any(_ours(frame) for frame in stack), f"the host crashed in recserve's code: {stack}"
        deaths.append(f"signal {-result.returncode}, log {kept}, top frame {stack[:1]}")
        warnings.warn(f"the C host under valgrind died of signal {-result.returncode} outside recserve's code; "
                      f"log kept in {kept}; running it again", stacklevel=1)
        result = run_under_valgrind()
    if result.returncode < 0:
        pytest.xfail(f"RELIABILITY finding 12: the C host under valgrind died outside recserve's code in "
                     f"{len(deaths) + 1} runs in a row ({'; '.join(deaths)}); no leak check possible")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("sent 1000 mismatched 0 "), result.stdout
    text = log.read_text()
    assert "LEAK SUMMARY" in text or "All heap blocks were freed" in text, text[-2000:]
    assert _shim_leaks(text) == []


def _bind(lib: ctypes.CDLL) -> None:
    vp, ip = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)
    lib.initialize.argtypes, lib.initialize.restype = [ctypes.c_char_p, ctypes.c_char_p, ip], vp
    lib.process.argtypes = [vp, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(vp), ip]
    lib.process.restype = ctypes.c_int
    lib.release_buffer.argtypes, lib.release_buffer.restype = [vp], None
    lib.destroy.argtypes, lib.destroy.restype = [vp], None


def test_python_host_uses_its_interpreter_and_leaks_no_objects(
    demo, processor, make_requests
) -> None:
    lib = ctypes.CDLL(library_path())  # RTLD_LOCAL; ctypes releases the GIL during calls
    _bind(lib)
    state = ctypes.c_int(99)
    model = lib.initialize(b"in-python", demo.config_path.read_bytes(), ctypes.byref(state))
    assert state.value == 0 and model
    requests = make_requests(demo, 4, batch=4, seed=7)

    def call(request: bytes) -> tuple[int, bytes]:
        out, size = ctypes.c_void_p(), ctypes.c_int()
        status = lib.process(model, request, len(request), ctypes.byref(out), ctypes.byref(size))
        data = ctypes.string_at(out, size.value)
        lib.release_buffer(out)
        return status, data

    try:
        assert [call(r) for r in requests] == [processor.process_python(r) for r in requests]
        for _ in range(200):  # warm caches before counting
            call(requests[0])
        before = sys.getallocatedblocks()
        for i in range(2000):
            call(requests[i % len(requests)])
        # One leaked object per call would add >= 2000 blocks.
        assert sys.getallocatedblocks() - before < 500
    finally:
        lib.destroy(model)
