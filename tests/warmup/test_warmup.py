"""Warmup files, recording, synthesized requests and the warmup run, on the real demo model."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from recserve.config import parse_config
from recserve.errors import ConfigError, ModelLoadError
from recserve.export.demo import write_demo
from recserve.model_store import (
    LocalStorage,
    load_checkpoint,
    load_model_dir,
    newest_complete_version,
)
from recserve.processor.servable import Servable
from recserve.warmup import (
    MAGIC,
    Warmup,
    WarmupRecorder,
    decode_warmup,
    encode_warmup,
    read_warmup_file,
    synthesize_inputs,
    write_warmup_file,
)
from recserve.wire.codec import encode_request


@pytest.fixture(scope="module")
def demo(tmp_path_factory):  # type: ignore[no-untyped-def]
    return write_demo(tmp_path_factory.mktemp("warmup") / "demo")


@pytest.fixture(scope="module")
def servable(demo):  # type: ignore[no-untyped-def]
    config = parse_config({**demo.config(), "session_num": 3})
    storage = LocalStorage()
    ref, manifest = newest_complete_version(storage, str(demo.checkpoint_dir), log=logging.getLogger("t"))
    s = Servable.load(load_model_dir(storage, str(demo.model_dir)), load_checkpoint(storage, ref, manifest), config)
    yield s
    s.close()


def test_a_deeprec_file_is_one_request_and_records_round_trip(demo, tmp_path):
    single = demo.warmup_path.read_bytes()
    assert read_warmup_file(demo.warmup_path) == [single]
    assert decode_warmup(b"") == []
    requests = [single, b"", encode_request({"age": np.ones((1, 1), np.float32)})]
    data = encode_warmup(requests)
    assert data.startswith(MAGIC) and len(data) == len(MAGIC) + sum(4 + len(r) for r in requests)
    assert decode_warmup(data) == requests
    write_warmup_file(tmp_path / "w.bin", requests)
    assert read_warmup_file(tmp_path / "w.bin") == requests


def test_damaged_record_files_and_missing_files_are_config_errors(tmp_path):
    data = encode_warmup([b"abcdef"])
    with pytest.raises(ConfigError, match=r"^f: the record at byte 18 holds 6 bytes but only 3 remain$"):
        decode_warmup(data[:-3], "f")
    with pytest.raises(ConfigError, match=r"^f: truncated record length at byte 28$"):
        decode_warmup(data + b"\x01", "f")
    with pytest.raises(ConfigError, match=r"^warmup_file_name '.*/nope.bin' cannot be read: No such file or directory$"):
        read_warmup_file(tmp_path / "nope.bin")


def test_recorder_keeps_a_bounded_uniform_sample(tmp_path):
    recorder = WarmupRecorder(limit=5, seed=1)
    for i in range(1000):
        recorder.record(str(i).encode())
    kept = recorder.requests()
    assert recorder.seen == 1000 and len(kept) == 5 and len(set(kept)) == 5
    assert sum(int(k) >= 100 for k in kept) >= 3  # not just the first requests
    assert recorder.write(tmp_path / "rec.bin") == 5
    assert read_warmup_file(tmp_path / "rec.bin") == kept


def test_synthesized_requests_use_keys_that_exist_and_serve(servable):
    signature = servable.signature(None)
    inputs = synthesize_inputs(signature, servable.tables, batch=6, rng=np.random.default_rng(0))
    assert set(inputs) == set(signature.inputs)
    for alias, spec in signature.inputs.items():
        arr = inputs[alias]
        assert arr.shape[0] == 6
        b = spec.binding
        if b is not None and b.key_dtype == "int64":
            assert servable.tables[b.table].contains(arr).all(), alias
        elif b is not None:
            assert all(s.startswith(b"recserve-warmup-") for s in arr.ravel())
        else:
            assert not arr.any()
    assert inputs["clicked_items"].shape == (6, 4)  # a free list dimension gets LIST_LENGTH ids
    out = servable.predict(inputs)
    assert all(np.isfinite(v).all() for v in out.values())


def test_warmup_runs_every_request_on_every_session(servable, demo, monkeypatch):
    used = []
    run = servable.sessions.run

    def spy(names, feeds, **kwargs):  # type: ignore[no-untyped-def]
        used.append(kwargs["session"])
        return run(names, feeds, **kwargs)

    monkeypatch.setattr(servable.sessions, "run", spy)
    result = Warmup.from_config(parse_config(demo.config())).run(servable)
    assert (result.source, result.requests, result.runs, result.rejected) == ("file", 1, 3, 0)
    assert used == [0, 1, 2]
    synthesized = Warmup(synthesized=2).run(servable)
    assert (synthesized.source, synthesized.requests, synthesized.runs, synthesized.rejected) == ("synthesized", 2, 6, 0)


def test_a_rejected_request_is_counted_and_a_failing_version_is_refused(servable, caplog):
    bad = encode_request({"no_such_input": np.ones(2, np.int64)})
    result = Warmup([bad]).run(servable)
    assert (result.runs, result.rejected) == (1, 1)
    assert "warmup request 0 rejected: unknown input 'no_such_input'" in caplog.text

    class Broken:
        version = "7"
        tables = None
        sessions = servable.sessions

        def signature(self, name):  # type: ignore[no-untyped-def]
            return servable.signature(name)

        def predict(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise RuntimeError("onnxruntime exploded")

    with pytest.raises(ModelLoadError, match=r"^warmup request 0 failed on version 7: RuntimeError: onnxruntime exploded$"):
        Warmup([demo_request(servable)]).run(Broken())  # type: ignore[arg-type]
    with pytest.raises(ModelLoadError, match=r"^warmup request 0 is not a valid PredictRequest"):
        Warmup([b"\xff\xff\xff"])


def demo_request(servable) -> bytes:  # type: ignore[no-untyped-def]
    return encode_request(synthesize_inputs(servable.signature(None), servable.tables, batch=1,
                                            rng=np.random.default_rng(0)))
