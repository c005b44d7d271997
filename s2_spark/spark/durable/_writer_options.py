"""Check the `durable-streams` writer's options and input columns on the driver.

Connection options are the reader's (`baseUrl`, `bearerToken`, `secretHeaders`). The target
is option `url` (an absolute stream URL) or `stream` (a path under `baseUrl`, or a URL), or
else a `url` / `stream` column per row. The message of each row is column `value` or
`body`; the reader's own columns (`stream`, `offset`, `index`, `value`) are accepted as they
are (`offset` and `index` are ignored), so a read can be written back unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark.sql.types import BinaryType, StringType, StructType

from s2_spark._options import Option
from s2_spark.backends.durable.options import (
    DurableSettings,
    check_stream_urls,
    parse_durable_connection,
)
from s2_spark.backends.durable.sink import DurableInputLayout
from s2_spark.backends.durable.stream_sink import DEFAULT_CONTENT_TYPE, Payload, SinkSettings
from s2_spark.errors import OptionError
from s2_spark.spark._write_common import TEST_FAULT, column_type_error, input_columns

__all__ = [
    "ACCEPTED_COLUMNS",
    "DURABLE_WRITE_OPTIONS",
    "DurableInputLayout",
    "DurableWriteOptions",
    "check_durable_input",
    "parse_durable_write_options",
]

ACCEPTED_COLUMNS = (
    "value or body (the message: for JSON streams one JSON value's text per row, value a "
    "string, body a string or binary; for other content types the bytes, string or binary), "
    "stream (string: a path under option baseUrl or a stream URL) or url (string: a stream "
    "URL), which route each row unless option url/stream is set, "
    "offset and index (ignored, so the reader's rows can be written as they are)"
)
_IGNORED = ("offset", "index")
_DEFAULTS = SinkSettings()

TARGET_URL = Option(
    "url", "an http:// or https:// stream URL",
    "The target of every row (overrides the url/stream columns); it must exist (or be "
    "created), be open and take the message column, checked before any task runs.",
    roles=("write",))
TARGET_PATH = Option(
    "stream", "a path under baseUrl, or a URL", "The target of every row, like url.",
    roles=("write",))
CREATE_STREAMS = Option(
    "createStreams", "true, false", "Create missing targets, with contentType.",
    default=False, roles=("write",))
CONTENT_TYPE = Option(
    "contentType", "a media type",
    "The content type of streams the writer creates (only with createStreams=true).",
    default=DEFAULT_CONTENT_TYPE, roles=("write",))
CLOSE_STREAM_ON_FINISH = Option(
    "closeStreamOnFinish", "true, false",
    "df.write only: close every stream the job wrote once the job commits.",
    default=False, roles=("write",))
MAX_MESSAGES_PER_APPEND = Option(
    "maxRecordsPerAppend", "a positive integer",
    "Messages (rows) per append request, named as format s2 names it; keep it unchanged "
    "across restarts of a query.",
    default=_DEFAULTS.max_messages, roles=("write",), aliases=("maxMessagesPerAppend",))
MAX_BYTES_PER_APPEND = Option(
    "maxBytesPerAppend", "a positive integer",
    "Bytes per append request (a larger row goes alone); keep it unchanged across "
    "restarts of a query.", default=_DEFAULTS.max_bytes, roles=("write",))
#: The options only the `durable-streams` writer takes (the connection options are shared).
DURABLE_WRITE_OPTIONS = (TARGET_URL, TARGET_PATH, CREATE_STREAMS, CONTENT_TYPE,
                         CLOSE_STREAM_ON_FINISH, MAX_MESSAGES_PER_APPEND, MAX_BYTES_PER_APPEND,
                         TEST_FAULT)
_CONTENT_TYPE = re.compile(r"^[A-Za-z0-9!#$&^_.+-]+/[A-Za-z0-9!#$&^_.+-]+(\s*;.*)?$")


@dataclass(frozen=True, slots=True)
class DurableWriteOptions:
    """The writer's options, checked. Credentials never appear in repr."""

    settings: DurableSettings
    target: str | None  # the option url or stream, as given
    target_option: str | None  # which of the two
    sink: SinkSettings
    close_on_finish: bool
    test_fault: str | None = field(default=None, repr=False)

    def target_url(self) -> str | None:
        return None if self.target is None else self.settings.config().stream_url(self.target)


