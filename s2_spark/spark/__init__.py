"""Spark layer: the `s2` data source (pyspark's Python Data Source API).

Register it with ``spark.dataSource.register(S2DataSource)``; installing s2-spark also
registers it automatically through the top-level module ``pyspark_s2``.
"""

from s2_spark.spark.options import OptionError
from s2_spark.spark.source import S2DataSource, read_schema

__all__ = ["OptionError", "S2DataSource", "read_schema"]
