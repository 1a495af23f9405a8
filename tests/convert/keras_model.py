"""Real Keras (3, TensorFlow backend) for the TF2 SavedModel tests, run as a subprocess
like tf_model.py (TensorFlow never runs in pytest's process).

    python keras_model.py write OUT export|save|mask|integer_lookup|module
        the model below, written by `model.export(OUT)` (what Keras 3 gives TF Serving
        users) or by `tf.saved_model.save(model, OUT)`; `mask`: a StringLookup with a mask
        token; `integer_lookup`: an IntegerLookup before an Embedding (exported);
        `module`: a tf.Module without Keras (_Ranker) saved by tf.saved_model.save
    python keras_model.py predict SAVEDMODEL REQUESTS.npz OUT.npz
        TensorFlow's own predictions (tf.saved_model.load), one batch per request

The model: `city` string -> StringLookup (vocabulary list, one OOV index) -> Embedding 4;
`tags` [batch, 3] strings -> StringLookup (num_oov_indices=3: unknown words hashed into 3
OOV ids) -> Embedding 4 -> GlobalAveragePooling1D; `query` string -> Hashing(64) ->
Embedding 4; `item` int64 -> Embedding 8; `hist` int64 [batch, 5] -> Embedding 4 -> mean;
`age` float [batch, 1]; Dense 16 relu, Dense 1 sigmoid. Embeddings are N(0, 1) so every
row moves the output.
"""

from __future__ import annotations

import sys

import keras
import tensorflow as tf
from model_requests import KERAS_CITIES, KERAS_HIST_ROWS, KERAS_ITEM_ROWS, KERAS_ITEMS, KERAS_TAGS


def build() -> keras.Model:
    keras.utils.set_random_seed(5)
    normal = keras.initializers.RandomNormal(stddev=1.0)
    inputs = {
        "city": keras.Input(shape=(), dtype="string", name="city"),
        "tags": keras.Input(shape=(3,), dtype="string", name="tags"),
        "query": keras.Input(shape=(), dtype="string", name="query"),
        "item": keras.Input(shape=(), dtype="int64", name="item"),
        "hist": keras.Input(shape=(5,), dtype="int64", name="hist"),
        "age": keras.Input(shape=(1,), dtype="float32", name="age"),
    }
    city = keras.layers.Embedding(len(KERAS_CITIES) + 1, 4, embeddings_initializer=normal, name="city_emb")(
        keras.layers.StringLookup(vocabulary=KERAS_CITIES, name="city_lookup")(inputs["city"]))
    tags = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(
        len(KERAS_TAGS) + 3, 4, embeddings_initializer=normal, name="tag_emb")(
        keras.layers.StringLookup(vocabulary=KERAS_TAGS, num_oov_indices=3, name="tag_lookup")(inputs["tags"])))
    query = keras.layers.Embedding(64, 4, embeddings_initializer=normal, name="query_emb")(
        keras.layers.Hashing(64, name="query_hash")(inputs["query"]))
    item = keras.layers.Embedding(KERAS_ITEM_ROWS, 8, embeddings_initializer=normal, name="item_emb")(inputs["item"])
    hist = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(
        KERAS_HIST_ROWS, 4, embeddings_initializer=normal, name="hist_emb")(inputs["hist"]))
    x = keras.layers.Concatenate()([city, tags, query, item, hist, inputs["age"]])
    x = keras.layers.Dense(16, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid", name="prob")(x))


def masked() -> keras.Model:
    """`city` -> StringLookup with mask_token='' ('' -> 0, OOV -> 1, words from 2) -> Embedding 4
    -> Dense 1."""
    keras.utils.set_random_seed(8)
    city = keras.Input(shape=(), dtype="string", name="city")
    ids = keras.layers.StringLookup(vocabulary=KERAS_CITIES, mask_token="")(city)
    embedded = keras.layers.Embedding(len(KERAS_CITIES) + 2, 4, embeddings_initializer="normal")(ids)
    return keras.Model({"city": city}, keras.layers.Dense(1)(embedded))


def integer_lookup() -> keras.Model:
    """`item` int64 -> IntegerLookup (KERAS_ITEMS; one OOV index, 0: -1 and unknown ids) ->
    Embedding 4 (N(0, 1)) -> Dense 1."""
    keras.utils.set_random_seed(13)
    item = keras.Input(shape=(), dtype="int64", name="item")
    ids = keras.layers.IntegerLookup(vocabulary=KERAS_ITEMS)(item)
    embedded = keras.layers.Embedding(len(KERAS_ITEMS) + 1, 4, embeddings_initializer="normal")(ids)
    return keras.Model({"item": item}, keras.layers.Dense(1)(embedded))


class _Ranker(tf.Module):
    """A TF2 model without Keras: tf.Variables looked up by tf.nn.embedding_lookup
    (ResourceGather on the captured handle, as Keras 2's Embedding layer does), strings
    hashed by tf.strings.to_hash_bucket_fast ('' hashed like any string)."""

    def __init__(self) -> None:
        import numpy as np

        super().__init__()
        rng = np.random.default_rng(9)
        self.item = tf.Variable(rng.normal(size=(KERAS_ITEM_ROWS, 8)).astype(np.float32), name="item_emb")
        self.city = tf.Variable(rng.normal(size=(16, 4)).astype(np.float32), name="city_emb")
        self.kernel = tf.Variable((rng.normal(size=(13, 1)) * 0.3).astype(np.float32), name="kernel")

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="item"),
                                  tf.TensorSpec([None], tf.string, name="city"),
                                  tf.TensorSpec([None, 1], tf.float32, name="age")])
    def serve(self, item: tf.Tensor, city: tf.Tensor, age: tf.Tensor) -> dict[str, tf.Tensor]:
        x = tf.concat([tf.nn.embedding_lookup(self.item, item),
                       tf.nn.embedding_lookup(self.city, tf.strings.to_hash_bucket_fast(city, 16)), age], axis=1)
        return {"prob": tf.sigmoid(tf.matmul(x, self.kernel))}


def predict(savedmodel: str, requests_npz: str, out_npz: str) -> None:
    """TensorFlow's `tf.saved_model.load` signature on each request (a session-style load
    cannot run what Keras 3's tf.saved_model.save writes: its restore op fills copies of the
    variables, not the handles its functions read)."""
    import numpy as np

    function = tf.saved_model.load(savedmodel).signatures["serving_default"]
    with np.load(requests_npz, allow_pickle=True) as data:
        results = {}
        for i in range(int(data["n"])):
            feed = {k.split("/", 1)[1]: data[k] for k in data.files if k.startswith(f"{i}/")}
            out = function(**{k: tf.constant(np.char.encode(v.astype(str), "utf-8") if v.dtype == object else v)
                              for k, v in feed.items()})
            results[str(i)] = out[min(out)].numpy()
    np.savez(out_npz, **results)


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "predict":
        predict(*sys.argv[2:5])
        sys.exit(0)
    if command != "write":
        raise SystemExit(f"unknown command {command!r}")
    out, how = sys.argv[2:4]
    if how == "module":
        ranker = _Ranker()
        tf.saved_model.save(ranker, out, signatures={"serving_default": ranker.serve})
        sys.exit(0)
    model = {"mask": masked, "integer_lookup": integer_lookup}.get(how, build)()
    if how in ("export", "mask", "integer_lookup"):
        model.export(out)
    elif how == "save":
        tf.saved_model.save(model, out)
    else:
        raise SystemExit(f"unknown way to save {how!r}")
