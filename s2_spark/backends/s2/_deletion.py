"""The error of a writer whose target stream, or its basin, is being deleted (no I/O, no
pyarrow: the driver's target check and the sink both raise it)."""

from __future__ import annotations

from s2_spark.errors import DeletionPendingError, NotFoundError

__all__ = ["being_deleted"]


def being_deleted(what: str, err: NotFoundError, create_streams: bool) -> DeletionPendingError:
    """The error of a writer whose target stream (or its basin) is being deleted: what
    happened, and what to do."""
    basin_going = err.code == "basin_deletion_pending"
    gone = "its basin is being deleted" if basin_going else "it is being deleted"
    then = ("the basin must be created again, then createStreams=true creates the stream"
            if basin_going else
            "then createStreams=true creates it anew" if create_streams else
            "then create it again (or set the writer option createStreams=true)")
    return DeletionPendingError(
        f"cannot write to {what}: {gone} (S2 answered 409 {err.code}), so it can neither "
        f"be appended to nor created again until S2 has removed it. Write to another "
        f"stream, or wait until the deletion is done and run again: {then}",
        status=err.status, code=err.code,
    )
