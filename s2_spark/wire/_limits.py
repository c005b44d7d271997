"""S2's batch and record size limits, importable without the append encoders (which
import numpy and `pyarrow.compute`): the client's types re-export them, and a reading
interpreter imports those types."""

__all__ = ["MAX_BATCH_BYTES", "MAX_BATCH_RECORDS", "MAX_RECORD_BYTES"]

#: Records one append carries at most.
MAX_BATCH_RECORDS = 1000
#: Metered bytes one append carries at most.
MAX_BATCH_BYTES = 1024 * 1024
#: Metered bytes of one record at most.
MAX_RECORD_BYTES = 1024 * 1024