def parse_durable_write_options(
    options: Mapping[str, str], *, streaming: bool
) -> DurableWriteOptions:
    """Check every writer option; raise `OptionError` for the first bad one."""
    settings = parse_durable_connection(options)
    target, target_option = _target(options, settings)
    create = CREATE_STREAMS.flag(options)
    content_type = _content_type(options, create)
    close = CLOSE_STREAM_ON_FINISH.flag(options)
    if close and streaming:
        raise OptionError(
            "option closeStreamOnFinish=true applies to batch writes (df.write) only: a "
            "streaming query never finishes writing. Close the streams yourself after "
            "stopping the query, or write them with df.write"
        )
    sink = SinkSettings(
        create_streams=create,
        content_type=content_type or DEFAULT_CONTENT_TYPE,
        max_messages=MAX_MESSAGES_PER_APPEND.amount(options),
        max_bytes=MAX_BYTES_PER_APPEND.amount(options),
    )
    return DurableWriteOptions(
        settings=settings,
        target=target,
        target_option=target_option,
        sink=sink,
        close_on_finish=close,
        test_fault=TEST_FAULT.raw(options),
    )


def _target(options: Mapping[str, str], settings: DurableSettings
            ) -> tuple[str | None, str | None]:
    """The fixed target as given (option url or stream) and which option gave it."""
    given = [o for o in (TARGET_URL, TARGET_PATH) if o.raw(options) is not None]
    if len(given) > 1:
        raise OptionError(
            "set option url (a stream URL) or option stream (a path under baseUrl), not both"
        )
    if not given:
        return None, None
    target_option = given[0].name
    raw = given[0].raw(options) or ""
    target = raw.strip()
    if not target:
        raise OptionError(f"option {target_option}={raw!r} is not accepted: it is empty")
    absolute = target.startswith(("http://", "https://"))
    if target_option == "url" or absolute:
        check_stream_urls((target,), target_option)
    elif settings.base_url is None:
        raise OptionError(
            f"option stream={target!r} is a path, which needs option baseUrl (the "
            "server's URL); or name the stream by URL with option url"
        )
    return target, target_option


def _content_type(options: Mapping[str, str], create: bool) -> str | None:
    """Option contentType, checked (it only applies to streams the writer creates)."""
    content_type = CONTENT_TYPE.raw(options)
    if content_type is None:
        return None
    content_type = content_type.strip()
    if not _CONTENT_TYPE.match(content_type) or any(c in content_type for c in "\r\n"):
        raise OptionError(
            f"option contentType={content_type!r} is not accepted: use a media type such "
            f"as {DEFAULT_CONTENT_TYPE} (one JSON message per row) or "
            "application/octet-stream (bytes)"
        )
    if not create:
        raise OptionError(
            "option contentType is the content type of streams the writer creates: it "
            "needs createStreams=true (an existing stream keeps its own content type)"
        )
    return content_type


def _bad_type(column: str, type_name: str, accepted: str) -> OptionError:
    return column_type_error("durable-streams", column, type_name, accepted, ACCEPTED_COLUMNS)


def check_durable_input(schema: StructType, options: DurableWriteOptions) -> DurableInputLayout:
    """Map the input columns, or raise naming the offending column and the accepted ones."""
    found = input_columns(schema, "durable-streams", ("value", "body", "stream", "url",
                                                      *_IGNORED), ACCEPTED_COLUMNS)
    payloads = [k for k in ("value", "body") if k in found]
    if len(payloads) != 1:
        have = ", ".join(schema.fieldNames()) or "none"
        raise OptionError(
            ("the input has both columns value and body" if payloads else
             f"the input has no column value or body (columns: {have})")
            + f": format durable-streams takes exactly one. Accepted columns: {ACCEPTED_COLUMNS}"
        )
    column = payloads[0]
    ptype = schema.fields[found[column]].dataType
    if not isinstance(ptype, StringType | BinaryType):
        raise _bad_type(column, ptype.simpleString(), "string or binary")
    for key in ("stream", "url"):
        if key in found:
            rtype = schema.fields[found[key]].dataType
            if not isinstance(rtype, StringType):
                raise _bad_type(key, rtype.simpleString(), "string")
    route: int | None = None
    route_column = "stream"
    if options.target is None:
        routes = [k for k in ("stream", "url") if k in found]
        if not routes:
            raise OptionError(
                "no target stream: set option url (a stream URL) or stream (a path under "
                "baseUrl), or give the rows a string column url or stream"
            )
        if len(routes) > 1:
            raise OptionError(
                "the input has both columns stream and url: route rows with one of them (or "
                "set option url / stream, which overrides both)"
            )
        route_column = routes[0]
        route = found[route_column]
    kind = Payload("value" if column == "value" else "body", isinstance(ptype, StringType))
    return DurableInputLayout(
        payload=found[column],
        kind=kind,
        route=route,
        route_column=route_column,
        names=tuple(schema.fieldNames()),
    )
