"""Servers this project tests against but does not ship, built from their registries at a
pinned version into a cache folder (`cache_root()`), started on a free port and stopped:
one small module each, on one base (`_process`)."""

from s2_spark.testing.external._process import (
    CACHE_ENV,
    ExternalServer,
    ExternalServerError,
    Pinned,
    cache_root,
)
from s2_spark.testing.external.kafka import KAFKA, Kafka
from s2_spark.testing.external.s2_lite import S2_LITE, S2Lite

__all__ = ["CACHE_ENV", "KAFKA", "S2_LITE", "ExternalServer", "ExternalServerError", "Kafka",
           "Pinned", "S2Lite", "cache_root"]
