"""The processor config: DeepRec fields, EAS wrappers, errors users read, secret hiding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from recserve.config import ProcessorConfig, Secret, parse_config, parse_model_configs
from recserve.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
BASE = {"savedmodel_dir": "/m"}


def error(extra: dict[str, Any], base: dict[str, Any] = BASE) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config({**base, **extra})
    return info.value


# -- examples and defaults ---------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.json")), ids=lambda p: p.name)
def test_every_example_config_loads(path: Path) -> None:
    models = parse_model_configs(path)
    assert models and all(isinstance(config, ProcessorConfig) for _, config in models)
    # The same text given as str and bytes reads identically.
    assert parse_model_configs(path.read_text()) == models
    assert parse_model_configs(path.read_bytes()) == models


def test_defaults_match_deeprec_and_documented_recserve_values() -> None:
    config = parse_config({"savedmodel_dir": "/m"})
    public = config.public_dict()
    assert {k: public[k] for k in (
        "session_num", "select_session_policy", "use_per_session_threads", "feature_store_type",
        "read_thread_num", "update_thread_num", "init_timeout_minutes", "lock_timeout",
        "ev_storage_type", "model_store_type", "signature_name", "serialize_protocol",
        "checkpoint_dir", "model_update_interval_seconds", "pinned_version", "max_batch_size",
        "batch_timeout_micros",
    )} == {
        "session_num": 1, "select_session_policy": "MOD", "use_per_session_threads": False,
        "feature_store_type": "memory", "read_thread_num": 4, "update_thread_num": 2,
        "init_timeout_minutes": -1, "lock_timeout": 900, "ev_storage_type": 0,
        "model_store_type": "local", "signature_name": "serving_default",
        "serialize_protocol": "protobuf", "checkpoint_dir": None,
        "model_update_interval_seconds": 5.0, "pinned_version": None, "max_batch_size": 0,
        "batch_timeout_micros": 0,
    }
    assert config.env_overrides() == {}
    assert config.session_count == 1


def test_deeprec_full_example_has_every_deeprec_field_and_reads_them() -> None:
    from recserve.config import config_fields

    raw = json.loads((CONFIGS / "deeprec_full.json").read_text())
    deeprec = {f.name for f in config_fields() if f.origin == "DeepRec"}
    assert set(raw) == deeprec
    config = parse_config(raw)
    assert config.cpusets == ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15))
    assert config.gpu_ids_list == (0, 1)
    assert config.session_count == 4
    assert config.redis_url == "redis://10.0.0.12:6379"
    assert config.oss_endpoint == "https://oss-cn-shanghai-internal.aliyuncs.com"
    assert config.oss_access_key == Secret("example-access-key")
    assert config.ev_tier_sizes == (8589934592, 107374182400)
    assert config.env_overrides() == {"OMP_NUM_THREADS": "4", "KMP_BLOCKTIME": "0"}


def test_values_read_as_deeprec_reads_them() -> None:
    config = parse_config({
        **BASE, "session_num": 2.0, "omp_num_threads": "8", "kmp_blocktime": 1,
        "use_per_session_threads": 1, "enable_inline_execute": 0, "checkpoint_dir": None,
        "gpu_ids_list": [1, 0], "ev_storage_type": 12, "ev_storage_path": "/ssd", "ev_storage_size": [1024],
    })
    assert (config.session_num, config.omp_num_threads, config.kmp_blocktime) == (2, 8, 1)
    assert (config.use_per_session_threads, config.enable_inline_execute) == (True, False)
    assert config.checkpoint_dir is None
    assert config.gpu_ids_list == (1, 0)
    assert config.ev_tier_sizes == (1024, 1 << 30)


@pytest.mark.parametrize(
    ("given", "normalized"),
    [
        ("10.0.0.1:6379", "redis://10.0.0.1:6379"),
        ("[::1]:6380", "redis://[::1]:6380"),
        ("redis://cache:6379/2", "redis://cache:6379/2"),
        ("rediss://app@cache.example.com:6380", "rediss://app@cache.example.com:6380"),
    ],
)
def test_redis_url_forms(given: str, normalized: str) -> None:
    config = parse_config({**BASE, "feature_store_type": "redis", "redis_url": given})
    assert config.redis_url == normalized and config.uses_redis


# -- EAS wrappers ------------------------------------------------------------------------


def test_eas_service_wrapper_names_the_model_and_ignores_deployment_keys() -> None:
    [(name, config)] = parse_model_configs(CONFIGS / "eas_wrapper.json")
    assert name == "ranker"
    assert config.session_num == 2 and config.savedmodel_dir.endswith("/savedmodel/")


def test_eas_model_config_may_be_json_text_and_name_may_come_from_metadata() -> None:
    wrapped = {"metadata": {"name": "ctr"}, "processor": "x", "model_config": json.dumps({**BASE, "session_num": 3})}
    assert parse_model_configs(wrapped) == [("ctr", parse_config({**BASE, "session_num": 3}))]
    assert parse_model_configs({"model_config": BASE}) == [("default", parse_config(BASE))]
    assert parse_model_configs(BASE) == [("default", parse_config(BASE))]


def test_several_models() -> None:
    models = parse_model_configs(CONFIGS / "eas_multi_model.json")
    assert [name for name, _ in models] == ["ranker", "recall"]
    assert models[0][1].select_session_policy == "LEAST_BUSY"
    assert models[1][1].pinned_version == "20240601"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {"models": [{"name": "a", "model_config": BASE}, {"name": "a", "model_config": BASE}]},
            "model names must be unique; repeated: a",
        ),
        ({"models": [{"model_config": BASE}]}, 'every entry of "models" needs a "name"'),
        ({"models": [{"name": "a"}]}, 'each entry of "models" needs "model_config" (its DeepRec fields)'),
        ({"models": []}, '"models" must be a non-empty list of {"name": ..., "model_config": {...}}'),
        (
            {"models": [{"name": "a b", "model_config": BASE}]},
            "model name must be 1-128 letters, digits, '_', '.' or '-' starting with a letter or digit, got \"a b\"",
        ),
        (
            {"models": [{"name": "a", "model_config": BASE}, {"name": "b", "model_config": {**BASE, "session_num": 0}}]},
            "model 'b': session_num must be >= 1, got 0",
        ),
        (
            {"model_config": BASE, "procesor": "x"},
            ("unknown key 'procesor' in the EAS service config; did you mean 'processor'? Keys accepted there: "
            "autoscaler, cloud, containers, dockerAuth, features, metadata, model_config, model_entry, "
            "model_path, name, networking, oss_endpoint, processor, processor_entry, processor_mainclass, "
            "processor_path, processor_type, runtime, storage, token, warm_up_data_path"),
        ),
        ({"model_config": "{nope"}, ("model_config of model 'default' is not valid JSON: Expecting property name "
         "enclosed in double quotes at line 1 column 2")),
        ({"model_config": [1]}, "model_config of model 'default' must be a JSON object (or JSON text of one), got [1]"),
    ],
)
def test_wrapper_errors(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_model_configs(doc)
    assert info.value.message == message


def test_parse_config_refuses_several_models() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(CONFIGS / "eas_multi_model.json")
    assert info.value.message == (
        "the config describes 2 models (ranker, recall); load it with parse_model_configs or `recserve serve --config`"
    )


# -- where the config comes from ---------------------------------------------------------


def test_a_str_naming_a_file_is_refused_with_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(BASE))
    assert parse_config(path) == parse_config(BASE)
    with pytest.raises(ConfigError) as info:
        parse_config(str(path))
    assert info.value.message == (
        f"config is not valid JSON: Expecting value at line 1 column 1; it names a file: "
        f"pass pathlib.Path({str(path)!r}) or the file's contents"
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"savedmodel_dir": "/m", "session_num": 1, "session_num": 2}', "field 'session_num' appears twice in the config"),
        ('{"savedmodel_dir": "/m", "session_num": NaN}', "the config holds NaN, which is not JSON"),
        ("[1, 2]", "config must be a JSON object, got [1, 2]"),
        (b"\xff{}", "config bytes are not UTF-8 text"),
        (42, "config must be JSON text (str or bytes), a dict or a pathlib.Path, got int"),
    ],
)
def test_document_errors(raw: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert info.value.message == message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(tmp_path / "absent.json")
    assert info.value.message == f"cannot read config file {str(tmp_path / 'absent.json')!r}: No such file or directory"


# -- field errors ------------------------------------------------------------------------

VALID = "Valid fields are listed in docs/config.md (or run: python -m recserve.config --markdown)."


@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        ({"sesion_num": 2}, "sesion_num", f"unknown field 'sesion_num'; did you mean 'session_num'? {VALID}"),
        ({"Session_Num": 2}, "Session_Num", f"unknown field 'Session_Num'; did you mean 'session_num'? {VALID}"),
        ({"frobnicate": 1}, "frobnicate", f"unknown field 'frobnicate'. {VALID}"),
        ({"processor": "tensorflow_cpu"}, "processor",
         "field 'processor' is an EAS service key, not a model field; put the model fields under \"model_config\" next to it"),
        ({"embedding_names": "a;b"}, "embedding_names",
         "field 'embedding_names' configures DeepRec's sharded embedding, which recserve does not support; remove it"),
        ({"session_num": "2"}, "session_num", 'session_num must be an integer, got a string "2"; write 2 without quotes'),
        ({"session_num": "two"}, "session_num", 'session_num must be an integer, got a string "two"'),
        ({"session_num": 0}, "session_num", "session_num must be >= 1, got 0"),
        ({"session_num": -1}, "session_num", "session_num must be >= 1, got -1"),
        ({"session_num": 1.5}, "session_num", "session_num must be an integer, got a number 1.5"),
        ({"session_num": True}, "session_num", "session_num must be an integer, got a boolean true"),
        ({"read_thread_num": 97}, "read_thread_num", "read_thread_num must be 1..96, got 97"),
        ({"init_timeout_minutes": 0}, "init_timeout_minutes", "init_timeout_minutes must be -1 or >= 1, got 0"),
        ({"omp_num_threads": "many"}, "omp_num_threads",
         'omp_num_threads must be an integer or a string of digits, got a string "many"'),
        ({"select_session_policy": "rr"}, "select_session_policy",
         'select_session_policy must be one of "MOD", "RR", "LEAST_BUSY", got "rr"; did you mean "RR"?'),
        ({"feature_store_type": "cluster_redis"}, "feature_store_type",
         'feature_store_type must be one of "memory", "local", "redis", got "cluster_redis"'),
        ({"ev_storage_type": 2}, "ev_storage_type", "ev_storage_type must be one of 0, 1, 12, got 2"),
        ({"serialize_protocol": "json"}, "serialize_protocol", 'serialize_protocol must be one of "protobuf", got "json"'),
        ({"use_multi_stream": "true"}, "use_multi_stream", 'use_multi_stream must be true or false, got a string "true"'),
        ({"signature_name": ""}, "signature_name", "signature_name must not be empty"),
        ({"prepack_weights": "Auto"}, "prepack_weights",
         'prepack_weights must be true, false or "auto", got "Auto"; did you mean "auto"?'),
        ({"prepack_weights": "false"}, "prepack_weights",
         'prepack_weights must be true, false or "auto", got "false" (a JSON boolean, not a string); did you mean false?'),
        ({"prepack_weights": 2}, "prepack_weights", 'prepack_weights must be true, false or "auto", got a number 2'),
        ({"shard_embedding": True}, "shard_embedding",
         "shard_embedding true is not supported: recserve does not shard embedding tables across instances"),
        ({"cpusets": "0-3;x"}, "cpusets", "cpusets group \"x\" in \"0-3;x\" is not a CPU list like '0-3' or '0,1,2,3'"),
        ({"gpu_ids_list": "0,0"}, "gpu_ids_list", 'gpu_ids_list must list distinct GPU numbers >= 0, got "0,0"'),
        ({"ev_storage_size": [1, 2, 3, 4, 5]}, "ev_storage_size",
         "ev_storage_size must be a list of 1 to 4 sizes in bytes, got a list [1, 2, 3, 4, 5]"),
        ({"model_update_interval_seconds": 0}, "model_update_interval_seconds",
         "model_update_interval_seconds must be > 0, got 0"),
        ({"redis_url": "cache"}, "redis_url",
         'redis_url must be "host:port", "redis://host:port" or "rediss://host:port", got "cache"'),
        ({"redis_url": "http://cache:6379"}, "redis_url", 'redis_url must use redis:// or rediss://, got "http://cache:6379"'),
        ({"oss_endpoint": "ftp://x"}, "oss_endpoint", 'oss_endpoint must be a host or an http(s):// URL, got "ftp://x"'),
        ({"savedmodel_dir": None}, "savedmodel_dir",
         "savedmodel_dir is required: the model dir, holding model.onnx and model.json (DESIGN §4)."),
    ],
)
def test_field_errors(extra: dict[str, Any], field: str, message: str) -> None:
    exc = error(extra)
    assert (exc.field, exc.message, exc.status) == (field, message, 400)


@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        ({"feature_store_type": "redis"}, "redis_url",
         "feature_store_type 'redis' needs redis_url (\"host:port\" or \"redis://host:port\")"),
        ({"checkpoint_dir": "oss://bucket/ckpt"}, "checkpoint_dir",
         ("checkpoint_dir 'oss://bucket/ckpt' is an oss:// path but model_store_type is 'local', which reads a "
         "local path; set model_store_type to 'oss' or change checkpoint_dir")),
        ({"model_store_type": "oss", "savedmodel_dir": "/models/m", "oss_endpoint": "e", "oss_access_id": "i",
          "oss_access_key": "k"}, "savedmodel_dir",
         ("savedmodel_dir '/models/m' is a local path but model_store_type is 'oss', which reads oss:// or s3:// "
         "paths; set model_store_type to 'local' or change savedmodel_dir")),
        ({"model_store_type": "hdfs", "savedmodel_dir": "s3://b/m"}, "savedmodel_dir",
         ("savedmodel_dir 's3://b/m' is an s3:// path but model_store_type is 'hdfs', which reads hdfs:// paths; "
         "set model_store_type to 's3' or change savedmodel_dir")),
        ({"savedmodel_dir": "ftp://host/m"}, "savedmodel_dir",
         ("savedmodel_dir 'ftp://host/m' has unsupported scheme ftp://; use a local path or an oss://, s3:// or "
         "hdfs:// URL")),
        ({"model_store_type": "oss", "savedmodel_dir": "oss://b/m", "oss_access_id": "i"}, "oss_endpoint",
         ("model_store_type 'oss' needs oss_endpoint, oss_access_id and oss_access_key; missing: oss_endpoint, "
         "oss_access_key")),
        ({"model_store_type": "s3", "savedmodel_dir": "s3://b/m", "oss_access_key": "k"}, "oss_access_id",
         "oss_access_key is set but oss_access_id is not; set both or neither"),
        ({"cpusets": "0-1;2-3", "session_num": 2}, "cpusets",
         "cpusets pins each session's own thread pools; set use_per_session_threads to true"),
        ({"cpusets": "0-1;2-3", "use_per_session_threads": True}, "cpusets",
         "cpusets has 2 groups but the model has 1 session (session_num 1); give one group per session"),
        ({"cpusets": "0-1;2-3", "use_per_session_threads": True, "session_num": 2, "gpu_ids_list": "0,1"}, "cpusets",
         "cpusets has 2 groups but the model has 4 sessions (session_num 2 x 2 GPUs); give one group per session"),
        ({"timeline_path": "/tmp/t", "timeline_trace_count": 2}, "timeline_start_step",
         ("the timeline needs all of timeline_start_step, timeline_interval_step, timeline_trace_count, "
         "timeline_path; missing: timeline_start_step, timeline_interval_step")),
        ({"timeline_start_step": 0, "timeline_interval_step": 1, "timeline_trace_count": 1, "timeline_path": "t"},
         "timeline_path", "timeline_path must be an absolute local directory or an oss:// URL, got 't'"),
        ({"timeline_start_step": 0, "timeline_interval_step": 1, "timeline_trace_count": 1,
          "timeline_path": "oss://b/t"}, "oss_endpoint",
         ("timeline_path 'oss://b/t' needs oss_endpoint, oss_access_id and oss_access_key; missing: oss_endpoint, "
         "oss_access_id, oss_access_key")),
        ({"ev_storage_type": 12}, "ev_storage_path",
         "ev_storage_type 12 (DRAM + SSD) needs ev_storage_path, the SSD tier's directory"),
        ({"pinned_version": "7"}, "pinned_version", "pinned_version needs checkpoint_dir, the parent of the versions"),
    ],
)
def test_cross_field_errors(extra: dict[str, Any], field: str, message: str) -> None:
    exc = error(extra)
    assert (exc.field, exc.message) == (field, message)


def test_cross_field_checks_also_guard_direct_construction() -> None:
    with pytest.raises(ConfigError, match="pinned_version needs checkpoint_dir"):
        ProcessorConfig(savedmodel_dir="/m", pinned_version="7")


# -- secrets -----------------------------------------------------------------------------

PASSWORD, KEY_ID, KEY = "pa55-w0rd-xyz", "AKID-123-xyz", "sk-987-xyz"


def test_secrets_never_show() -> None:
    config = parse_config({
        **BASE, "feature_store_type": "redis", "redis_url": "cache:6379", "redis_password": PASSWORD,
        "oss_access_id": KEY_ID, "oss_access_key": KEY,
    })
    shown = repr(config) + str(config) + json.dumps(config.public_dict()) + repr(config.redis_password)
    for secret in (PASSWORD, KEY_ID, KEY):
        assert secret not in shown
    assert config.public_dict()["redis_password"] == "***"
    assert config.public_dict()["oss_access_key"] == "***"
    assert "redis_password='***'" in repr(config)
    assert str(config.oss_access_id) == "***"
    assert (config.redis_password.reveal(), config.oss_access_id.reveal(), config.oss_access_key.reveal()) == (
        PASSWORD, KEY_ID, KEY,
    )
    assert parse_config(BASE).public_dict()["redis_password"] is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"redis_password": 12345678}, "redis_password must be a string, got a number"),
        ({"oss_access_key": ["sk-987-xyz"]}, "oss_access_key must be a string, got a list"),
        ({"redis_url": "redis://app:pa55-w0rd-xyz@cache:6379"},
         'redis_url must not carry a password ("redis://app:***@cache:6379"); put it in redis_password'),
        ({"redis_url": "redis://:pa55-w0rd-xyz@cache:99999"}, 'redis_url has no valid host:port: "redis://:***@cache:99999"'),
    ],
)
def test_secret_values_never_appear_in_errors(extra: dict[str, Any], message: str) -> None:
    exc = error(extra)
    assert exc.message == message
    assert "12345678" not in str(exc) and PASSWORD not in str(exc) and KEY not in str(exc)


def test_invalid_json_message_does_not_echo_the_text() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config('{"redis_password": "pa55-w0rd-xyz" "x": 1}')
    assert PASSWORD not in info.value.message

