"""Stream and basin configuration, layered as in s2-lite (`common/src/config.rs`).

A stream's configuration is *resolved*: every field has a value (the JSON S2 answers for
`GET /streams/{s}`). A basin's `default_stream_config` is a *layer*: each field may be
unset. A stream's configuration is its own layer merged over its basin's, then over
S2's defaults, field by field (`merge`). So:

* create and ensure (PUT) resolve the given config over the basin's layer: a field left
  out takes the basin's default, and an existing stream's config is *replaced* by that
  (PUT is not "create unless it exists");
* reconfigure (PATCH) keeps the fields it leaves out, resets those it sets to null
  (to the basin's default, not S2's), and sets the others; nested objects
  (`timestamping`, `delete_on_empty`, `default_stream_config`) are updated the same way.

Malformed JSON is a 400 `bad_json`; fields S2 does not know are ignored, as serde does;
a zero retention age is a 422 `invalid`. A basin's `stream_cipher` applies to the streams
it creates from then on (`encryption`).
"""

from __future__ import annotations

import json
from typing import Any

from s2_spark.testing.semantics.encryption import check_cipher
from s2_spark.testing.semantics.errors import ApiError

__all__ = [
    "CONFIG_HEADER",
    "DEFAULT_RETENTION_SECS",
    "STORAGE_CLASSES",
    "TIMESTAMPING_MODES",
    "Layer",
    "apply_basin_config",
    "basin_defaults",
    "config_from_header",
    "default_basin_config",
    "default_stream_config",
    "ensure_basin_config",
    "parse_layer",
    "reconfigure_stream_config",
    "resolve_stream_config",
]

DEFAULT_RETENTION_SECS = 7 * 24 * 3600
#: The config of a stream that an append or read creates (a basin's
#: `create_stream_on_append` / `create_stream_on_read`), as JSON; ignored when the stream
#: exists (s2 `api/src/v1/config.rs`, `StreamConfigHeader`).
CONFIG_HEADER = "s2-stream-config"
TIMESTAMPING_MODES = ("client-prefer", "client-require", "arrival")
STORAGE_CLASSES = ("standard", "express")

#: An optional stream config layer: storage_class, retention_policy, mode, uncapped,
#: min_age_secs; None = not set at this layer.
Layer = dict[str, Any]
_LAYER_KEYS = ("storage_class", "retention_policy", "mode", "uncapped", "min_age_secs")
_DEFAULTS: Layer = {
    "storage_class": "express",
    "retention_policy": {"age": DEFAULT_RETENTION_SECS},
    "mode": "client-prefer",
    "uncapped": False,
    "min_age_secs": 0,
}


def _empty() -> Layer:
    return dict.fromkeys(_LAYER_KEYS)


def default_stream_config() -> dict[str, Any]:
    """S2's defaults, resolved."""
    return _resolved(_DEFAULTS)


def default_basin_config() -> dict[str, Any]:
    """A basin created without a config, as `GET /basins/{b}` answers it."""
    return {
        "default_stream_config": None,
        "stream_cipher": None,
        "create_stream_on_append": False,
        "create_stream_on_read": False,
    }


def _bad(message: str) -> ApiError:
    return ApiError.bad("bad_json", message)


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(f"{what} must be a JSON object")
    return value


