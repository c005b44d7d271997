"""Tail watches' engine, apart from either service: keep a long-poll outstanding per
watched stream and track which streams are quiet (`LongPollWatch`), over HTTP/2 shared
connections or HTTP/1.1 ones per stream (`PollConnections`). `s2_spark.s2._watch` and
`s2_spark.durable._watch` say how to long-poll one stream of their service."""

from s2_spark._long_poll._connections import CONNECTS_AT_ONCE, ClientSettings, PollConnections
from s2_spark._long_poll._limits import FD_RESERVE, raise_open_files_limit, watch_limit
from s2_spark._long_poll._watch import Answer, LongPollWatch, News, Pause, Poll, jittered_wait

__all__ = [
    "CONNECTS_AT_ONCE",
    "FD_RESERVE",
    "Answer",
    "ClientSettings",
    "LongPollWatch",
    "News",
    "Pause",
    "Poll",
    "PollConnections",
    "jittered_wait",
    "raise_open_files_limit",
    "watch_limit",
]
