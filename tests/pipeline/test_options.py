"""Job options without Spark: times, topic filters as regular expressions, expectations, bad flags."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys

import pytest

from mqttmesh.pipeline.options import OptionError, filter_regex, parse_expectation, parse_time

UTC = dt.UTC
NOW = 1769868000.0  # 2026-01-31T14:00:00Z


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2026-01-31T12:30", dt.datetime(2026, 1, 31, 12, 30, tzinfo=UTC)),
        ("2026-01-31 12:30:15Z", dt.datetime(2026, 1, 31, 12, 30, 15, tzinfo=UTC)),
        ("2026-01-31T14:30+02:00", dt.datetime(2026, 1, 31, 12, 30, tzinfo=UTC)),
        ("1769868000", dt.datetime(2026, 1, 31, 14, 0, tzinfo=UTC)),
        ("-30m", dt.datetime(2026, 1, 31, 13, 30, tzinfo=UTC)),
        ("-2h", dt.datetime(2026, 1, 31, 12, 0, tzinfo=UTC)),
        ("-1d", dt.datetime(2026, 1, 30, 14, 0, tzinfo=UTC)),
        ("-90s", dt.datetime(2026, 1, 31, 13, 58, 30, tzinfo=UTC)),
    ],
)
def test_times(text, expected):
    assert parse_time(text, "--since", NOW) == expected


def test_a_bad_time_names_its_option():
    with pytest.raises(OptionError, match=r"^--until: 'yesterday' is not a time"):
        parse_time("yesterday", "--until", NOW)


# (filter, topic, matches) from section 4.7 of MQTT 3.1.1, by hand
CASES = [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/tennis/player1/#", "sport/tennis/player2", False),
    ("sport/#", "sport", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("#", "$SYS/broker/uptime", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/broker/uptime", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("a.b/(c)", "a.b/(c)", True),
    ("a.b/(c)", "aXb/(c)", False),
    ("x/*", "x/abc", False),
]


@pytest.mark.parametrize("topic_filter, topic, matches", CASES)
def test_filter_regex_matches_what_the_filter_matches(topic_filter, topic, matches):
    # Python's re agrees with Java's on these constructs (^ $ [^/] (?!) (...)? and escapes)
    assert bool(re.match(filter_regex(topic_filter), topic)) is matches


def test_a_bad_filter_is_refused():
    with pytest.raises(OptionError, match="is not a topic filter"):
        filter_regex("a/#/b")


def test_expectations():
    e = parse_expectation("dash=sensors/#,alarms/+@2026-01-31T12:00..-1h", NOW)
    assert (e.client_id, e.filters) == ("dash", ["sensors/#", "alarms/+"])
    assert (e.since, e.until) == (dt.datetime(2026, 1, 31, 12, tzinfo=UTC), dt.datetime(2026, 1, 31, 13, tzinfo=UTC))
    e = parse_expectation("s1=t/#", NOW)
    assert (e.since, e.until) == (None, None)
    for bad, message in [
        ("nofilter", "is not CLIENT=FILTER"),
        ("c=", "is not CLIENT=FILTER"),
        ("c=,", "names no topic filter"),
        ("c=a/#/b", "--expect c: 'a/#/b' is not a topic filter"),
        ("c=a@nope", "--expect c since: 'nope' is not a time"),
    ]:
        with pytest.raises(OptionError, match=re.escape(message)):
            parse_expectation(bad, NOW)


@pytest.mark.process
@pytest.mark.parametrize(
    "args, message",
    [
        (["traffic", "--since", "soon"], "mqttmesh analyze: --since: 'soon' is not a time"),
        (["traffic", "--since=-1h", "--until=-2h"], "--since must be before --until"),
        (["audit", "--expect", "x"], "--expect: 'x' is not CLIENT=FILTER"),
        (["payloads", "--pattern", "a/#/b"], "'a/#/b' is not a topic filter"),
        (["traffic", "--window", "0"], "--window must be at least 1"),
    ],
)
def test_bad_analyze_options_exit_2_before_spark_starts(tmp_path, args, message):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mqttmesh",
            "analyze",
            *args,
            "--archive",
            str(tmp_path),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert message in proc.stderr


@pytest.mark.process
def test_the_broker_does_not_import_the_pipeline():
    code = (
        "import sys, mqttmesh.cli, mqttmesh.server.node, mqttmesh.server.archive; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'pyarrow', 'matplotlib')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
