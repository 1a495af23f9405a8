"""Where a processor config comes from and how EAS wraps it (DESIGN §5).

`load_document` turns JSON text, bytes, a mapping or a file path into one JSON object;
`split_models` finds the DeepRec field objects inside it: the flat DeepRec form, the EAS
service form ``{"name": ..., "model_config": {...}, "processor": ...}`` (``model_config``
may be an object or JSON text, as EAS passes it as TEXT), or recserve's several-model form
``{"models": [<EAS service form>, ...]}``. Stateless and thread-safe.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from recserve.config.values import close_match, show
from recserve.errors import ConfigError

__all__ = ["DEFAULT_MODEL_NAME", "EAS_SERVICE_KEYS", "load_document", "split_models"]

DEFAULT_MODEL_NAME = "default"

# Top-level keys of an EAS service JSON (PAI-EAS "JSON parameters"). They describe the
# deployment (image, resources, processor package), not the model, so recserve ignores them.
EAS_SERVICE_KEYS = frozenset(
    {
        "autoscaler",
        "cloud",
        "containers",
        "dockerAuth",
        "features",
        "metadata",
        "model_config",
        "model_entry",
        "model_path",
        "name",
        "networking",
        "oss_endpoint",
        "processor",
        "processor_entry",
        "processor_mainclass",
        "processor_path",
        "processor_type",
        "runtime",
        "storage",
        "token",
        "warm_up_data_path",
    }
)

# Model names end up in URLs (/v1/models/{name}, /v2/models/{name}) and metric labels.
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(f"field {key!r} appears twice in the config", field=key)
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise ConfigError(f"the config holds {name}, which is not JSON")


def _parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(
            text, object_pairs_hook=_object_without_duplicates, parse_constant=_reject_constant
        )
    except json.JSONDecodeError as exc:
        hint = ""
        if "\n" not in text and len(text) < 4096 and os.path.isfile(text.strip()):
            hint = f"; it names a file: pass pathlib.Path({text.strip()!r}) or the file's contents"
        # The message has line and column only, never the text (it may hold secrets).
        raise ConfigError(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}{hint}") from exc


def load_document(raw: str | bytes | Mapping[str, Any] | os.PathLike[str]) -> dict[str, Any]:
    """The config as one JSON object. A `str` is JSON text, never a file name: pass a
    `pathlib.Path` to read a file (a str naming a file is refused with that hint)."""
    if isinstance(raw, os.PathLike):
        try:
            text = Path(raw).read_text(encoding="utf-8-sig")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {os.fspath(raw)!r}: {exc.strerror}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {os.fspath(raw)!r} is not UTF-8 text") from exc
        doc = _parse_json(text, f"config file {os.fspath(raw)!r}")
    elif isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ConfigError("config bytes are not UTF-8 text") from exc
        doc = _parse_json(text, "config")
    elif isinstance(raw, str):
        doc = _parse_json(raw, "config")
    elif isinstance(raw, Mapping):
        doc = dict(raw)
    else:
        raise ConfigError(
            f"config must be JSON text (str or bytes), a dict or a pathlib.Path, got {type(raw).__name__}"
        )
    if not isinstance(doc, dict):
        raise ConfigError(f"config must be a JSON object, got {show(doc)[:80]}")
    return doc


def _model_name(service: Mapping[str, Any], fallback: str | None) -> str:
    name = service.get("name")
    metadata = service.get("metadata")
    if name is None and isinstance(metadata, Mapping):
        name = metadata.get("name")
    if name is None:
        if fallback is None:
            raise ConfigError('every entry of "models" needs a "name"', field="name")
        return fallback
    if not isinstance(name, str) or not _MODEL_NAME.fullmatch(name):
        raise ConfigError(
            f"model name must be 1-128 letters, digits, '_', '.' or '-' starting with a letter "
            f"or digit, got {show(name)}",
            field="name",
        )
    return name


def _check_service_keys(service: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    for key in service:
        if key not in allowed:
            hint = close_match(key, sorted(allowed))
            head = f"unknown key {key!r} in {where}" + (f"; did you mean {hint!r}?" if hint else ".")
            raise ConfigError(f"{head} Keys accepted there: {', '.join(sorted(allowed))}", field=key)


def _unwrap_service(service: Mapping[str, Any], fallback: str | None) -> tuple[str, dict[str, Any]]:
    """(name, DeepRec fields) of one EAS service object."""
    _check_service_keys(service, EAS_SERVICE_KEYS, "the EAS service config")
    name = _model_name(service, fallback)
    fields = service.get("model_config")
    if isinstance(fields, str):
        fields = _parse_json(fields, f"model_config of model {name!r}")
    if not isinstance(fields, dict):
        raise ConfigError(
            f"model_config of model {name!r} must be a JSON object (or JSON text of one), got {show(fields)[:80]}",
            field="model_config",
        )
    return name, fields


def split_models(doc: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """[(model name, DeepRec fields)] in the order the config lists them."""
    if "models" in doc:
        _check_service_keys(doc, (EAS_SERVICE_KEYS - {"model_config"}) | {"models"}, "a several-model config")
        entries = doc["models"]
        if not isinstance(entries, list) or not entries:
            raise ConfigError('"models" must be a non-empty list of {"name": ..., "model_config": {...}}', field="models")
        models: list[tuple[str, dict[str, Any]]] = []
        for entry in entries:
            if not isinstance(entry, Mapping):
                raise ConfigError(f'each entry of "models" must be an object, got {show(entry)[:80]}', field="models")
            if "model_config" not in entry:
                raise ConfigError('each entry of "models" needs "model_config" (its DeepRec fields)', field="model_config")
            models.append(_unwrap_service(entry, None))
        names = [name for name, _ in models]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(f"model names must be unique; repeated: {', '.join(duplicates)}", field="name")
        return models
    if "model_config" in doc:
        return [_unwrap_service(doc, DEFAULT_MODEL_NAME)]
    return [(DEFAULT_MODEL_NAME, dict(doc))]
