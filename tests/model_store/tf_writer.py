"""Writes TensorFlow bundles for the tests, in a process of its own: TensorFlow's bundled
protobuf and grpc_tools' protoc crash when they share one (tests/proto runs protoc).

Reads JSON lines {"prefix": ..., "npz": ..., "shards": N} on stdin, writes the npz's arrays
as one bundle (SaveV2 per shard, then MergeV2Checkpoints: what TF's Saver does), answers
"ok" or "error: ..." per line."""

from __future__ import annotations

import json
import sys

import numpy as np
import tensorflow as tf


def save(prefix: str, tensors: dict[str, np.ndarray], shards: int, slices: dict[str, str]) -> None:
    """`name#k` keys are slices of one tensor `name` (what Saver writes for a partitioned one)."""
    names = sorted(tensors)
    if shards == 1:
        tf.raw_ops.SaveV2(prefix=prefix, tensor_names=[n.split("#")[0] for n in names],
                          shape_and_slices=[slices.get(n, "") for n in names], tensors=[tensors[n] for n in names])
        return
    parts = []
    for k in range(shards):
        part = f"{prefix}_temp/part-{k:05d}-of-{shards:05d}"
        chunk = names[k::shards]
        tf.raw_ops.SaveV2(prefix=part, tensor_names=chunk, shape_and_slices=[""] * len(chunk),
                          tensors=[tensors[n] for n in chunk])
        parts.append(part)
    tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=parts, destination_prefix=prefix, delete_old_dirs=True)


for line in sys.stdin:
    job = json.loads(line)
    try:
        with np.load(job["npz"]) as data:
            save(job["prefix"], {name.replace("|", "/"): data[name] for name in data.files}, job["shards"],
                 job.get("slices", {}))
        print("ok", flush=True)
    except Exception as exc:  # noqa: BLE001  (reported to the test)
        print(f"error: {type(exc).__name__}: {exc}", flush=True)
