"""select_session_policy: MOD keeps a thread on its session, RR rotates, LEAST_BUSY balances."""

from __future__ import annotations

import threading

import pytest

from recserve.errors import ConfigError
from recserve.runtime.session_policy import SessionPolicy
from tests.threads import Threads, wait_for


def _acquire_in_thread(policy: SessionPolicy, calls: int) -> list[int]:
    got: list[int] = []

    def body() -> None:
        for _ in range(calls):
            index = policy.acquire()
            policy.release(index)
            got.append(index)

    Threads([body], "session acquisitions").join(timeout=60)
    return got


def test_mod_gives_each_thread_one_session_in_order_of_arrival() -> None:
    policy = SessionPolicy("MOD", 3)
    done = threading.Event()
    per_thread: list[list[int]] = [[] for _ in range(4)]

    def body(slot: int, first_call: threading.Event) -> None:
        for _ in range(5):
            index = policy.acquire()
            policy.release(index)
            per_thread[slot].append(index)
            first_call.set()
        wait_for(done, 60, "the last thread's first call")  # alive: no later thread reuses this id

    threads = []
    try:
        for slot in range(4):
            called = threading.Event()
            threads.append(Threads([lambda slot=slot, called=called: body(slot, called)], f"MOD caller {slot}"))
            wait_for(called, 60, f"MOD caller {slot}'s first call", threads[-1])
    finally:
        done.set()
    for thread in threads:
        thread.join(timeout=60)
    assert per_thread == [[0] * 5, [1] * 5, [2] * 5, [0] * 5]


def test_rr_rotates_over_calls_whatever_the_thread() -> None:
    policy = SessionPolicy("RR", 3)
    assert _acquire_in_thread(policy, 7) == [0, 1, 2, 0, 1, 2, 0]


def test_least_busy_picks_the_session_with_fewest_runs_in_flight() -> None:
    policy = SessionPolicy("LEAST_BUSY", 3)
    held = [policy.acquire() for _ in range(3)]
    assert sorted(held) == [0, 1, 2] and policy.in_flight() == [1, 1, 1]
    policy.release(1)
    assert policy.acquire() == 1
    policy.release(0)
    policy.release(2)
    assert policy.in_flight() == [0, 1, 0]
    assert policy.acquire() in (0, 2)


def test_unknown_policy_names_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="select_session_policy must be one of MOD, RR, LEAST_BUSY, got 'RANDOM'"):
        SessionPolicy("RANDOM", 2)
