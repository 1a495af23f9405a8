"""Writes the hand-made seed inputs of each fuzz target into tests/fuzz/corpus/<target>/.

The checked-in corpora are these seeds plus what the campaigns found (`make fuzz` merges
new coverage back); a file's name is its SHA-1, as libFuzzer names them, so rerunning this
adds nothing twice. Run from the repository root: python tests/fuzz/seeds.py
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import struct
import sys
from pathlib import Path

import numpy as np
import safetensors.numpy

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _wire_tests():
    """tests/wire/test_codec_native.py: its legal and declined forms and request generator."""
    spec = importlib.util.spec_from_file_location("codec_cases", ROOT / "tests" / "wire" / "test_codec_native.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(target: str, data: bytes) -> None:
    folder = HERE / "corpus" / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / hashlib.sha1(data).hexdigest()).write_bytes(data)


def codec_seeds() -> None:
    from recserve.wire.codec import encode_request

    cases = _wire_tests()
    for data in [*cases.NATIVE_FORMS.values(), *cases.DECLINED.values()]:
        write("codec", data)
    requests = cases.Requests(seed=12)
    for i in range(40):
        data = requests.request()
        write("codec", requests.corrupt(data) if i % 4 == 3 else data)
    rng = np.random.default_rng(0)
    write("codec", encode_request({"user_id": rng.integers(0, 10**9, 64), "age": rng.random((64, 1), np.float32)},
                                  output_filter=("probabilities",)))
    write("codec", encode_request({"s": np.array([b"a", b"bc"], dtype=object), "c": np.ones(3, np.complex64),
                                   "b": np.array([True, False]), "h": np.ones((2, 2), np.float16)}))


def codec_tfs_seeds() -> None:
    """TF Serving PredictRequests: tests/wire/test_tfserving_codec.py's generator (whole and
    corrupted) and the raw-bytes cases it checks."""
    spec = importlib.util.spec_from_file_location("tfs_cases", ROOT / "tests" / "wire" / "test_tfserving_codec.py")
    cases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cases)
    rng = random.Random(27)
    for i in range(60):
        data = cases._random_request(rng)
        write("codec_tfs", cases._corrupt(rng, data) if i % 4 == 3 else data)
    t, r = cases.tensor, cases.request
    for data in (
        r({"x": t(1, [2, 2], content=np.arange(4, dtype="<f4").tobytes())}, version=3, signature="s"),
        r({"x": t(1, [2, 1], content=bytes(7))}),                         # tensor_content one byte short
        r({"x": t(9, [-1, 2], [1])}),                                     # a negative dimension
        r({"x": t(9, [2**40, 2**40], [1])}),                              # a huge shape
        r({"x": t(9, [2**21], [1])}),                                     # a fill beyond the bound
        r({"x": t(7, [3], [b"z"]), "y": t(3, [2])}, label="canary"),      # string fill, zeros
        r({"s": t(7, [2], content=cases.varint(1) + cases.varint(2) + b"abc")}),
        r({"b": t(10, [3], content=bytes([0, 1, 7])), "i": t(3, [2], content=bytes(8))}),
    ):
        write("codec_tfs", data)
        write("codec_tfs", data[:len(data) // 2])                        # truncated


def engine_seeds() -> None:
    # create (DRAM / tiered, zeros / normal default), initial keys, then opcode sequences:
    # 0/1 upsert, 2 delete, 3 lookup, 4 contains, 5 snapshot, 6 sample, 7 compact/maintain.
    write("engine", bytes([0x30, 3, 1, 2, 3, 0, 4, 5, 6, 7, 8, 3, 0x5f, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]))
    write("engine", bytes([0x13, 4, 9, 10, 11, 12, 0x05, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8, 7, 1, 3, 0x2d, 1, 2, 7, 4,
                           2, 3, 1, 2, 3, 5, 0, 6, 1, 2, 3, 4, 7, 0]))
    rng = random.Random(5)
    for _ in range(12):
        write("engine", bytes(rng.randrange(256) for _ in range(rng.randrange(16, 200))))


def ssd_seeds() -> None:
    # config, initial rows, then: 0 damage, 1/2 lookup, 3 upsert, 4 delete, 5 snapshot,
    # 6 compact/maintain.
    write("ssd", bytes([0x24, 40, 0, 0, 0, 0, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8, 4, 10, *range(10), 6, 1, 1, 16, *range(16)]))
    write("ssd", bytes([0xa4, 30, 0, 3, 0, 16, 0, 0, 1, 8, *range(8), 3, 8, *range(8), 6, 1, 5]))
    rng = random.Random(6)
    for _ in range(12):
        write("ssd", bytes(rng.randrange(256) for _ in range(rng.randrange(16, 160))))


def checkpoint_seeds() -> None:
    rng = np.random.default_rng(1)
    table = {"keys": np.arange(5, dtype=np.int64) * 3, "values": rng.random((5, 4), np.float32),
             "freqs": np.ones(5, np.int64), "versions": np.zeros(5, np.int64)}
    delta = {"keys": np.array([7], np.int64), "values": np.ones((1, 4), np.float32),
             "deleted": np.array([3], np.int64)}
    dense = {"w": rng.random((3, 2), np.float32), "b": np.zeros(2, np.float64)}
    for reader in (0, 1):
        write("checkpoint", bytes([reader]) + safetensors.numpy.save(table))
        write("checkpoint", bytes([reader]) + safetensors.numpy.save(delta))
        write("checkpoint", bytes([reader]) + safetensors.numpy.save({"keys": np.zeros(0, np.int64),
                                                                      "values": np.zeros((0, 4), np.float32)}))
    write("checkpoint", bytes([2]) + safetensors.numpy.save(dense))
    header = json.dumps({"keys": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]},
                         "values": {"dtype": "F32", "shape": [1, 1], "data_offsets": [8, 12]}}).encode()
    write("checkpoint", bytes([0]) + struct.pack("<Q", len(header)) + header + bytes(12))
    manifest = {"format": "recserve.checkpoint/1", "kind": "delta", "global_step": 12, "base_global_step": 10,
                "files": {"embedding/user.safetensors": {"size": 4096, "sha256": "0" * 64}}}
    write("checkpoint", bytes([3]) + json.dumps(manifest).encode())
    write("checkpoint", bytes([3]) + b'{"format": "recserve.checkpoint/1", "kind": "full", "global_step": 1, "files": {}}')


def route_seeds() -> None:
    """A route choice byte, then a request: requests as the demo model and the plain DLRM
    model get them (ids, strings, dense floats), and the codec's corpus; TF Serving's
    (the harness serves each input both ways) from the codec_tfs corpus."""
    from recserve.export.demo import DEMO_SPEC  # noqa: F401  (the demo's inputs, below)
    from recserve.wire.codec import encode_request

    rng = np.random.default_rng(24)
    requests = [
        encode_request({"user_id": np.array([1, 2], np.int64), "city": np.array([b"a", b""], dtype=object),
                        "age": np.array([[1.5], [2.0]], np.float32)}),
        encode_request({"dense": rng.random((2, 13), dtype=np.float32),
                        **{f"C{t}": rng.integers(0, 9, 2) for t in range(4)}}, output_filter=["prob"]),
        encode_request({"hist": np.array([[1, 2, -1], [3, -1, -1]], np.int64), "w": np.array([1, 0], np.int32),
                        "flag": np.array([True, False]), "x": np.array([[0.5, 2.0]], np.float64)}),
    ]
    codec = sorted((HERE / "corpus" / "codec").iterdir())[:60]
    requests += [path.read_bytes() for path in codec]
    requests += [path.read_bytes() for path in sorted((HERE / "corpus" / "codec_tfs").iterdir())[:60]]
    for i, data in enumerate(requests):
        write("route", bytes([i * 37 % 256]) + data)


def main() -> None:
    sys.path.insert(0, str(ROOT))
    codec_seeds()
    codec_tfs_seeds()
    engine_seeds()
    ssd_seeds()
    checkpoint_seeds()
    route_seeds()


if __name__ == "__main__":
    main()
