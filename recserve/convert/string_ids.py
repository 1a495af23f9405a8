"""How a lookup's string ids become table keys, read off the graph (DESIGN §4c).

The ids path between a string input and its gather holds one of:
- `StringToHashBucketFast` alone: a hashed column (`categorical_column_with_hash_bucket`,
  Keras `Hashing`): Fingerprint64 mod num_buckets;
- `LookupTableFindV2` on a `HashTableV2`: a vocabulary (`categorical_column_with_vocabulary_
  list/_file`, Keras `StringLookup`). The table is filled by `LookupTableImportV2` /
  `InitializeTableV2` from constants (keys, ids) or by `InitializeTableFromTextFileV2` from a
  file in the SavedModel's assets/ (line i -> id i + offset). A string not in it gets the
  find's default id, or, when the path also hashes the string (`num_oov_buckets`, Keras
  `num_oov_indices > 1`), `oov_start + Fingerprint64 mod k`, where oov_start is the constant
  (or the table's size) added to the hash. A Keras mask token (`where(input == token,
  mask_id, ids)`) joins the vocabulary at its id; ids no word has are None in the list.
'' is padding when the path drops it before the lookup (feature columns compare the input
with '' by `NotEqual`); otherwise (Keras) '' is hashed or looked up like any string.
What any other pattern would need is refused by name. An integer input looked up through a
HashTableV2 of integer keys (an integer vocabulary list, Keras IntegerLookup) is read by
`integer_ids` the same way, without OOV hashing or mask tokens.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from recserve.errors import ModelLoadError

__all__ = ["integer_ids", "string_ids"]

_FINDS = frozenset({"LookupTableFindV2"})
_INTEGERS = frozenset({3, 9})  # DT_INT32, DT_INT64
_TABLE_INITS = frozenset({"InitializeTableV2", "LookupTableImportV2", "InitializeTableFromTextFileV2"})
_ADDS = frozenset({"Add", "AddV2"})
_WHOLE_LINE, _LINE_NUMBER = -2, -1
_SUPPORTED = ("supported: categorical_column_with_hash_bucket, categorical_column_with_vocabulary_list/_file "
              "(default_value or num_oov_buckets), Keras Hashing (no salt) and StringLookup (vocabulary list, "
              "num_oov_indices >= 1, mask_token)")


def _name(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def _through(graph: Any, ref: str, ops: frozenset[str] = frozenset({"Identity"})) -> Any | None:
    node = graph.nodes.get(_name(ref))
    while node is not None and node.op in ops:
        node = graph.nodes.get(_name(node.input[0]))
    return node


def _int_const(graph: Any, ref: str) -> int | None:
    node = _through(graph, ref, frozenset({"Identity", "Cast"}))
    if node is None or node.op != "Const":
        return None
    from tensorflow.python.framework import tensor_util

    value = tensor_util.MakeNdarray(node.attr["value"].tensor)
    return int(value) if value.size == 1 else None


def _is_empty_string_const(graph: Any, ref: str) -> bool:
    node = _through(graph, ref)
    if node is None or node.op != "Const" or node.attr["dtype"].type != 7:
        return False
    values = list(node.attr["value"].tensor.string_val)
    return values in ([b""], [])  # a scalar '' may be stored as an empty string_val with no shape


def string_ids(graph: Any, path: list[Any], table: str, assets: Mapping[str, str]) -> dict[str, Any]:
    """The EmbeddingBinding fields (buckets, vocabulary and its options, empty_is_padding)
    of a string lookup whose ids path (ops computed from the input) is `path`."""
    ops = {op.op for op in path}
    mask = _mask_token(graph, path, table)
    padding = any(op.op == "NotEqual" and any(_is_empty_string_const(graph, r) for r in op.input[:2]) for op in path)
    hashes = [op for op in path if op.op == "StringToHashBucketFast"]
    finds = [op for op in path if op.op in _FINDS]
    if len(hashes) > 1 or len(finds) > 1:
        raise ModelLoadError(f"the lookup of {table!r} hashes or looks up its strings more than once "
                             f"({sorted(op.name for op in hashes + finds)}); {_SUPPORTED}")
    if not finds:
        if not hashes:
            raise ModelLoadError(f"the lookup of {table!r} turns strings into ids by {sorted(ops)}; {_SUPPORTED}")
        return {"buckets": hashes[0].attr["num_buckets"].i, "empty_is_padding": padding}
    find = finds[0]
    default = _int_const(graph, find.input[2])
    if default is None:
        raise ModelLoadError(f"the vocabulary of {table!r} has a default id that is not a constant ({find.input[2]!r})")
    words, start, size = _vocabulary(graph, find, table, assets)
    if mask is not None:
        words, start = _with_token(words, start, *mask, table)
    out: dict[str, Any] = {"vocabulary": words, "vocabulary_start": start, "default_id": default,
                           "empty_is_padding": padding}
    if hashes:
        out |= {"oov_buckets": hashes[0].attr["num_buckets"].i, "oov_start": _oov_start(graph, hashes[0], size, table),
                "default_id": -1}
    elif default < -1:
        raise ModelLoadError(f"the vocabulary of {table!r} maps unknown strings to id {default}; recserve converts "
                             "default ids >= -1 (-1: dropped)")
    return out


def integer_ids(graph: Any, path: list[Any], table: str) -> dict[str, Any]:
    """The EmbeddingBinding fields (vocabulary and its options, empty_is_padding) of an
    integer lookup whose ids path goes through an integer vocabulary (`LookupTableFindV2` on a
    HashTableV2 of integer keys: categorical_column_with_vocabulary_list of integers, Keras
    IntegerLookup): an id in it gets vocabulary_start + its index, any other the find's
    default id. -1 is padding where the path drops it first (feature columns compare the ids
    with -1 by `NotEqual`); otherwise (Keras) it is looked up like any id."""
    finds = [op for op in path if op.op in _FINDS]
    supported = ("supported: categorical_column_with_vocabulary_list of integers (default_value), Keras "
                 "IntegerLookup (vocabulary list, num_oov_indices <= 1, no mask_token)")
    if len(finds) != 1 or any(op.op in ("StringToHashBucketFast", "Equal") for op in path):
        raise ModelLoadError(f"the lookup of {table!r} maps its integer ids through {sorted({o.op for o in path})}; "
                             f"{supported}")
    find = finds[0]
    default = _int_const(graph, find.input[2])
    if default is None or default < -1:
        raise ModelLoadError(f"the integer vocabulary of {table!r} has the default id {find.input[2]!r}; recserve "
                             "converts a constant >= -1 (-1: dropped)")
    words, start, _ = _vocabulary(graph, find, table, {})
    padding = any(op.op == "NotEqual" and any(_int_const(graph, r) == -1 for r in op.input[:2]) for op in path)
    return {"vocabulary": words, "vocabulary_start": start, "default_id": default, "empty_is_padding": padding}


def _mask_token(graph: Any, path: list[Any], table: str) -> tuple[str, int] | None:
    """Keras StringLookup's mask_token: `where(input == mask_key, mask_value, lookups)`."""
    for op in path:
        if op.op != "Equal":
            continue
        refs = op.input[:2]
        nodes = [_through(graph, ref) for ref in refs]
        if not any(n is not None and n.op == "Placeholder" for n in nodes):
            continue  # an id compared with a constant (num_oov_indices' -1), not the string input
        word = next((n for n in nodes if n is not None and n.op == "Const" and n.attr["dtype"].type == 7), None)
        select = next((c for c in graph.consumers.get(op.name, []) if c.op in ("Select", "SelectV2")), None)
        value = _int_const(graph, select.input[1]) if select is not None else None
        if word is None or value is None:
            raise ModelLoadError(f"the lookup of {table!r} compares its strings with {refs} in a way recserve cannot "
                                 f"read as a mask token; {_SUPPORTED}")
        strings = list(word.attr["value"].tensor.string_val) or [b""]
        return strings[0].decode("utf-8"), value
    return None


