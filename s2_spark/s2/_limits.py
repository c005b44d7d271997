"""Limits of S2 that callers size themselves by, importable without the client (the Spark
writer's options and the sink's settings are checked against them on the driver)."""

__all__ = ["MAX_INPUTS_PER_SESSION", "MAX_TOKEN_BYTES"]

#: Inputs (appends) one S2S append session carries; more are sent in another session.
MAX_INPUTS_PER_SESSION = 256
#: Bytes of a fencing token (and so of the sink's fence records' bodies).
MAX_TOKEN_BYTES = 36
