"""Options are declared once per format: a misspelled name fails at load()/save()/start()
naming the nearest option, for both formats, readers and writers; the declaration also
parses and documents them.

The first tests need no server: every declared option, misspelled, is caught with the right
suggestion. The Spark tests then show each entry point (load, save, start, readStream)
refusing a misspelling before any task runs, Spark's own options passing, and the escape
hatch.
"""

from __future__ import annotations

import logging
import tempfile
import uuid
from typing import Any

import pytest

from s2_spark._options import Option, OptionSet
from s2_spark.errors import OptionError
from s2_spark.spark.durable.source import DURABLE_OPTIONS
from s2_spark.spark.option_docs import FORMATS, options_markdown
from s2_spark.spark.s2.source import S2_OPTIONS

SETS = [(s, role) for s in (S2_OPTIONS, DURABLE_OPTIONS) for role in ("read", "write")]


def _misspell(name: str) -> str:
    """A typo: the middle two letters swapped (startingPosition -> startingPoistion)."""
    i = len(name) // 2
    return name[: i - 1] + name[i] + name[i - 1] + name[i + 1:]


@pytest.mark.parametrize(("options", "role"), SETS,
                         ids=[f"{s.format}-{r}" for s, r in SETS])
def test_every_option_misspelled_is_refused_naming_it(options: OptionSet, role: Any) -> None:
    declared = [o for o in options.declared(role) if not o.hidden]
    assert declared
    for option in declared:
        typo = _misspell(option.name)
        if typo.lower() == option.name.lower():
            continue  # a doubled letter: swapping changes nothing
        with pytest.raises(OptionError) as info:
            options.check({typo: "1"}, role)
        message = str(info.value)
        assert message.startswith(f"option {typo}: no such option for "), message
        assert f"did you mean {option.name}?" in message, message
        assert f"format {options.format} are listed in help(" in message


def test_names_are_case_insensitive_and_spark_options_pass() -> None:
    S2_OPTIONS.check({"STARTINGPOSITION": "earliest", "basin": "b", "path": "x",
                      "checkpointLocation": "/c", "queryname": "q"}, "read")
    DURABLE_OPTIONS.check({"checkpointlocation": "/c", "MaxBytesPerAppend": "5"}, "write")


def test_an_option_of_the_other_role_is_refused() -> None:
    with pytest.raises(OptionError) as info:
        S2_OPTIONS.check({"createStreams": "true"}, "read")
    assert str(info.value).startswith(
        "option createStreams applies to writing with format s2, not to reading: remove it.")
    with pytest.raises(OptionError) as info:
        DURABLE_OPTIONS.check({"startingPosition": "earliest"}, "write")
    assert str(info.value).startswith("option startingPosition applies to reading with "
                                      "format durable-streams, not to writing")


def test_options_of_the_other_format_say_why() -> None:
    with pytest.raises(OptionError) as info:
        DURABLE_OPTIONS.check({"includeHeaders": "false"}, "read")
    assert str(info.value) == ("option includeHeaders is not supported by format "
                               "durable-streams (reading): it applies to S2 records (format "
                               "s2) only")


def test_a_name_far_from_every_option_gets_no_guess() -> None:
    with pytest.raises(OptionError) as info:
        S2_OPTIONS.check({"zzz": "1"}, "write")
    assert str(info.value).startswith("option zzz: no such option for writing with format "
                                      "s2. The options of format s2")


def test_unknown_options_warn_is_the_escape_hatch(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="s2_spark.options"):
        S2_OPTIONS.check({"unknownOptions": "warn", "futureOption": "1"}, "read")
    assert "format s2 (reading) ignores unknown options ['futureOption']" in caplog.text
    with pytest.raises(OptionError, match="option unknownOptions='ignore' is not accepted"):
        S2_OPTIONS.check({"unknownOptions": "ignore"}, "read")


def test_the_declaration_parses_defaults() -> None:
    flag = Option("someFlag", "true, false", "A flag.", default=True)
    count = Option("someCount", "a positive integer", "A count.", default=7)
    assert flag.flag({}) is True and flag.flag({"SOMEFLAG": "false"}) is False
    assert count.count({}) == 7 and count.count({"someCount": "3"}) == 3
    with pytest.raises(OptionError, match="option someCount='0' is not accepted"):
        count.count({"someCount": "0"})


