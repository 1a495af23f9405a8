"""The requests of tf_model.py's model, without TensorFlow (the tests import this; TensorFlow
only ever runs in tf_model.py's own processes)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

TAGS_LEN = 4
CITY_BUCKETS, ITEM_BUCKETS, TAG_BUCKETS = 1000, 5000, 500
WORDS = ["beijing", "hangzhou", "", "shanghai", "北京", "x" * 70, "zürich", "a", "tag-with-a-long-name-" * 4]


def requests(n: int, batch: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Batches with known and unseen strings ('' and non-ASCII included) and ids."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        def word() -> str:
            return WORDS[rng.integers(len(WORDS))] if rng.random() < 0.5 else f"w{rng.integers(1 << 40)}"
        out.append({
            "city": np.array([word() for _ in range(batch)], dtype=object),
            "item": rng.integers(-1, ITEM_BUCKETS, batch).astype(np.int64),
            "tags": np.array([[word() if rng.random() < 0.7 else "" for _ in range(TAGS_LEN)] for _ in range(batch)],
                             dtype=object),
            "age": rng.normal(0, 1, batch).astype(np.float32),
            "price": rng.exponential(1, batch).astype(np.float32),
        })
    return out


COLORS = ["red", "green", "blue", "北京"]
VOCAB = [f"word{i}" for i in range(50)]


def _picker(rng: np.random.Generator, known: float, unknown: str, spread: int) -> Callable[[list[str]], str]:
    """A word of a list (with probability `known`), else '' (0.15), else `unknown<n>`."""
    def pick(words: list[str]) -> str:
        roll = rng.random()
        return words[rng.integers(len(words))] if roll < known else "" if roll < known + 0.15 else \
            f"{unknown}{rng.integers(spread)}"
    return pick


def vocab_requests(n: int, batch: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Requests of tf_model.py's vocabulary model: known, unknown and '' strings."""
    rng = np.random.default_rng(seed)
    pick = _picker(rng, 0.6, "unknown", 99)

    return [{"color": np.array([pick(COLORS) for _ in range(batch)], dtype=object),
             "words": np.array([[pick(VOCAB) for _ in range(3)] for _ in range(batch)], dtype=object),
             "x": rng.normal(0, 1, batch).astype(np.float32),
             "slot": rng.integers(0, 20, (batch, 2)).astype(np.int64)} for _ in range(n)]


KERAS_CITIES = ["beijing", "hangzhou", "北京", "zürich"]
KERAS_TAGS = [f"tag{i}" for i in range(20)]
KERAS_ITEM_ROWS, KERAS_HIST_ROWS = 200, 50


