"""Real TensorFlow for the SavedModel tests, run as a subprocess (TensorFlow's bundled
protobuf must not share a process with the tests' other protobuf users).

    python tf_model.py write OUT      a TF1 feature-column model, as DeepRec trainers write
        them: OUT/savedmodel (SavedModelBuilder), OUT/ckpt/1 (trainer checkpoint with Adagrad
        slots and global_step), OUT/ckpt/2 (a later full checkpoint), OUT/ckpt/2/
        .incremental_checkpoint (DeepRec-named incremental bundle: changed rows of two tables)
    python tf_model.py predict SAVEDMODEL REQUESTS.npz OUT.npz [CKPT_PREFIX] [INCR.npz]
        TensorFlow's own session.run on the SavedModel (its variables, or a checkpoint's,
        plus incremental rows written into the variables), one batch per request
    python tf_model.py vocab OUT     a SavedModel with vocabulary-list columns (write_vocab)
    python tf_model.py vocab_oov OUT   vocabulary lists and files with num_oov_buckets and
        default_value (write_vocab_oov)
    python tf_model.py shared OUT    two inputs sharing one table (write_shared)
    python tf_model.py weighted OUT [refused]   weighted categorical columns (write_weighted)
    python tf_model.py mod OUT       partitioned variables looked up by 'mod' (write_mod)
    python tf_model.py int_vocab OUT   integer vocabulary columns (write_int_vocab)
    python tf_model.py hash IN.npz OUT.npz   tf.strings.to_hash_bucket_fast of IN's strings
    python tf_model.py evgraph SAVEDMODEL OUT [unservable]   the SavedModel with its `city` table
        rewritten into a DeepRec Embedding Variable, `item` into a partitioned one (see rewrite_to_ev)

The model: `city` string hashed into 1000 buckets (dim 8, mean), `item` int64 identity in
5000 buckets partitioned in 2 (dim 16), `tags` multi-valued strings padded with '' pooled
by sqrtn (500 buckets, dim 8), numerics `age` and `price`, DNN 64-32-1 written by hand
(tf.compat.v1.layers is gone under Keras 3), output `prob`.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()
fc = tf1.feature_column

from model_requests import CITY_BUCKETS, ITEM_BUCKETS, TAG_BUCKETS, TAGS_LEN, requests


def _build() -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    inputs = {
        "city": tf1.placeholder(tf.string, [None], name="city"),
        "item": tf1.placeholder(tf.int64, [None], name="item"),
        "tags": tf1.placeholder(tf.string, [None, TAGS_LEN], name="tags"),
        "age": tf1.placeholder(tf.float32, [None], name="age"),
        "price": tf1.placeholder(tf.float32, [None], name="price"),
    }
    with tf1.variable_scope("item_scope", partitioner=tf1.fixed_size_partitioner(2)):
        item = fc.input_layer(inputs, [fc.embedding_column(fc.categorical_column_with_identity("item", ITEM_BUCKETS), 16)])
    rest = fc.input_layer(inputs, [
        fc.embedding_column(fc.categorical_column_with_hash_bucket("city", CITY_BUCKETS), 8),
        fc.embedding_column(fc.categorical_column_with_hash_bucket("tags", TAG_BUCKETS), 8, combiner="sqrtn"),
        fc.numeric_column("age"), fc.numeric_column("price"),
    ])
    x = tf.concat([item, rest], axis=1)
    width = int(x.shape[1])
    for name, units in (("h1", 64), ("h2", 32), ("out", 1)):
        kernel = tf1.get_variable(f"dnn/{name}/kernel", [width, units], initializer=tf1.glorot_uniform_initializer())
        bias = tf1.get_variable(f"dnn/{name}/bias", [units], initializer=tf1.random_uniform_initializer(-0.1, 0.1))
        x = tf.matmul(x, kernel) + bias
        if name != "out":
            x = tf.nn.relu(x)
        width = units
    return inputs, tf.sigmoid(tf.reshape(x, [-1]), name="prob")


def _feed(inputs: dict[str, tf.Tensor], request: dict[str, np.ndarray]) -> dict[tf.Tensor, np.ndarray]:
    return {inputs[k]: _tf_value(v) for k, v in request.items()}


def _tf_value(v: np.ndarray) -> np.ndarray:
    return np.char.encode(v.astype(str), "utf-8") if v.dtype == object else v


def write(out: str) -> None:
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(7)
        inputs, prob = _build()
        label = tf1.placeholder(tf.float32, [None])
        loss = tf1.losses.log_loss(label, prob)
        step = tf1.train.get_or_create_global_step()
        train = tf1.train.AdagradOptimizer(0.5).minimize(loss, global_step=step)
        saver = tf1.train.Saver()
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())

            def train_steps(n: int, seed: int) -> None:
                for request in requests(n, 64, seed):
                    feed = _feed(inputs, request)
                    feed[label] = (np.arange(64) % 2).astype(np.float32)
                    sess.run(train, feed)

            train_steps(3, 1)
            os.makedirs(f"{out}/ckpt/1")
            saver.save(sess, f"{out}/ckpt/1/model.ckpt", global_step=step)
            builder = tf1.saved_model.Builder(f"{out}/savedmodel")
            signature = tf1.saved_model.predict_signature_def(inputs=inputs, outputs={"prob": prob})
            builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": signature})
            builder.save()
            train_steps(3, 2)
            os.makedirs(f"{out}/ckpt/2")
            saver.save(sess, f"{out}/ckpt/2/model.ckpt", global_step=step)
            # DeepRec's incremental bundle: every row changed since the full save, by row id.
            city_var = next(v for v in tf1.global_variables() if v.name.startswith("input_layer/city_embedding"))
            keys = np.array([3, 77, 999], dtype=np.int64)
            values = np.full((3, 8), 0.25, dtype=np.float32) * np.arange(1, 4, dtype=np.float32)[:, None]
            name = city_var.op.name
            incr = f"{out}/ckpt/2/.incremental_checkpoint"
            os.makedirs(incr)
            sess.run(tf1.raw_ops.SaveV2(prefix=f"{incr}/model.ckpt-{int(sess.run(step)) + 5}",
                                        tensor_names=[f"{name}-sparse_incr_keys", f"{name}-sparse_incr_values"],
                                        shape_and_slices=["", ""], tensors=[keys, values]))
            np.savez(f"{out}/incr.npz", name=np.array(name), keys=keys, values=values)


def predict(savedmodel: str, requests_npz: str, out_npz: str, prefix: str | None, incr: str | None) -> None:
    from tensorflow.python.saved_model import loader

    with tf.Graph().as_default() as graph, tf1.Session(
            config=tf1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)) as sess:
        meta = loader.load(sess, ["serve"], savedmodel)
        if prefix:
            tf1.train.Saver().restore(sess, prefix)
        if incr:
            with np.load(incr) as d:
                name, keys, values = str(d["name"]), d["keys"], d["values"]
            whole = [v for v in tf1.global_variables() if v.op.name == name]
            parts = whole or sorted((v for v in tf1.global_variables() if v.op.name.startswith(f"{name}/part_")),
                                    key=lambda v: int(v.op.name.rsplit("_", 1)[1]))
            offset = 0
            for var in parts:  # a partitioned variable: row r of the concatenation is in the part holding it
                rows = int(var.shape[0])
                mine = (keys >= offset) & (keys < offset + rows)
                if mine.any():
                    sess.run(tf1.scatter_update(var, keys[mine] - offset, values[mine]))
                offset += rows
        sig = meta.signature_def["serving_default"]
        feeds = {k: graph.get_tensor_by_name(v.name) for k, v in sig.inputs.items()}
        output = "prob" if "prob" in sig.outputs else min(sig.outputs)  # Keras's export: output_0
        fetch = graph.get_tensor_by_name(sig.outputs[output].name)
        with np.load(requests_npz, allow_pickle=True) as data:
            n = int(data["n"])
            results = {}
            for i in range(n):
                feed = {feeds[k]: _tf_value(data[f"{i}/{k}"]) for k in feeds}
                results[str(i)] = sess.run(fetch, feed)
        np.savez(out_npz, **results)


def _save_small(out: str, inputs: dict[str, tf.Tensor], x: tf.Tensor) -> None:
    """One hand-written dense layer over `x` -> `prob`, saved by SavedModelBuilder with the
    tables' initializer as main_op and the graph's asset files (vocabulary files)."""
    kernel = tf1.get_variable("dense/kernel", [int(x.shape[1]), 1], initializer=tf1.glorot_uniform_initializer())
    prob = tf.sigmoid(tf.reshape(tf.matmul(x, kernel), [-1]), name="prob")
    with tf1.Session() as sess:
        sess.run([tf1.global_variables_initializer(), tf1.tables_initializer()])
        builder = tf1.saved_model.Builder(out)
        builder.add_meta_graph_and_variables(
            sess, ["serve"], main_op=tf1.tables_initializer(),
            assets_collection=tf1.get_collection(tf1.GraphKeys.ASSET_FILEPATHS),
            signature_def_map={"serving_default": tf1.saved_model.predict_signature_def(inputs, {"prob": prob})})
        builder.save()


def write_vocab(out: str) -> None:
    """A SavedModel with vocabulary-list columns: `color` (single string, dim 4) and `words`
    (3 strings per sample, '' padded, mean: unknown words are dropped, not averaged in),
    numeric `x`, and `slot` (int64 [batch, 2]) looked up with plain tf.nn.embedding_lookup
    (no pooling: [batch, 2, 3], then summed over the slots by the dense graph); one
    hand-written dense layer; output `prob`."""
    from model_requests import COLORS, VOCAB

    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(3)
        inputs = {"color": tf1.placeholder(tf.string, [None], name="color"),
                  "words": tf1.placeholder(tf.string, [None, 3], name="words"),
                  "x": tf1.placeholder(tf.float32, [None], name="x")}
        slot = tf1.placeholder(tf.int64, [None, 2], name="slot")
        slots = tf1.get_variable("slot_emb", [20, 3])
        columns = fc.input_layer(inputs, [
            fc.embedding_column(fc.categorical_column_with_vocabulary_list("color", COLORS), 4),
            fc.embedding_column(fc.categorical_column_with_vocabulary_list("words", VOCAB), 6, combiner="mean"),
            fc.numeric_column("x")])
        x = tf.concat([columns, tf.reduce_sum(tf.nn.embedding_lookup(slots, slot), axis=1)], axis=1)
        inputs["slot"] = slot
        _save_small(out, inputs, x)


def write_vocab_oov(out: str) -> None:
    """A SavedModel with vocabulary columns beyond plain lists: `color` (a list with
    num_oov_buckets=3, dim 4), `words` (3 strings per sample, '' padded, a list with
    default_value=7: unknown words become id 7 and count in the mean), `city` (a vocabulary
    *file* with num_oov_buckets=2, dim 4; the file travels in the SavedModel's assets/ and is
    deleted from where the trainer had it), numeric `x`; one dense layer; output `prob`."""
    from model_requests import CITY_FILE_WORDS, COLORS, VOCAB

    vocab_file = f"{out}.cities.txt"
    with open(vocab_file, "w", encoding="utf-8") as f:
        f.write("\n".join(CITY_FILE_WORDS) + "\n")
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(4)
        inputs = {"color": tf1.placeholder(tf.string, [None], name="color"),
                  "words": tf1.placeholder(tf.string, [None, 3], name="words"),
                  "city": tf1.placeholder(tf.string, [None], name="city"),
                  "x": tf1.placeholder(tf.float32, [None], name="x")}
        normal = tf1.random_normal_initializer(stddev=1.0)
        columns = fc.input_layer(inputs, [
            fc.embedding_column(fc.categorical_column_with_vocabulary_list("color", COLORS, num_oov_buckets=3), 4,
                                initializer=normal),
            fc.embedding_column(fc.categorical_column_with_vocabulary_list("words", VOCAB, default_value=7), 6,
                                combiner="mean", initializer=normal),
            fc.embedding_column(fc.categorical_column_with_vocabulary_file("city", vocab_file, num_oov_buckets=2), 4,
                                initializer=normal),
            fc.numeric_column("x")])
        _save_small(out, inputs, columns)
    os.remove(vocab_file)


def write_shared(out: str) -> None:
    """Shared embedding columns: `clicked` and `bought` (int64 [batch, 3], -1 padded, 100
    ids) read one table (dim 4, mean) through two lookups; numeric `x`; output `prob`."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(6)
        inputs = {"clicked": tf1.placeholder(tf.int64, [None, 3], name="clicked"),
                  "bought": tf1.placeholder(tf.int64, [None, 3], name="bought"),
                  "x": tf1.placeholder(tf.float32, [None], name="x")}
        shared = fc.shared_embedding_columns([fc.categorical_column_with_identity("clicked", 100),
                                              fc.categorical_column_with_identity("bought", 100)], 4,
                                             initializer=tf1.random_normal_initializer(stddev=1.0))
        _save_small(out, inputs, fc.input_layer(inputs, [*shared, fc.numeric_column("x")]))


