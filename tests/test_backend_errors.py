"""Both backends raise the service-neutral errors the backend interface promises (no Spark).

The Spark layer catches `NotFoundError` for a missing stream whichever service holds it;
the Durable backend's must not be an S2 error (it used to be).
"""

from __future__ import annotations

from typing import Any

import pytest
from _s2_target import s2_config, unique_name

from s2_spark.backends.durable.backend import DurableBackend
from s2_spark.backends.durable.options import DurableSettings
from s2_spark.backends.s2 import S2Backend, S2Settings
from s2_spark.errors import DurableStreamsError, NotFoundError, S2Error, S2NotFoundError
from s2_spark.s2 import S2Client

pytestmark = pytest.mark.backend


def test_a_missing_s2_stream_raises_s2s_not_found(s2_server: Any) -> None:
    basin = unique_name("errors")
    with S2Client(s2_config(s2_server.url)) as client:
        client.create_basin(basin)
    backend = S2Backend(S2Settings(basin=basin, endpoint=s2_server.url))
    with pytest.raises(NotFoundError) as e:
        backend.latest("missing")
    assert type(e.value) is S2NotFoundError and isinstance(e.value, S2Error)
    assert e.value.status == 404


def test_a_missing_durable_stream_raises_the_neutral_not_found(ds_server: Any) -> None:
    backend = DurableBackend(DurableSettings(base_url=ds_server.url), "json")
    for lookup in (backend.latest, backend.earliest, backend.content_kind):
        with pytest.raises(NotFoundError) as e:
            lookup("/errors/missing")
        assert type(e.value) is NotFoundError, lookup
        assert not isinstance(e.value, S2Error | DurableStreamsError)
        assert e.value.status == 404
        assert str(e.value).startswith(
            "Durable Stream '/errors/missing' does not exist or is gone (")
    assert backend.latest_many(["/errors/missing"]) == {"/errors/missing": None}
