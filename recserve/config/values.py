"""How each processor-config field's JSON value is read: the value kinds of DESIGN §5.

A `Kind` turns one JSON value into the typed Python value stored on `ProcessorConfig`, or
raises `ConfigError` naming the field, the value given and what is valid. Kinds follow
how DeepRec's processor reads the same field with jsoncpp: `asInt` fields take JSON
numbers only (a quoted "2" makes DeepRec abort, so it is an error here too, with a hint),
`asString` fields that hold numbers (`omp_num_threads`, `kmp_blocktime`) take either
form, and `asBool` fields take true/false or 0/1. Values of secret fields are never
repeated in a message. Stateless and thread-safe.
"""

from __future__ import annotations

import difflib
import hmac
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from recserve.errors import ConfigError

__all__ = [
    "Kind",
    "Secret",
    "boolean",
    "choice",
    "close_match",
    "cpu_groups",
    "endpoint_url",
    "gpu_ids",
    "integer",
    "number",
    "only_false",
    "path",
    "redact_url",
    "redis_url",
    "secret",
    "show",
    "text",
    "tier_sizes",
]


class Secret:
    """A credential. Prints as ``***`` everywhere; `reveal()` is the only way to the text.
    Immutable and thread-safe."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "'***'"

    def __str__(self) -> str:
        return "***"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and hmac.compare_digest(self._value, other._value)

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class Kind:
    """How one field's JSON value is read. `type_name` and `values` feed docs/config.md."""

    type_name: str
    values: str
    read: Callable[[str, Any], Any]