def write_weighted(out: str, refused: bool = False) -> None:
    """weighted_categorical_column under embedding_column (embedding_lookup_sparse with
    sp_weights): `kw` (int64 [batch, 4], -1 padded, identity over 100 ids, partitioned in 2)
    weighted by `kw_w`, dim 4, sum; `genre` (strings [batch, 3], '' padded, 50 hash buckets)
    weighted by `genre_w`, dim 6, mean; `topic` (strings [batch, 2], a vocabulary list with
    2 OOV buckets) weighted by `topic_w`, dim 4, sqrtn; `shop` (one int64 id per sample,
    identity over 30) weighted by `shop_w`, dim 3, mean; numeric `x`; output `prob`.
    `refused`: `topic`'s vocabulary drops unknown words (default_value -1) and pools by mean."""
    from model_requests import TOPICS, WEIGHTED_GENRE_BUCKETS, WEIGHTED_KW_IDS, WEIGHTED_SHOP_IDS

    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(8)
        inputs = {"kw": tf1.placeholder(tf.int64, [None, 4], name="kw"),
                  "kw_w": tf1.placeholder(tf.float32, [None, 4], name="kw_w"),
                  "genre": tf1.placeholder(tf.string, [None, 3], name="genre"),
                  "genre_w": tf1.placeholder(tf.float32, [None, 3], name="genre_w"),
                  "topic": tf1.placeholder(tf.string, [None, 2], name="topic"),
                  "topic_w": tf1.placeholder(tf.float32, [None, 2], name="topic_w"),
                  "shop": tf1.placeholder(tf.int64, [None], name="shop"),
                  "shop_w": tf1.placeholder(tf.float32, [None], name="shop_w"),
                  "x": tf1.placeholder(tf.float32, [None], name="x")}
        normal = tf1.random_normal_initializer(stddev=1.0)
        weighted = fc.weighted_categorical_column
        with tf1.variable_scope("kw_scope", partitioner=tf1.fixed_size_partitioner(2)):
            kw = fc.input_layer(inputs, [fc.embedding_column(
                weighted(fc.categorical_column_with_identity("kw", WEIGHTED_KW_IDS), "kw_w"), 4, combiner="sum",
                initializer=normal)])
        topics = (fc.categorical_column_with_vocabulary_list("topic", TOPICS) if refused else
                  fc.categorical_column_with_vocabulary_list("topic", TOPICS, num_oov_buckets=2))
        rest = fc.input_layer(inputs, [
            fc.embedding_column(weighted(fc.categorical_column_with_hash_bucket("genre", WEIGHTED_GENRE_BUCKETS),
                                         "genre_w"), 6, combiner="mean", initializer=normal),
            fc.embedding_column(weighted(topics, "topic_w"), 4, combiner="mean" if refused else "sqrtn",
                                initializer=normal),
            fc.embedding_column(weighted(fc.categorical_column_with_identity("shop", WEIGHTED_SHOP_IDS), "shop_w"), 3,
                                combiner="mean", initializer=normal),
            fc.numeric_column("x")])
        _save_small(out, inputs, tf.concat([kw, rest], axis=1))


