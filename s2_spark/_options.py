"""Each option declared once, and read through its declaration (no pyspark, no protocol).

A format's options are `Option`s gathered in an `OptionSet`. Spark hands a data source its
options as a case-insensitive map of strings; an `Option` reads its own value out of it
(`raw`, `flag`, `count`, `duration_ms`, `url`, `streams`), raising `OptionError` naming the
option and what it accepts. The declaration also drives the check that fails a name the
format does not declare (Spark passes every option through, so a misspelled one would be
ignored and the query run with the default: a backlog skipped, a limit not applied), and
the options tables of the docs (`OptionSet.markdown`), so the three cannot drift.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from s2_spark.errors import OptionError

__all__ = ["SPARK_OPTIONS", "UNKNOWN_OPTIONS", "Option", "OptionSet", "Role", "split_streams"]

log = logging.getLogger("s2_spark.options")

Role = Literal["read", "write"]
_ROLE_NAMES: dict[Role, str] = {"read": "reading", "write": "writing"}

#: Options Spark itself passes to every source and sink (`load(path)`, `save(path)`,
#: `start(path)`, `checkpointLocation`, `queryName`): accepted, never used.
SPARK_OPTIONS = frozenset({"path", "paths", "checkpointlocation", "queryname"})


@dataclass(frozen=True, slots=True)
class Option:
    """One option: `takes` says what a value may be, `default` is what an unset option
    means (None: unset means nothing, or the `doc` says), `hidden` ones are accepted but
    left out of the docs (test hooks), `aliases` are older names still accepted."""

    name: str
    takes: str
    doc: str
    default: object = None
    roles: tuple[Role, ...] = ("read", "write")
    hidden: bool = False
    aliases: tuple[str, ...] = ()

    def given_as(self, options: Mapping[str, str]) -> str:
        """The name the option was given under: its own, or one of its aliases."""
        given = [n for n in (self.name, *self.aliases) if _get(options, n) is not None]
        if len(given) > 1:
            raise OptionError(f"options {' and '.join(given)} are the same option: set one")
        return given[0] if given else self.name

    def raw(self, options: Mapping[str, str]) -> str | None:
        """The value as given (Spark's option names are case-insensitive)."""
        return _get(options, self.given_as(options))

    def flag(self, options: Mapping[str, str]) -> bool:
        """A `true`/`false` option; the declared default when unset."""
        return _bool(options, self.given_as(options), bool(self.default))

    def count(self, options: Mapping[str, str]) -> int | None:
        """A positive integer; the declared default (an int, or None) when unset."""
        value = _positive_int(options, self.given_as(options))
        if value is None and isinstance(self.default, int):
            return self.default
        return value

    def duration_ms(self, options: Mapping[str, str]) -> int | None:
        """A positive duration such as `15m`, `30s`, `500ms` or `60000` (milliseconds), in
        milliseconds; None when unset."""
        return _duration_ms(options, self.given_as(options))

    def url(self, options: Mapping[str, str]) -> str | None:
        """An http:// or https:// URL; None when unset."""
        return _url(options, self.given_as(options))

    def streams(self, options: Mapping[str, str]) -> tuple[str, ...] | None:
        """Comma-separated distinct, non-empty names (or URLs, or paths); None when unset."""
        raw = self.raw(options)
        return None if raw is None else split_streams(raw, self.given_as(options))

    def described(self) -> str:
        """The doc line, naming the older names still accepted."""
        if not self.aliases:
            return self.doc
        return f"{self.doc} Also accepted under its older name {', '.join(self.aliases)}."

    def amount(self, options: Mapping[str, str]) -> int:
        """`count` for an option declared with an int default: never None."""
        value = self.count(options)
        if value is None:
            raise TypeError(f"option {self.name} is declared without a default")
        return value

    def shown_default(self) -> str:
        if self.default is None:
            return ""
        if isinstance(self.default, bool):
            return "true" if self.default else "false"
        return str(self.default)


#: The escape hatch: `unknownOptions=warn` logs names this version does not know instead
#: of failing, for a pipeline shared with a newer version of the connector.
UNKNOWN_OPTIONS = Option(
    "unknownOptions", "error, warn",
    "What an option name this format does not know does: fail before any work starts, or "
    "log a warning and go on (for options of a newer version of the connector).",
    default="error",
)


@dataclass(frozen=True, slots=True)
class OptionSet:
    """Every option of one format. `refused` names options declared elsewhere that this
    format or role rejects, each with the reason shown (say, an S2-only read option given
    to format durable-streams)."""

    format: str
    options: tuple[Option, ...]
    refused: tuple[tuple[Role, str, str], ...] = ()
    documented_in: str = ""
    _by_role: dict[Role, dict[str, Option]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_role: dict[Role, dict[str, Option]] = {"read": {}, "write": {}}
        for option in (*self.options, UNKNOWN_OPTIONS):
            for role in option.roles:
                for name in (option.name, *option.aliases):
                    by_role[role].setdefault(name.lower(), option)
        object.__setattr__(self, "_by_role", by_role)

    def declared(self, role: Role) -> list[Option]:
        return list(dict.fromkeys(self._by_role[role].values()))

    def check(self, options: Mapping[str, str], role: Role) -> None:
        """Fail the first option this format does not take for `role`, naming the nearest
        one it does; with `unknownOptions=warn`, log the unknown ones instead."""
        mode = (UNKNOWN_OPTIONS.raw(options) or "error").strip().lower()
        if mode not in ("error", "warn"):
            raise OptionError(f"option unknownOptions={mode!r} is not accepted: use "
                              "'error' (the default) or 'warn'")
        known = self._by_role[role]
        unknown: list[str] = []
        for key in options:
            lowered = key.lower()
            if lowered in known or lowered in SPARK_OPTIONS:
                continue
            for refused_role, name, reason in self.refused:
                if refused_role == role and name.lower() == lowered:
                    raise OptionError(f"option {name} is not supported by format "
                                      f"{self.format} ({_ROLE_NAMES[role]}): {reason}")
            other: Role = "write" if role == "read" else "read"
            if lowered in self._by_role[other]:
                name = self._by_role[other][lowered].name
                raise OptionError(
                    f"option {name} applies to {_ROLE_NAMES[other]} with format "
                    f"{self.format}, not to {_ROLE_NAMES[role]}: remove it. "
                    f"{self._where()}")
            unknown.append(key)
        if not unknown:
            return
        if mode == "warn":
            log.warning("format %s (%s) ignores unknown options %s (unknownOptions=warn). %s",
                        self.format, _ROLE_NAMES[role], sorted(unknown), self._where())
            return
        raise OptionError(f"{self._unknown(unknown[0], role)} {self._where()}")

    def _unknown(self, key: str, role: Role) -> str:
        known = self._by_role[role]
        import difflib  # for a name nobody declared: not on every check's path

        near = difflib.get_close_matches(key.lower(), list(known), n=1, cutoff=0.6)
        hint = f"; did you mean {known[near[0]].name}?" if near else "."
        return (f"option {key}: no such option for {_ROLE_NAMES[role]} with format "
                f"{self.format}{hint}")

    def _where(self) -> str:
        return (f"The options of format {self.format} are listed in {self.documented_in}; "
                "unknownOptions=warn lets a query run with options this version does not "
                "know.")

    def markdown(self, role: Role, names: list[str] | None = None) -> str:
        """The options table of the docs for `role`, in declaration order; or only the
        options `names`, in that order (a name the format does not take is an error)."""
        rows = ["| Option | Takes | Default | What it does |", "|---|---|---|---|"]
        for option in self._shown(role, names):
            default = option.shown_default()
            rows.append(
                f"| `{option.name}` | {_cell(option.takes)} | "
                f"{f'`{default}`' if default else ''} | {_cell(option.described())} |"
            )
        return "\n".join(rows) + "\n"

    def _shown(self, role: Role, names: list[str] | None) -> list[Option]:
        if names is None:
            return [o for o in self.declared(role) if not o.hidden]
        known = self._by_role[role]
        missing = [n for n in names if n.lower() not in known]
        if missing:
            raise ValueError(f"format {self.format} has no {role} option {missing}")
        return [known[n.lower()] for n in names]

    def bullets(self, role: Role) -> str:
        """The same as plain-text bullets, for `help()` on a data source class."""
        lines = []
        for option in self.declared(role):
            if not option.hidden:
                default = option.shown_default()
                shown = f"; default {default}" if default else ""
                lines.append(f"* {option.name} ({option.takes}{shown}): {option.described()}")
        return "\n".join(lines)


def _cell(text: str) -> str:
    """Text in a Markdown table cell: pipes escaped, and `<...>` kept from reading as HTML."""
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("|", "\\|").replace("\n", " "))


# -- values out of Spark's option map ----------------------------------------------------

#: Milliseconds per unit of a duration option (Spark's time strings, as Kafka's
#: maxTriggerDelay takes them); a number without a unit is milliseconds.
_DURATION_UNITS = {"": 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
                   "d": 86_400_000}
_DURATION = re.compile(r"(\d+)\s*([a-z]*)")


def _get(options: Mapping[str, str], name: str) -> str | None:
    """Look an option up case-insensitively (Spark's map already is; plain dicts too)."""
    if name in options:
        return options[name]
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return value
    return None


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in ("true", "false"):
        return value == "true"
    raise OptionError(f"option {name}={raw!r} is not accepted: use 'true' or 'false'")


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = _get(options, name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise OptionError(f"option {name}={raw!r} is not accepted: use a positive integer")
    return value


def _duration_ms(options: Mapping[str, str], name: str) -> int | None:
    """A positive duration such as `15m`, `30s`, `500ms` or `60000` (milliseconds), in
    milliseconds."""
    raw = _get(options, name)
    if raw is None:
        return None
    match = _DURATION.fullmatch(raw.strip().lower())
    if match is None or match.group(2) not in _DURATION_UNITS or int(match.group(1)) == 0:
        raise OptionError(
            f"option {name}={raw!r} is not accepted: use a positive duration such as '15m', "
            "'30s' or '500ms' (units ms, s, m or min, h, d; a number alone is milliseconds)"
        )
    return int(match.group(1)) * _DURATION_UNITS[match.group(2)]


def _url(options: Mapping[str, str], name: str) -> str | None:
    raw = _get(options, name)
    if raw is None:
        return None
    value = raw.strip()
    if not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
        raise OptionError(
            f"option {name}={raw!r} is not accepted: use an http:// or https:// URL"
        )
    return value


def split_streams(raw: str, name: str) -> tuple[str, ...]:
    """A comma-separated list of distinct, non-empty stream names (or URLs, or paths)."""
    names = [s.strip() for s in raw.split(",")]
    if any(not n for n in names):
        raise OptionError(
            f"option {name}={raw!r} is not accepted: use comma-separated stream names "
            "(names must not be empty)"
        )
    if len(set(names)) != len(names):
        raise OptionError(f"option {name}={raw!r} names a stream more than once")
    return tuple(names)
