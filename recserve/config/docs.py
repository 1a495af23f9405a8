"""docs/config.md, rendered from the field table of `ProcessorConfig`.

``python -m recserve.config --markdown > docs/config.md`` regenerates it; a
test fails when the file and the table differ. Pure function, thread-safe.
"""

from __future__ import annotations

import json
from typing import Any

from recserve.config.schema import ConfigField, config_fields
from recserve.config.sources import EAS_SERVICE_KEYS

__all__ = ["render_markdown"]

_INTRO = """\
# Processor config

`initialize` (C ABI), `recserve.Processor(config)` and `recserve serve --config FILE` take
DeepRec's processor JSON. Every DeepRec field below keeps DeepRec's name, type and meaning;
recserve adds the fields marked *recserve*. This page is generated from the field table in
`recserve/processor/config.py` (`python -m recserve.config --markdown`); check a
config file with `python -m recserve.config --check FILE`.

**Status** says what recserve does with a field: *honoured* — same meaning as in DeepRec;
*mapped* — translated to its ONNX Runtime equivalent, as described; *advisory* — accepted
so DeepRec configs load unchanged, with no effect (the description says why).

## Reading rules

- An unknown field is an error naming it and the closest valid field; a bad value is an
  error naming the field, the value and what is valid. A field given twice is an error.
- `null` means "not set" (as in DeepRec), so the default applies.
- Types are read as DeepRec's jsoncpp reads them: integer fields take JSON numbers only
  (`"session_num": "2"` aborts DeepRec and is an error here, with a hint); a whole float
  like `2.0` is accepted. `omp_num_threads` and `kmp_blocktime`, which DeepRec reads as
  strings, take `4` or `"4"`. Booleans take `true`/`false` or `1`/`0`.
- Fields used only in some mode (`redis_*` and the thread counts without
  `feature_store_type` `redis`, `oss_*` with a local store, `ev_storage_*` without type 12,
  `batch_timeout_micros` without batching) are still checked, then have no effect.
- Secrets (`redis_password`, `oss_access_id`, `oss_access_key`) never appear in logs,
  error messages or model info; they print as `***`. `redis_url` may not carry a password.
- Paths: `savedmodel_dir` and `checkpoint_dir` must match `model_store_type` — local paths
  for `local`, `oss://` (or `s3://`) for `oss`, `s3://` for `s3`, `hdfs://` for `hdfs`.
  `checkpoint_dir` is optional, as in current DeepRec: without it the graph's own
  parameters serve and nothing updates. `savedmodel_dir` is required.
- `Processor(config)` takes JSON text (`str` or `bytes`), a `dict` or a `pathlib.Path`.
  A `str` is always JSON text: a `str` naming a file is refused with a hint to pass a `Path`.

## Where the fields go

A flat object of the fields below is DeepRec's form. The EAS service form is accepted too:
the fields sit under `"model_config"` (an object, or JSON text of one, as EAS passes it),
next to EAS deployment keys that recserve ignores: {eas_keys}. The model is named by
`"name"` (or `"metadata": {{"name": ...}}`), else `default`.

Several models in one process: `{{"models": [{{"name": "ranker", "model_config": {{...}}}}, ...]}}`
— each entry is an EAS service object and needs a unique `name` (letters, digits, `_`,
`.`, `-`). EAS itself deploys one model per service; this list is recserve's form.
See `configs/` for one example of each form.
"""


def _default(field: ConfigField) -> str:
    if field.required:
        return "**required**"
    value: Any = field.default
    if value is None or value == ():
        return "unset"
    return f"`{json.dumps(value)}`"


def _plain(text: str) -> str:
    """`text` safe inside a table cell: no column breaks, no accidental emphasis."""
    return text.replace("|", "\\|").replace("*", "\\*")


def _row(field: ConfigField) -> str:
    name = f"`{field.name}`" + (" *recserve*" if field.origin == "recserve" else "")
    cells = [_plain(field.kind.type_name), _default(field), _plain(field.kind.values), field.status, _plain(field.doc)]
    return "| " + " | ".join([name, *cells]) + " |"


def render_markdown() -> str:
    eas_keys = ", ".join(f"`{k}`" for k in sorted(EAS_SERVICE_KEYS - {"model_config"}))
    lines = [_INTRO.format(eas_keys=eas_keys), "## Fields", ""]
    lines.append("| field | type | default | values | status | description |")
    lines.append("|---|---|---|---|---|---|")
    lines.extend(_row(f) for f in config_fields())
    lines.append("")
    return "\n".join(lines)