def _with_token(words: tuple[str | None, ...], start: int, token: str, token_id: int, table: str
                ) -> tuple[tuple[str | None, ...], int]:
    """The vocabulary with `token` at `token_id` too; ids no word has are None."""
    by_id: dict[int, str | None] = {start + i: w for i, w in enumerate(words)}
    if by_id.get(token_id) not in (None, token):
        raise ModelLoadError(f"the lookup of {table!r} gives its mask token {token!r} id {token_id}, "
                             f"which the vocabulary gives {by_id[token_id]!r} too")
    by_id[token_id] = token
    first = min(by_id)
    return tuple(by_id.get(i) for i in range(first, max(by_id) + 1)), first


def _oov_start(graph: Any, hashed: Any, size: int, table: str) -> int:
    """What the graph adds to the OOV hash: a constant, or the vocabulary table's size."""
    for consumer in graph.consumers.get(hashed.name, []):
        if consumer.op not in _ADDS:
            continue
        other = next(ref for ref in consumer.input if _name(ref) != hashed.name)
        value = _int_const(graph, other)
        if value is not None:
            return value
        node = _through(graph, other, frozenset({"Identity", "Cast"}))
        if node is not None and node.op == "LookupTableSizeV2":
            return size
    raise ModelLoadError(f"the lookup of {table!r} hashes unknown strings ({hashed.name!r}) but adds to the hash "
                         f"something recserve cannot read as a constant; {_SUPPORTED}")


