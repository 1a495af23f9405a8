"""TensorFlow's own `session.run` on a SavedModel, timed on command, in a process of its own
(bench_savedmodel; TensorFlow's bundled protobuf stays out of the benchmark's process).

argv: SAVEDMODEL REQUESTS.npz. stdin lines "BATCH REPS" -> stdout one JSON list of REPS
per-call seconds for request batch BATCH (cycling over that batch's requests)."""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1


def main() -> None:
    savedmodel, requests_npz = sys.argv[1], sys.argv[2]
    config = tf1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    graph = tf.Graph()
    with graph.as_default(), tf1.Session(graph=graph, config=config) as sess:
        meta = tf1.saved_model.loader.load(sess, ["serve"], savedmodel)
        sig = meta.signature_def["serving_default"]
        fetch = graph.get_tensor_by_name(sig.outputs["prob" if "prob" in sig.outputs else min(sig.outputs)].name)
        feeds = {k: graph.get_tensor_by_name(v.name) for k, v in sig.inputs.items()}
        by_batch: dict[int, list[dict[object, np.ndarray]]] = {}
        with np.load(requests_npz, allow_pickle=True) as data:
            for name in data.files:
                batch, index, key = name.split("/")
                requests = by_batch.setdefault(int(batch), [])
                while len(requests) <= int(index):
                    requests.append({})
                value = data[name]
                requests[int(index)][feeds[key]] = np.char.encode(value.astype(str), "utf-8") \
                    if value.dtype == object else value
        for line in sys.stdin:
            batch, reps = (int(x) for x in line.split())
            requests = by_batch[batch]
            times = []
            for i in range(reps):
                feed = requests[i % len(requests)]
                started = time.perf_counter()
                sess.run(fetch, feed)
                times.append(time.perf_counter() - started)
            print(json.dumps(times), flush=True)


if __name__ == "__main__":
    main()
