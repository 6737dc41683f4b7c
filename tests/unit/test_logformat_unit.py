"""mqttmesh.cli._LogFormat: the broker's log lines, their time text made once a second, are
the standard formatter's, character for character."""

from __future__ import annotations

import logging

from mqttmesh.cli import _LogFormat

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def test_the_lines_are_the_standard_formatters():
    ours, standard = _LogFormat(FORMAT), logging.Formatter(FORMAT)
    base = 1_790_000_000.0
    for created in (base, base + 0.001, base + 0.999, base + 1.0, base + 1.5, base + 0.25, base + 86_400.123):
        record = logging.LogRecord("mqttmesh.connection", logging.INFO, "", 0, "client %r", ("c1",), None)
        record.created = created
        record.msecs = (created - int(created)) * 1000
        assert ours.format(record) == standard.format(record), created


def test_a_date_format_of_its_own_is_passed_on():
    ours, standard = _LogFormat(FORMAT, "%H:%M"), logging.Formatter(FORMAT, "%H:%M")
    record = logging.LogRecord("x", logging.WARNING, "", 0, "m", None, None)
    assert ours.format(record) == standard.format(record)