def test_docs_tables_come_from_the_declaration() -> None:
    table = options_markdown("s2", "read")
    assert table.splitlines()[:2] == ["| Option | Takes | Default | What it does |",
                                      "|---|---|---|---|"]
    names = [line.split("`")[1] for line in table.splitlines()[2:]]
    assert names == [o.name for o in S2_OPTIONS.declared("read")]
    assert "| `maxStreamsPerPartition` | a positive integer | `1000` |" in table
    writer = options_markdown("durable-streams", "write")
    assert "_testFaultAfterAppends" not in writer  # hidden: a test hook
    assert "| `maxBytesPerAppend` | a positive integer | `1048576` |" in writer
    assert sorted(FORMATS) == ["durable-streams", "s2"]
    with pytest.raises(ValueError, match="no options table for format 'kafka'"):
        options_markdown("kafka", "read")


# -- through Spark: each entry point refuses before any task runs ------------------------------


@pytest.mark.spark
def test_misspelled_options_fail_at_load_save_and_start(s2_server: Any, spark: Any) -> None:
    from s2_spark.s2 import S2Client, S2Config
    basin = f"options-{uuid.uuid4().hex[:10]}"
    with S2Client(S2Config(endpoint=s2_server.url)) as client:
        client.create_basin(basin)
        client.basin(basin).create_stream("s")
    base = {"endpoint": s2_server.url, "basin": basin, "accessToken": "tok-SECRET"}
    # Spark hands a source its option names lower-cased: the message can only quote that.
    expected = "option startingpostion: no such option for reading with format s2; did you " \
               "mean startingPosition?"
    for reader in (spark.read, spark.readStream):
        with pytest.raises(Exception, match="OptionError") as info:
            reader.format("s2").options(**base, stream="s",
                                        startingPostion="earliest").load()
        assert expected in str(info.value) and "tok-SECRET" not in str(info.value)
    df = spark.createDataFrame([(b"x",)], "body binary")
    with pytest.raises(Exception, match="OptionError") as info:
        df.write.format("s2").mode("append").options(**base, stream="s",
                                                      createStream="true").save()
    assert ("option createstream: no such option for writing with format s2; did you mean "
            "createStreams?") in str(info.value)
    source = spark.readStream.format("s2").options(**base, stream="s").load()
    checkpoint = tempfile.mkdtemp(prefix="s2-options-")
    # Spark makes a stream writer in the query's thread: the query stops with the error
    # before its first micro-batch.
    query = source.writeStream.format("s2").options(**base, stream="s", maxAppendsInFlite="4") \
        .option("checkpointLocation", checkpoint).start()
    with pytest.raises(Exception, match="OptionError") as info:
        query.awaitTermination(120)
    assert "did you mean maxAppendsInFlight?" in str(info.value)
    assert query.lastProgress is None
    with S2Client(S2Config(endpoint=s2_server.url)) as client:
        assert client.basin(basin).stream("s").check_tail().seq_num == 0  # nothing written


@pytest.mark.spark
def test_durable_misspelled_options_fail_at_load_and_save(ds_server: Any, spark: Any) -> None:
    url = f"{ds_server.url}/opts/{uuid.uuid4().hex[:8]}"
    with pytest.raises(Exception, match="OptionError") as info:
        spark.read.format("durable-streams").option("url", url) \
            .option("maxRecordsPerTriger", "5").load()
    assert ("option maxrecordspertriger: no such option for reading with format "
            "durable-streams; did you mean maxRecordsPerTrigger?") in str(info.value)
    df = spark.createDataFrame([('{"a": 1}',)], "value string")
    with pytest.raises(Exception, match="OptionError") as info:
        df.write.format("durable-streams").mode("append").option("url", url) \
            .option("createStreams", "true").option("contentTyp", "application/json").save()
    assert "did you mean contentType?" in str(info.value)


def test_an_older_name_is_an_alias() -> None:
    from s2_spark.spark.durable._writer_options import MAX_MESSAGES_PER_APPEND

    assert MAX_MESSAGES_PER_APPEND.name == "maxRecordsPerAppend"  # as format s2 names it
    DURABLE_OPTIONS.check({"maxMessagesPerAppend": "5"}, "write")
    assert MAX_MESSAGES_PER_APPEND.count({"maxMessagesPerAppend": "5"}) == 5
    assert MAX_MESSAGES_PER_APPEND.count({"maxRecordsPerAppend": "6"}) == 6
    with pytest.raises(OptionError, match="option maxMessagesPerAppend='0' is not accepted"):
        MAX_MESSAGES_PER_APPEND.count({"maxMessagesPerAppend": "0"})
    with pytest.raises(OptionError, match="options maxRecordsPerAppend and "
                                          "maxMessagesPerAppend are the same option"):
        MAX_MESSAGES_PER_APPEND.count({"maxRecordsPerAppend": "6", "maxMessagesPerAppend": "5"})
    assert "older name maxMessagesPerAppend" in options_markdown("durable-streams", "write")