def _u64(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64:
        raise _bad(f"{what} must be an unsigned 64-bit integer")
    return value


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(f"{what} must be a boolean")
    return value


def _storage_class(value: Any) -> str:
    """Any string: s2-lite keeps a storage class as text and does not check it (s2
    `api/src/v1/config.rs`, `StreamConfig::storage_class`); S2's are `STORAGE_CLASSES`."""
    if not isinstance(value, str):
        raise _bad("storage_class must be a string")
    return value


def _retention_policy(value: Any) -> dict[str, Any]:
    value = _obj(value, "retention_policy")
    if len(value) == 1 and "age" in value:
        if _u64(value["age"], "retention_policy.age") == 0:
            raise ApiError.invalid("age must be greater than 0 seconds")
        return {"age": value["age"]}
    if len(value) == 1 and isinstance(value.get("infinite"), dict):
        return {"infinite": {}}
    raise _bad('retention_policy must be {"age": secs} or {"infinite": {}}')


def _mode(value: Any) -> str:
    if value not in TIMESTAMPING_MODES:
        raise _bad(f"timestamping.mode must be one of {list(TIMESTAMPING_MODES)}")
    return str(value)


def parse_layer(value: Any) -> Layer:
    """A StreamConfig as sent (create, ensure, a basin's default): absent or null fields
    are unset; `delete_on_empty: {}` sets min_age_secs to 0, as serde's default does."""
    layer = _empty()
    if value is None:
        return layer
    value = _obj(value, "stream config")
    if value.get("storage_class") is not None:
        layer["storage_class"] = _storage_class(value["storage_class"])
    if value.get("retention_policy") is not None:
        layer["retention_policy"] = _retention_policy(value["retention_policy"])
    if value.get("timestamping") is not None:
        ts = _obj(value["timestamping"], "timestamping")
        if ts.get("mode") is not None:
            layer["mode"] = _mode(ts["mode"])
        if ts.get("uncapped") is not None:
            layer["uncapped"] = _bool(ts["uncapped"], "timestamping.uncapped")
    if value.get("delete_on_empty") is not None:
        doe = _obj(value["delete_on_empty"], "delete_on_empty")
        age = doe.get("min_age_secs", 0)
        layer["min_age_secs"] = _u64(age, "delete_on_empty.min_age_secs")
    return layer


def _layer_json(layer: Layer) -> dict[str, Any] | None:
    """A layer as S2 answers it (`StreamConfig::to_opt`): null when nothing is set."""
    ts = None
    if layer["mode"] is not None or layer["uncapped"] is not None:
        ts = {"mode": layer["mode"], "uncapped": layer["uncapped"]}
    doe = None if layer["min_age_secs"] is None else {"min_age_secs": layer["min_age_secs"]}
    out = {
        "storage_class": layer["storage_class"],
        "retention_policy": layer["retention_policy"],
        "timestamping": ts,
        "delete_on_empty": doe,
    }
    return None if all(v is None for v in out.values()) else out


def _resolved(layer: Layer) -> dict[str, Any]:
    return {
        "storage_class": layer["storage_class"],
        "retention_policy": layer["retention_policy"],
        "timestamping": {"mode": layer["mode"], "uncapped": layer["uncapped"]},
        "delete_on_empty": {"min_age_secs": layer["min_age_secs"]},
    }


def _merge(layer: Layer, defaults: Layer) -> dict[str, Any]:
    """Stream layer over the basin's layer over S2's defaults (`OptionalStreamConfig::merge`)."""
    out = {}
    for key in _LAYER_KEYS:
        for source in (layer, defaults, _DEFAULTS):
            if source[key] is not None:
                out[key] = source[key]
                break
    return _resolved(out)


def config_from_header(headers: dict[str, str]) -> dict[str, Any] | None:
    """The StreamConfig of `s2-stream-config`, checked when the request is taken apart, as
    s2-lite does: whether or not a stream gets created, a header that is not a valid
    StreamConfig is a 400 `bad_header` naming it."""
    raw = headers.get(CONFIG_HEADER)
    if raw is None:
        return None

    def bad(why: str) -> ApiError:
        return ApiError.bad("bad_header", f"Invalid header `{CONFIG_HEADER}`: {why}")

    if any(not (" " <= c <= "~" or c == "\t") for c in raw):
        raise bad("not UTF-8")
    try:
        config = json.loads(raw)
    except ValueError as e:
        raise bad(f"invalid JSON: {e}") from e
    if not isinstance(config, dict):
        raise bad("invalid JSON: expected a StreamConfig object")
    try:
        parse_layer(config)
    except ApiError as e:
        # serde's errors are "invalid JSON"; a zero retention age is a validation's.
        message = e.body["message"]
        raise bad(message if e.body["code"] == "invalid" else f"invalid JSON: {message}") from e
    return config


def basin_defaults(basin_config: dict[str, Any]) -> Layer:
    """The layer of a basin's `default_stream_config`."""
    return parse_layer(basin_config.get("default_stream_config"))


def resolve_stream_config(config: Any, basin_config: dict[str, Any]) -> dict[str, Any]:
    """A stream's config from what create or ensure was given (None: nothing)."""
    return _merge(parse_layer(config), basin_defaults(basin_config))


def _reconfigure_layer(layer: Layer, update: Any) -> Layer:
    """A StreamReconfiguration over a layer: absent keeps, null unsets, a value sets."""
    update = _obj(update, "stream reconfiguration")
    out = dict(layer)
    if "storage_class" in update:
        v = update["storage_class"]
        out["storage_class"] = None if v is None else _storage_class(v)
    if "retention_policy" in update:
        v = update["retention_policy"]
        out["retention_policy"] = None if v is None else _retention_policy(v)
    if "timestamping" in update:
        ts = update["timestamping"]
        if ts is None:
            out["mode"] = out["uncapped"] = None
        else:
            ts = _obj(ts, "timestamping")
            if "mode" in ts:
                out["mode"] = None if ts["mode"] is None else _mode(ts["mode"])
            if "uncapped" in ts:
                v = ts["uncapped"]
                out["uncapped"] = None if v is None else _bool(v, "timestamping.uncapped")
    if "delete_on_empty" in update:
        doe = update["delete_on_empty"]
        if doe is None:
            out["min_age_secs"] = None
        elif "min_age_secs" in _obj(doe, "delete_on_empty"):
            v = doe["min_age_secs"]
            out["min_age_secs"] = None if v is None else _u64(v, "delete_on_empty.min_age_secs")
    return out


def reconfigure_stream_config(
    current: dict[str, Any], update: Any, basin_config: dict[str, Any]
) -> dict[str, Any]:
    """PATCH a stream: its resolved config as a layer, updated, merged over the basin's."""
    if update is None:
        raise _bad("request body must be a stream reconfiguration object")
    layer = {
        "storage_class": current["storage_class"],
        "retention_policy": current["retention_policy"],
        "mode": current["timestamping"]["mode"],
        "uncapped": current["timestamping"]["uncapped"],
        "min_age_secs": current["delete_on_empty"]["min_age_secs"],
    }
    return _merge(_reconfigure_layer(layer, update), basin_defaults(basin_config))


def ensure_basin_config(config: Any) -> dict[str, Any]:
    """A basin's config from what create or ensure was given: fields left out are
    S2's defaults (PUT replaces an existing basin's config with this)."""
    out = default_basin_config()
    if config is None:
        return out
    config = _obj(config, "basin config")
    out["default_stream_config"] = _layer_json(parse_layer(config.get("default_stream_config")))
    out["stream_cipher"] = check_cipher(config.get("stream_cipher"))
    for key in ("create_stream_on_append", "create_stream_on_read"):
        if key in config:
            out[key] = _bool(config[key], key)
    return out


def apply_basin_config(base: dict[str, Any], update: Any) -> dict[str, Any]:
    """PATCH a basin (`BasinConfig::reconfigure`): absent keeps, null resets, value sets;
    `default_stream_config` is reconfigured field by field."""
    if update is None:
        raise _bad("request body must be a basin reconfiguration object")
    update = _obj(update, "basin reconfiguration")
    out = dict(base)
    if "default_stream_config" in update:
        v = update["default_stream_config"]
        layer = _empty() if v is None else _reconfigure_layer(basin_defaults(base), v)
        out["default_stream_config"] = _layer_json(layer)
    if "stream_cipher" in update:
        out["stream_cipher"] = check_cipher(update["stream_cipher"])
    for key in ("create_stream_on_append", "create_stream_on_read"):
        if key in update:
            out[key] = _bool(update[key], key)
    return out