def _vocabulary(graph: Any, find: Any, table: str, assets: Mapping[str, str]
                ) -> tuple[tuple[str | int, ...], int, int]:
    """(words in id order, the first word's id, the table's size) of the HashTableV2 `find`
    reads; its words are strings, or integers for an integer vocabulary."""
    handle = _through(graph, find.input[0])
    if handle is None or handle.op != "HashTableV2":
        raise ModelLoadError(f"the vocabulary of {table!r} is a {handle.op if handle else 'missing'} table; recserve "
                             f"converts HashTableV2 (static vocabularies); {_SUPPORTED}")
    integer = handle.attr["key_dtype"].type in _INTEGERS
    if handle.attr["key_dtype"].type != 7 and not integer:
        raise ModelLoadError(f"the vocabulary of {table!r} has keys of dtype {handle.attr['key_dtype'].type}; recserve "
                             f"converts strings and integers; {_SUPPORTED}")
    inits = [n for n in graph.nodes.values() if n.op in _TABLE_INITS and n.input
             and (_through(graph, n.input[0]) or handle).name == handle.name]
    if len(inits) != 1:
        raise ModelLoadError(f"the vocabulary of {table!r} is initialized by {sorted(n.name for n in inits)}; "
                             "recserve converts a table filled once")
    init = inits[0]
    if init.op == "InitializeTableFromTextFileV2":
        if integer:
            raise ModelLoadError(f"the integer vocabulary of {table!r} is read from a file; recserve converts integer "
                                 "vocabularies held in the graph (vocabulary lists, IntegerLookup(vocabulary=[...]))")
        return _file_vocabulary(graph, init, table, assets)
    from tensorflow.python.framework import tensor_util

    keys = _through(graph, init.input[1], frozenset({"Identity", "Cast"}))  # integer keys: a Cast to the table's dtype
    values = _through(graph, init.input[2], frozenset({"Identity", "Cast"}))
    if keys is None or keys.op != "Const" or values is None or values.op not in ("Const", "Range"):
        raise ModelLoadError(f"the vocabulary of {table!r} is filled from {init.input[1:3]}, not constants")
    listed = tensor_util.MakeNdarray(keys.attr["value"].tensor).ravel().tolist()
    words = [int(w) for w in listed] if integer else [w.decode("utf-8") for w in listed]
    if values.op == "Range":
        first = _int_const(graph, values.input[0])
        ids = list(range(first, first + len(words))) if first is not None else None
    else:
        ids = [int(i) for i in tensor_util.MakeNdarray(values.attr["value"].tensor).ravel().tolist()]
    if not ids or ids != list(range(ids[0], ids[0] + len(words))):
        raise ModelLoadError(f"the vocabulary of {table!r} maps its words to ids that are not consecutive; recserve "
                             "converts word i -> start + i")
    return tuple(words), ids[0], len(words)


def _file_vocabulary(graph: Any, init: Any, table: str, assets: Mapping[str, str]) -> tuple[tuple[str, ...], int, int]:
    """categorical_column_with_vocabulary_file / StringLookup(vocabulary=path): whole lines
    are the words, line numbers (+ offset) their ids; the file is in the SavedModel's assets/."""
    attr = init.attr
    if attr["key_index"].i != _WHOLE_LINE or attr["value_index"].i != _LINE_NUMBER:
        raise ModelLoadError(f"the vocabulary file of {table!r} maps column {attr['key_index'].i} to column "
                             f"{attr['value_index'].i}; recserve converts whole lines -> line numbers")
    source = _through(graph, init.input[1])
    if source is None or source.op != "Const":
        raise ModelLoadError(f"the vocabulary file of {table!r} is named by {init.input[1]!r}, not a constant")
    named = source.attr["value"].tensor.string_val[0].decode("utf-8")
    path = assets.get(f"{source.name}:0") or assets.get(os.path.basename(named))
    if path is None or not os.path.isfile(path):
        raise ModelLoadError(f"the vocabulary file of {table!r} ({named!r}) is not in the SavedModel's assets/")
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    size = attr["vocab_size"].i
    if size > 0:
        if len(lines) < size:
            raise ModelLoadError(f"the vocabulary file of {table!r} has {len(lines)} lines; the graph says {size}")
        lines = lines[:size]
    return tuple(lines), attr["offset"].i if "offset" in attr else 0, len(lines)