def write_int_vocab(out: str) -> None:
    """Integer vocabulary columns (categorical_column_with_vocabulary_list of int64): `shop`
    (int64 [batch, 3], -1 padded; unknown ids dropped, default_value -1) dim 4, mean; `brand`
    (one int64 per sample; unknown ids get default_value 1) dim 3, sum; numeric `x`; output
    `prob`."""
    from model_requests import BRANDS, SHOPS

    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(12)
        inputs = {"shop": tf1.placeholder(tf.int64, [None, 3], name="shop"),
                  "brand": tf1.placeholder(tf.int64, [None], name="brand"),
                  "x": tf1.placeholder(tf.float32, [None], name="x")}
        normal = tf1.random_normal_initializer(stddev=1.0)
        vocabulary = fc.categorical_column_with_vocabulary_list
        _save_small(out, inputs, fc.input_layer(inputs, [
            fc.embedding_column(vocabulary("shop", SHOPS, dtype=tf.int64), 4, combiner="mean", initializer=normal),
            fc.embedding_column(vocabulary("brand", BRANDS, dtype=tf.int64, default_value=1), 3, combiner="sum",
                                initializer=normal),
            fc.numeric_column("x")]))


def write_mod(out: str) -> None:
    """Partitioned variables looked up with partition_strategy='mod' (id i at row i // 3 of
    part i % 3): `ids` (int64 [batch, 3], -1 padded) in `mod_emb` (1001 rows in 3 parts, dim 4)
    by safe_embedding_lookup_sparse, mean; `pos` (int64 [batch]) in `pos_emb` (10 rows in 3
    parts, dim 2) by embedding_lookup, unpooled; numeric `x`; output `prob`. OUT/savedmodel,
    and OUT/ckpt/1 (Saver, the parts as slices) holding other values for every variable."""
    from model_requests import MOD_IDS, MOD_POS

    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(9)
        inputs = {"ids": tf1.placeholder(tf.int64, [None, 3], name="ids"),
                  "pos": tf1.placeholder(tf.int64, [None], name="pos"),
                  "x": tf1.placeholder(tf.float32, [None], name="x")}
        normal = tf1.random_normal_initializer(stddev=1.0)
        table = tf1.get_variable("mod_emb", [MOD_IDS, 4], initializer=normal, partitioner=tf1.fixed_size_partitioner(3))
        positions = tf1.get_variable("pos_emb", [MOD_POS, 2], initializer=normal,
                                     partitioner=tf1.fixed_size_partitioner(3))
        kept = tf.where(tf.not_equal(inputs["ids"], -1))
        sparse = tf.SparseTensor(kept, tf.gather_nd(inputs["ids"], kept), tf.shape(inputs["ids"], out_type=tf.int64))
        pooled = tf1.nn.safe_embedding_lookup_sparse(table, sparse, None, combiner="mean", partition_strategy="mod")
        unpooled = tf1.nn.embedding_lookup(positions, inputs["pos"], partition_strategy="mod")
        x = tf.concat([pooled, unpooled, tf.expand_dims(inputs["x"], 1)], axis=1)
        kernel = tf1.get_variable("dense/kernel", [int(x.shape[1]), 1], initializer=tf1.glorot_uniform_initializer())
        prob = tf.sigmoid(tf.reshape(tf.matmul(x, kernel), [-1]), name="prob")
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            builder = tf1.saved_model.Builder(f"{out}/savedmodel")
            builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
                "serving_default": tf1.saved_model.predict_signature_def(inputs, {"prob": prob})})
            builder.save()
            rng = np.random.default_rng(10)
            sess.run([v.assign(rng.normal(0, 1, v.shape).astype(np.float32)) for v in tf1.global_variables()])
            os.makedirs(f"{out}/ckpt/1")
            tf1.train.Saver().save(sess, f"{out}/ckpt/1/model.ckpt", global_step=7)
            # An incremental bundle changing rows of mod_emb by row index of the saved (concatenated)
            # variable: the first and last rows of each part.
            keys = np.array([0, 333, 334, 667, 668, 1000], dtype=np.int64)
            values = rng.normal(0, 3, (len(keys), 4)).astype(np.float32)
            incr = f"{out}/ckpt/1/.incremental_checkpoint"
            os.makedirs(incr)
            sess.run(tf1.raw_ops.SaveV2(prefix=f"{incr}/model.ckpt-9", tensor_names=["mod_emb-sparse_incr_keys",
                                                                                      "mod_emb-sparse_incr_values"],
                                        shape_and_slices=["", ""], tensors=[keys, values]))
            np.savez(f"{out}/incr.npz", name=np.array("mod_emb"), keys=keys, values=values)


