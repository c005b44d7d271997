"""Stream and basin configuration: S2's defaults, and (re)configurations applied to them.

A configuration is the JSON object S2 answers (`StreamConfig`, `BasinConfig`). An update
keeps the fields it leaves out, resets the ones it sets to null and sets the others,
after the checks s2-lite makes: a malformed field is a 400 `bad_json`, a zero retention
age a 422 `invalid`. A basin's `stream_cipher` applies to the streams it creates from then
on (`encryption`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from s2_spark.testing.semantics.encryption import check_cipher
from s2_spark.testing.semantics.errors import ApiError

__all__ = [
    "DEFAULT_RETENTION_SECS",
    "STORAGE_CLASSES",
    "TIMESTAMPING_MODES",
    "apply_basin_config",
    "apply_stream_config",
    "default_basin_config",
    "default_stream_config",
]

DEFAULT_RETENTION_SECS = 7 * 24 * 3600
TIMESTAMPING_MODES = ("client-prefer", "client-require", "arrival")
STORAGE_CLASSES = ("standard", "express")


def default_stream_config() -> dict[str, Any]:
    return {
        "storage_class": "express",
        "retention_policy": {"age": DEFAULT_RETENTION_SECS},
        "timestamping": {"mode": "client-prefer", "uncapped": False},
        "delete_on_empty": {"min_age_secs": 0},
    }


def default_basin_config() -> dict[str, Any]:
    return {
        "default_stream_config": default_stream_config(),
        "stream_cipher": None,
        "create_stream_on_append": False,
        "create_stream_on_read": False,
    }


def _bad_config(message: str) -> ApiError:
    return ApiError.bad("bad_json", message)


def _expect_obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad_config(f"{what} must be a JSON object")
    return value


def _storage_class(current: Any, value: Any) -> Any:
    if value in STORAGE_CLASSES:
        return value
    raise _bad_config(f"storage_class must be one of {list(STORAGE_CLASSES)}")


def _retention_policy(current: Any, value: Any) -> dict[str, Any]:
    value = _expect_obj(value, "retention_policy")
    if "age" in value and len(value) == 1:
        age = value["age"]
        if not isinstance(age, int) or isinstance(age, bool) or age < 0:
            raise _bad_config("retention_policy.age must be a non-negative integer")
        if age == 0:
            raise ApiError.invalid("age must be greater than 0 seconds")
        return {"age": age}
    if "infinite" in value and len(value) == 1:
        return {"infinite": {}}
    raise _bad_config('retention_policy must be {"age": secs} or {"infinite": {}}')


def _timestamping(current: dict[str, Any], value: Any) -> dict[str, Any]:
    """Timestamping is updated field by field: an absent `mode` or `uncapped` stays."""
    value = _expect_obj(value, "timestamping")
    for tkey, tval in value.items():
        if tkey == "mode":
            if tval is None:
                current["mode"] = "client-prefer"
            elif tval in TIMESTAMPING_MODES:
                current["mode"] = tval
            else:
                raise _bad_config(f"timestamping.mode must be one of {list(TIMESTAMPING_MODES)}")
        elif tkey == "uncapped":
            if tval is not None and not isinstance(tval, bool):
                raise _bad_config("timestamping.uncapped must be a boolean")
            current["uncapped"] = bool(tval)
        else:
            raise _bad_config(f"unknown field timestamping.{tkey}")
    return current


def _delete_on_empty(current: Any, value: Any) -> dict[str, Any]:
    value = _expect_obj(value, "delete_on_empty")
    age = value.get("min_age_secs", 0)
    if age is None:
        age = 0
    if not isinstance(age, int) or isinstance(age, bool) or age < 0:
        raise _bad_config("delete_on_empty.min_age_secs must be a non-negative integer")
    return {"min_age_secs": age}


#: Stream config field -> (its current value, a non-null update) -> its new value.
_STREAM_FIELDS: dict[str, Callable[[Any, Any], Any]] = {
    "storage_class": _storage_class,
    "retention_policy": _retention_policy,
    "timestamping": _timestamping,
    "delete_on_empty": _delete_on_empty,
}


def apply_stream_config(base: dict[str, Any], update: Any) -> dict[str, Any]:
    """Apply a StreamConfig / StreamReconfiguration: absent keeps, null resets, value sets."""
    if update is None:
        return base
    update = _expect_obj(update, "stream config")
    out: dict[str, Any] = json.loads(json.dumps(base))
    defaults = default_stream_config()
    for key, value in update.items():
        apply = _STREAM_FIELDS.get(key)
        if apply is None:
            raise _bad_config(f"unknown stream config field {key!r}")
        out[key] = defaults[key] if value is None else apply(out[key], value)
    return out


def apply_basin_config(base: dict[str, Any], update: Any) -> dict[str, Any]:
    """Apply a BasinConfig / BasinReconfiguration to `base`."""
    if update is None:
        return base
    update = _expect_obj(update, "basin config")
    out: dict[str, Any] = json.loads(json.dumps(base))
    for key, value in update.items():
        if key == "default_stream_config":
            out[key] = (
                default_stream_config() if value is None else apply_stream_config(out[key], value)
            )
        elif key in ("create_stream_on_append", "create_stream_on_read"):
            if value is not None and not isinstance(value, bool):
                raise _bad_config(f"{key} must be a boolean")
            out[key] = bool(value)
        elif key == "stream_cipher":
            out[key] = check_cipher(value)
        else:
            raise _bad_config(f"unknown basin config field {key!r}")
    return out