def keras_requests(n: int, batch: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Requests of keras_model.py's model: known, unseen and '' strings; ids in range
    (Keras reads a negative id from the table's end, which recserve does not: see the test)."""
    rng = np.random.default_rng(seed)
    pick = _picker(rng, 0.6, "unseen", 1 << 30)

    return [{"city": np.array([pick(KERAS_CITIES) for _ in range(batch)], dtype=object),
             "tags": np.array([[pick(KERAS_TAGS) for _ in range(3)] for _ in range(batch)], dtype=object),
             "query": np.array([pick(WORDS) for _ in range(batch)], dtype=object),
             "item": rng.integers(0, KERAS_ITEM_ROWS, batch).astype(np.int64),
             "hist": rng.integers(0, KERAS_HIST_ROWS, (batch, 5)).astype(np.int64),
             "age": rng.normal(0, 1, (batch, 1)).astype(np.float32)} for _ in range(n)]


CITY_FILE_WORDS = ["paris", "berlin", "北京", "zürich", "rome"]


def vocab_oov_requests(n: int, batch: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Requests of tf_model.py's vocab_oov model: known, unknown and '' strings."""
    rng = np.random.default_rng(seed)
    pick = _picker(rng, 0.55, "unknown", 999)

    return [{"color": np.array([pick(COLORS) for _ in range(batch)], dtype=object),
             "words": np.array([[pick(VOCAB) for _ in range(3)] for _ in range(batch)], dtype=object),
             "city": np.array([pick(CITY_FILE_WORDS) for _ in range(batch)], dtype=object),
             "x": rng.normal(0, 1, batch).astype(np.float32)} for _ in range(n)]


TOPICS = ["sports", "news", "北京", "music"]
WEIGHTED_KW_IDS, WEIGHTED_GENRE_BUCKETS, WEIGHTED_SHOP_IDS = 100, 50, 30


def weighted_requests(n: int, batch: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Requests of tf_model.py's weighted model. An id's weight is 0 exactly where the id is
    padding (-1, ''), as TensorFlow needs (it pairs the k-th id with the k-th non-zero
    weight); other weights are positive or negative, never 0; about one sample in eight has
    no ids at all; strings are known, unseen or ''."""
    rng = np.random.default_rng(seed)
    pick = _picker(rng, 0.5, "unseen", 1 << 30)

    def weights(padding: np.ndarray) -> np.ndarray:
        magnitude = rng.uniform(0.05, 3.0, padding.shape) * np.where(rng.random(padding.shape) < 0.25, -1, 1)
        return np.where(padding, 0.0, magnitude).astype(np.float32)

    out = []
    for _ in range(n):
        kw = np.where(rng.random((batch, 4)) < 0.3, -1, rng.integers(0, WEIGHTED_KW_IDS, (batch, 4))).astype(np.int64)
        genre = np.array([[pick(KERAS_TAGS) for _ in range(3)] for _ in range(batch)], dtype=object)
        topic = np.array([[pick(TOPICS) for _ in range(2)] for _ in range(batch)], dtype=object)
        shop = np.where(rng.random(batch) < 0.2, -1, rng.integers(0, WEIGHTED_SHOP_IDS, batch)).astype(np.int64)
        empty = rng.random(batch) < 0.125
        kw[empty], genre[empty], topic[empty], shop[empty] = -1, "", "", -1
        out.append({"kw": kw, "kw_w": weights(kw == -1), "genre": genre, "genre_w": weights(genre == ""),
                    "topic": topic, "topic_w": weights(topic == ""), "shop": shop, "shop_w": weights(shop == -1),
                    "x": rng.normal(0, 1, batch).astype(np.float32)})
    return out


MOD_IDS, MOD_POS = 1001, 10


def mod_requests(n: int, batch: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Requests of tf_model.py's mod model: ids over every row (and -1 padding), positions."""
    rng = np.random.default_rng(seed)
    return [{"ids": rng.integers(-1, MOD_IDS, (batch, 3)).astype(np.int64),
             "pos": rng.integers(0, MOD_POS, batch).astype(np.int64),
             "x": rng.normal(0, 1, batch).astype(np.float32)} for _ in range(n)]


SHOPS = [1000, 17, 42, 7, 123456789012]
KERAS_ITEMS = [10, 20, 30, 7_000_000_000]
BRANDS = [5, 6, 9]


def int_vocab_requests(n: int, batch: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Requests of tf_model.py's int_vocab model: known ids, unknown ones (negative and
    beyond 2**32 too) and -1 padding."""
    rng = np.random.default_rng(seed)

    def ids(words: list[int], shape: tuple[int, ...]) -> np.ndarray:
        roll = rng.random(shape)
        known = np.array(words, dtype=np.int64)[rng.integers(len(words), size=shape)]
        unknown = rng.integers(-(1 << 40), 1 << 40, shape)
        return np.where(roll < 0.55, known, np.where(roll < 0.75, -1, unknown)).astype(np.int64)

    return [{"shop": ids(SHOPS, (batch, 3)), "brand": ids(BRANDS, (batch,)),
             "x": rng.normal(0, 1, batch).astype(np.float32)} for _ in range(n)]
