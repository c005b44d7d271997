"""Deprecated: the S2 client is `s2_spark.s2` (named for its service, like
`s2_spark.durable`). This path re-exports it for one release."""

import warnings

from s2_spark.s2 import *  # noqa: F403
from s2_spark.s2 import __all__ as __all__

warnings.warn(
    "s2_spark.client is deprecated and will be removed in the next release: import "
    "s2_spark.s2 instead",
    DeprecationWarning,
    stacklevel=2,
)