EV_TABLE = "input_layer/city_embedding/embedding_weights"
EV_PARTITIONED = "item_scope/input_layer/item_embedding/embedding_weights"
EV_DEFAULT_DIM = 4


def _initializer(graph: object, scope: str, shape: list[int], random: bool, fed: bool) -> tuple[str, np.ndarray]:
    """An EV initializer's subgraph under `scope`, added to `graph`: seeded N(0, 1) (as
    DeepRec's default EV initializer draws, seeds fixed in the graph) or zeros — or with
    `fed`, that value times a placeholder (not computable without a feed); its output
    tensor's name and the value TensorFlow computes for it (fed 1.0)."""
    with tf.Graph().as_default() as own, tf1.name_scope(scope):
        value = tf1.random_normal(shape, seed=5) if random else tf.zeros(shape)
        feeds = {}
        if fed:
            scale = tf1.placeholder(tf.float32, [], name="scale")
            value, feeds = value * scale, {scale: 1.0}
    with tf1.Session(graph=own) as sess:
        computed = sess.run(value, feeds)
    graph.node.extend(own.as_graph_def().node)  # type: ignore[attr-defined]
    return value.name, computed


def _to_kv_ops(graph: object, variable: str, dim: int, random_default: bool, fed: bool = False,
               per_position: bool = False) -> np.ndarray:
    """`variable`'s VarHandleOp -> KvVarHandleOp, initialized by an InitializeKvVariableOp
    whose value (the EV's default matrix, [EV_DEFAULT_DIM, dim]) is `_initializer`'s, and its
    ResourceGathers -> KvResourceGather with DeepRec's dummy default_value 1.0
    (is_use_default_value_tensor false: missing ids read the EV's own matrix). Returns that
    matrix as TensorFlow computes it. `per_position`: the gathers read their default_value input
    by position instead (is_use_default_value_tensor, DeepRec's ev_init_value)."""
    value, matrix = _initializer(graph, f"{variable}/ev_default", [EV_DEFAULT_DIM, dim], random_default, fed)
    dummy = graph.node.add()  # type: ignore[attr-defined]
    dummy.name, dummy.op = f"{variable}/gather_default_value", "Const"
    dummy.attr["dtype"].type = 1
    dummy.attr["value"].tensor.CopyFrom(tf1.make_tensor_proto(np.float32(1.0)))
    empty_key = graph.node.add()  # type: ignore[attr-defined]
    empty_key.name, empty_key.op = f"{variable}/empty_key", "Const"
    empty_key.attr["dtype"].type = 9
    empty_key.attr["value"].tensor.CopyFrom(tf1.make_tensor_proto(np.int64(-1)))
    init = graph.node.add()  # type: ignore[attr-defined]
    init.name, init.op = f"{variable}/InitializeKvVariableOp", "InitializeKvVariableOp"
    init.input.extend([variable, variable, value, empty_key.name])
    init.attr["dtype"].type, init.attr["Tkeys"].type, init.attr["counter_type"].type = 1, 9, 9
    init.attr["shape"].shape.dim.add().size = dim
    init.attr["default_value_dim"].i = EV_DEFAULT_DIM
    for node in graph.node:  # type: ignore[attr-defined]
        if node.name == variable and node.op == "VarHandleOp":
            node.op = "KvVarHandleOp"
            del node.attr["shape"].shape.dim[0]  # shape = [dim]
            node.attr["Tkeys"].type = 9
            node.attr.pop("allowed_devices", None)
            node.attr.pop("debug_name", None)
        elif node.op == "ResourceGather" and node.input[0] == variable:
            node.op = "KvResourceGather"
            node.input.append(dummy.name)
            node.attr.pop("batch_dims", None)
            node.attr["Tkeys"].type = node.attr.pop("Tindices").type
            node.attr["is_use_default_value_tensor"].b = per_position
            node.attr["validate_indices"].b = True
            node.attr["is_inference"].b = True
    return matrix