def show(value: Any) -> str:
    """A JSON value as the user wrote it, for messages."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def close_match(word: str, choices: Sequence[str]) -> str | None:
    """The valid name `word` was most likely meant to be, if any is close."""
    lowered = {c.lower(): c for c in choices}
    if word.lower() in lowered:
        return lowered[word.lower()]
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.75)
    return found[0] if found else None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    return "an object"


def _wrong_type(name: str, expected: str, value: Any) -> ConfigError:
    return ConfigError(f"{name} must be {expected}, got {_json_type(value)} {show(value)}", field=name)


def _as_int(name: str, value: Any, expected: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        error = _wrong_type(name, expected, value)
        if isinstance(value, str) and _is_int_text(value):
            # DeepRec reads this field with jsoncpp's asInt(), which rejects strings.
            error = ConfigError(f"{error.message}; write {value.strip()} without quotes", field=name)
        raise error
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise _wrong_type(name, expected, value)
        return int(value)
    return value


def _is_int_text(value: str) -> bool:
    text = value.strip()
    return text.lstrip("-").isdigit() and text.count("-") <= 1 and not text.endswith("-")


def _range_text(minimum: int | None, maximum: int | None, also: Sequence[int]) -> str:
    if minimum is not None and maximum is not None:
        text = f"{minimum}..{maximum}"
    elif minimum is not None:
        text = f">= {minimum}"
    elif maximum is not None:
        text = f"<= {maximum}"
    else:
        text = "any"
    return " or ".join([str(a) for a in also] + [text])


def integer(
    minimum: int | None = None,
    maximum: int | None = None,
    *,
    also: Sequence[int] = (),
    numeric_string: bool = False,
) -> Kind:
    """A JSON integer in [minimum, maximum] or one of `also`. With `numeric_string`, a
    string of digits is accepted too (fields DeepRec reads with asString)."""
    values = _range_text(minimum, maximum, also)

    def read(name: str, value: Any) -> int:
        if numeric_string and isinstance(value, str) and _is_int_text(value):
            value = int(value.strip())
        expected = "an integer or a string of digits" if numeric_string else "an integer"
        number_ = _as_int(name, value, expected)
        if number_ in also:
            return number_
        if (minimum is not None and number_ < minimum) or (maximum is not None and number_ > maximum):
            raise ConfigError(f"{name} must be {values}, got {show(value)}", field=name)
        return number_

    return Kind("int or digit string" if numeric_string else "int", values, read)


def number(*, above: float) -> Kind:
    """A finite JSON number strictly greater than `above`."""

    def read(name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _wrong_type(name, "a number", value)
        if value <= above:
            raise ConfigError(f"{name} must be > {above:g}, got {show(value)}", field=name)
        return float(value)

    return Kind("number", f"> {above:g}", read)


def boolean() -> Kind:
    def read(name: str, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise _wrong_type(name, "true or false", value)

    return Kind("bool", "true, false (or 1, 0)", read)


def boolean_or_auto() -> Kind:
    """true, false (or 1, 0), or "auto": recserve decides (the field's help says how)."""
    base = boolean()

    def read(name: str, value: Any) -> bool | str:
        if value == "auto" and isinstance(value, str):
            return "auto"
        if isinstance(value, str):
            hint = close_match(value, ["auto", "true", "false"])
            message = f'{name} must be true, false or "auto", got {show(value)}'
            if hint == "auto":
                message += '; did you mean "auto"?'
            elif hint is not None:
                message += f" (a JSON boolean, not a string); did you mean {hint}?"
            raise ConfigError(message, field=name)
        try:
            return base.read(name, value)
        except ConfigError:
            raise _wrong_type(name, 'true, false or "auto"', value) from None

    return Kind("bool or string", 'true, false (or 1, 0), "auto"', read)


def only_false(reason: str) -> Kind:
    """A bool recserve accepts only as false; true is refused with `reason`."""
    base = boolean()

    def read(name: str, value: Any) -> bool:
        if base.read(name, value):
            raise ConfigError(f"{name} true is not supported: {reason}", field=name)
        return False

    return Kind("bool", "false", read)


def text(*, non_empty: bool = True, values: str = "non-empty string") -> Kind:
    def read(name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise _wrong_type(name, "a string", value)
        if non_empty and not value.strip():
            raise ConfigError(f"{name} must not be empty", field=name)
        return value

    return Kind("string", values, read)


def path() -> Kind:
    return text(values="local path, or oss://, s3://, hdfs:// URL")


def choice(*choices: str | int) -> Kind:
    """One of `choices`, compared exactly (DeepRec compares case-sensitively)."""
    listed = ", ".join(show(c) for c in choices)
    is_int = isinstance(choices[0], int)

    def read(name: str, value: Any) -> Any:
        if is_int:
            got: Any = _as_int(name, value, "an integer")
        elif isinstance(value, str):
            got = value
        else:
            raise _wrong_type(name, "a string", value)
        if got in choices:
            return got
        message = f"{name} must be one of {listed}, got {show(value)}"
        hint = close_match(got, [str(c) for c in choices]) if isinstance(got, str) else None
        if hint is not None:
            message += f"; did you mean {show(hint)}?"
        raise ConfigError(message, field=name)

    return Kind("int" if is_int else "string", listed, read)


def secret() -> Kind:
    def read(name: str, value: Any) -> Secret:
        if not isinstance(value, str):
            # The value is never repeated: it may be the credential itself.
            raise ConfigError(f"{name} must be a string, got {_json_type(value)}", field=name)
        return Secret(value)

    return Kind("string (secret)", "any string; never shown", read)


def _cpu_ids(name: str, group: str, whole: str) -> tuple[int, ...]:
    cpus: set[int] = set()
    for item in group.split(","):
        first, dash, last = item.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ConfigError(
                f"{name} group {show(group)} in {show(whole)} is not a CPU list like '0-3' or '0,1,2,3'",
                field=name,
            )
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise ConfigError(f"{name} range {item.strip()!r} in {show(whole)} runs backwards", field=name)
        cpus.update(range(low, high + 1))
    return tuple(sorted(cpus))


def cpu_groups() -> Kind:
    """DeepRec's session cpusets: "0-3;4-7" or "0,1;2,3", one group per session."""

    def read(name: str, value: Any) -> tuple[tuple[int, ...], ...]:
        if not isinstance(value, str):
            raise _wrong_type(name, "a string like \"0-3;4-7\"", value)
        if not value.strip():
            return ()
        return tuple(_cpu_ids(name, group, value) for group in value.strip().strip(";").split(";"))

    return Kind("string", "CPU groups, ';' between sessions: \"0-3;4-7\" or \"0,1;2,3\"", read)


def gpu_ids() -> Kind:
    """DeepRec's gpu_ids_list "0,2"; a JSON list [0, 2] is accepted too."""

    def read(name: str, value: Any) -> tuple[int, ...]:
        if isinstance(value, str):
            items: list[Any] = [v.strip() for v in value.split(",") if v.strip()]
            if not all(v.isdigit() for v in items):
                raise ConfigError(f"{name} must list GPU numbers like \"0,2\", got {show(value)}", field=name)
            items = [int(v) for v in items]
        elif isinstance(value, list):
            items = [_as_int(name, v, "a list of GPU numbers") for v in value]
        else:
            raise _wrong_type(name, "a string like \"0,2\"", value)
        if any(i < 0 for i in items) or len(set(items)) != len(items):
            raise ConfigError(f"{name} must list distinct GPU numbers >= 0, got {show(value)}", field=name)
        return tuple(items)

    return Kind("string or list[int]", "\"0,2\" or [0, 2]", read)


def tier_sizes() -> Kind:
    def read(name: str, value: Any) -> tuple[int, ...]:
        if not isinstance(value, list) or not 1 <= len(value) <= 4:
            raise _wrong_type(name, "a list of 1 to 4 sizes in bytes", value)
        sizes = tuple(_as_int(name, v, "a list of sizes in bytes") for v in value)
        if any(s < 1 for s in sizes):
            raise ConfigError(f"{name} sizes must be >= 1 byte, got {show(value)}", field=name)
        return sizes

    return Kind("list[int]", "1 to 4 sizes in bytes", read)


def redact_url(url: str) -> str:
    """`url` with any password replaced by ***, for messages."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    userinfo, _, host = rest.split("/", 1)[0].rpartition("@")
    user = userinfo.split(":", 1)[0]
    tail = rest[len(rest.split("/", 1)[0]) :]
    return f"{scheme}://{user}:***@{host}{tail}" if ":" in userinfo else url


def redis_urls(value: str) -> list[str]:
    """The node URLs of a normalized redis_url (several, comma-separated, for a cluster)."""
    return value.split(",")


def redis_url() -> Kind:
    """DeepRec's "host:port", or a redis:// / rediss:// URL, normalized to a URL; several
    comma-separated (Redis Cluster seed nodes) normalize to comma-separated URLs."""

    def read(name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise _wrong_type(name, "a string like \"host:6379\"", value)
        if not value.strip():
            raise ConfigError(f"{name} is empty; give \"host:port\" or \"redis://host:port\"", field=name)
        return ",".join(_one_redis_url(name, part) for part in value.split(","))

    return Kind("string", "\"host:port\", redis://host:port[/db], rediss://…; several comma-separated for a cluster",
                read)


def _one_redis_url(name: str, value: str) -> str:
    url = value.strip()
    shown = show(redact_url(url))
    if "://" not in url:
        host, colon, port = url.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                f"{name} must be \"host:port\", \"redis://host:port\" or \"rediss://host:port\", "
                f"got {shown}",
                field=name,
            )
        return f"redis://{host}:{port}"
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ConfigError(f"{name} must use redis:// or rediss://, got {shown}", field=name)
    try:
        port_ = parts.port
    except ValueError:
        port_ = -1
    if not parts.hostname or (port_ is not None and not 0 < port_ < 65536):
        raise ConfigError(f"{name} has no valid host:port: {shown}", field=name)
    if parts.password is not None:
        raise ConfigError(f"{name} must not carry a password ({shown}); put it in redis_password", field=name)
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ConfigError(f"{name} database must be a number like /0, got {shown}", field=name)
    return url


def endpoint_url() -> Kind:
    """An OSS/S3 endpoint: a bare host (https assumed, as OSS endpoints are written) or URL."""

    def read(name: str, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise _wrong_type(name, "a host like \"oss-cn-beijing.aliyuncs.com\" or an http(s):// URL", value)
        url = value.strip()
        if "://" not in url:
            url = "https://" + url
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{name} must be a host or an http(s):// URL, got {show(value)}", field=name)
        return url.rstrip("/")

    return Kind("string", "host (https assumed) or http(s):// URL", read)
