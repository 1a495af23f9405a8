"""`recserve perf`'s option parsing: what each form means, and errors naming the option."""

from __future__ import annotations

import pytest

from recserve.errors import ConfigError
from recserve.perf.client_pool import split
from recserve.perf.options import parse_batches, parse_concurrency, parse_duration, parse_keys


def test_concurrency_forms() -> None:
    assert parse_concurrency("1:64:x2") == (1, 2, 4, 8, 16, 32, 64)
    assert parse_concurrency("1:20:x4") == (1, 4, 16)
    assert parse_concurrency("4:16:+4") == (4, 8, 12, 16)
    assert parse_concurrency("8") == (8,)
    assert parse_concurrency("1,8,32") == (1, 8, 32)


@pytest.mark.parametrize("text", ["", "0", "1:x", "8:4:x2", "1:64:x1", "1:8:+0", "a,b", "-1"])
def test_bad_concurrency_names_the_option_and_the_forms(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_concurrency(text)
    assert "--concurrency" in caught.value.message and "1:64:x2" in caught.value.message
    assert caught.value.field == "--concurrency"


def test_batches_durations_keys() -> None:
    assert parse_batches("1,64,512") == (1, 64, 512)
    assert parse_duration("10s") == 10.0 and parse_duration("500ms") == 0.5 and parse_duration("2m") == 120.0
    assert parse_duration("3") == 3.0
    assert parse_keys("100:200") == (100, 200) and parse_keys("50") == (0, 50)
    for bad, option, call in (("1,0", "--batch", parse_batches), ("x", "--batch", parse_batches),
                              ("10 s", "--duration", parse_duration), ("0s", "--duration", parse_duration),
                              ("5:5", "--keys", parse_keys), ("-1:5", "--keys", parse_keys)):
        with pytest.raises(ConfigError, match=option):
            call(bad)


def test_connections_are_spread_over_processes() -> None:
    assert split(1, 4) == [1]
    assert split(5, 2) == [3, 2]
    assert split(64, 2) == [32, 32]
    assert sum(split(37, 3)) == 37 and max(split(37, 3)) - min(split(37, 3)) <= 1