def _ev_tensors(name: str, keys: np.ndarray, values: np.ndarray) -> dict[str, np.ndarray]:
    return {f"{name}-keys": keys, f"{name}-values": values, f"{name}-freqs": np.ones(len(keys), np.int64),
            f"{name}-versions": np.zeros(len(keys), np.int64)}


def rewrite_to_ev(savedmodel: str, out: str, unservable: bool = False) -> None:
    """The SavedModel with its `city` table turned into a DeepRec Embedding Variable and its
    `item` table (partitioned in 2) into a partitioned EV, as DeepRec's own graphs hold them:
    DeepRec cannot be installed here, so its ops are written into the GraphDef by hand with
    the inputs and attrs DeepRec-AI/DeepRec registers in tensorflow/core/ops/kv_variable_ops.cc
    — `KvVarHandleOp` (container, shared_name, dtype, shape [dim], Tkeys) and
    `KvResourceGather(resource, indices, default_value)` (is_use_default_value_tensor,
    validate_indices, dtype, Tkeys, is_inference). TensorFlow cannot import the result. Its
    variables/ hold the EVs as DeepRec saves them (`-keys`, `-values`, `-freqs`, `-versions`;
    `E/part_<k>-...` per partition, keys the global ids): `city` with its even ids only,
    OUT.missing.npz naming the odd ones with the rows DeepRec answers for them — row
    id % EV_DEFAULT_DIM of city's default matrix, a seeded N(0, 1) draw (OUT.default.npy) —
    which TensorFlow's reference run writes into the plain variable. `item` stores every id;
    its default matrix is zeros. With `unservable`, city's default matrix needs a feed and
    item's gathers read their default by position: neither can be served (warnings)."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    with open(f"{savedmodel}/saved_model.pb", "rb") as f:
        saved.ParseFromString(f.read())
    graph = saved.meta_graphs[0].graph_def
    default = _to_kv_ops(graph, EV_TABLE, 8, random_default=True, fed=unservable)
    for part in (0, 1):
        _to_kv_ops(graph, f"{EV_PARTITIONED}/part_{part}", 16, random_default=False, per_position=unservable)
    os.makedirs(f"{out}/variables")
    with open(f"{out}/saved_model.pb", "wb") as f:
        f.write(saved.SerializeToString())
    reader = tf1.train.load_checkpoint(f"{savedmodel}/variables/variables")
    tensors = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
    rows = tensors.pop(EV_TABLE)
    keys = np.arange(0, len(rows), 2, dtype=np.int64)
    tensors |= _ev_tensors(EV_TABLE, keys, rows[keys])
    items = tensors.pop(EV_PARTITIONED)
    half = len(items) // 2
    for part, ids in enumerate((np.arange(half), np.arange(half, len(items)))):
        shuffled = np.random.default_rng(part).permutation(ids).astype(np.int64)  # an EV's keys have no order
        tensors |= _ev_tensors(f"{EV_PARTITIONED}/part_{part}", shuffled, items[shuffled])
    names = sorted(tensors)
    with tf1.Session() as sess:
        sess.run(tf1.raw_ops.SaveV2(prefix=f"{out}/variables/variables", tensor_names=names,
                                    shape_and_slices=[""] * len(names), tensors=[tensors[n] for n in names]))
    missing = np.arange(1, len(rows), 2, dtype=np.int64)
    np.save(f"{out}.default.npy", default)
    np.savez(f"{out}.missing.npz", name=np.array(EV_TABLE), keys=missing, values=default[missing % EV_DEFAULT_DIM])


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "write":
        write(sys.argv[2])
    elif command == "vocab":
        write_vocab(sys.argv[2])
    elif command == "int_vocab":
        write_int_vocab(sys.argv[2])
    elif command == "mod":
        write_mod(sys.argv[2])
    elif command == "weighted":
        write_weighted(sys.argv[2], refused=sys.argv[3:] == ["refused"])
    elif command == "shared":
        write_shared(sys.argv[2])
    elif command == "vocab_oov":
        write_vocab_oov(sys.argv[2])
    elif command == "hash":  # IN.npz (strings, buckets) -> OUT.npz: tf.strings.to_hash_bucket_fast per bucket count
        with np.load(sys.argv[2], allow_pickle=True) as job:
            words, counts = list(job["strings"]), [int(b) for b in job["buckets"]]
        with tf1.Session() as sess:
            np.savez(sys.argv[3], **{str(b): sess.run(tf.strings.to_hash_bucket_fast(words, b)) for b in counts})
    elif command == "evgraph":
        rewrite_to_ev(sys.argv[2], sys.argv[3], unservable=sys.argv[4:] == ["unservable"])
    elif command == "predict":
        predict(sys.argv[2], sys.argv[3], sys.argv[4], *[a or None for a in (sys.argv[5:7] + ["", ""])[:2]])
    else:
        raise SystemExit(f"unknown command {command!r}")
