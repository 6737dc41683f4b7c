"""The report's parts that need no Spark: which payload fields are measurements, and charts
in which every series shows where lines coincide."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from mqttmesh.pipeline.payloads import measurements
from mqttmesh.pipeline.report import line_chart

T0 = dt.datetime(2026, 2, 1, 12, 0, tzinfo=dt.UTC)


def _sample(rows):
    """(topic, time, text) rows as payloads.sample_payloads gives them."""
    return [(topic, T0 + dt.timedelta(seconds=i), json.dumps(obj)) for i, (topic, obj) in enumerate(rows)]


def test_counters_and_identifiers_are_not_measurements():
    rows = []
    for n in range(1, 6):
        for dev in range(3):
            rows.append(
                (
                    f"s/dev-{dev}",
                    {
                        "temperature": 20.0 + (n * 7 + dev) % 5 / 2,  # a float: measured
                        "rssi": -60 - (n * 3 + dev) % 4,  # an integer that moves both ways: measured
                        "battery": 90 - dev,  # one value per device in the sample: measured
                        "seq": n,  # rises on every message of a topic: a counter
                        "uptime": 100 * n + dev,  # a counter too, whatever its name
                        "device_id": dev,  # by name
                        "meta": {"ts": 1700000000 + n},  # by name, nested
                    },
                )
            )
    kept, left_out = measurements(
        [("temperature",), ("rssi",), ("battery",), ("seq",), ("uptime",), ("device_id",), ("meta", "ts")],
        _sample(rows),
    )
    assert kept == [("temperature",), ("rssi",), ("battery",)]
    assert left_out == {
        "seq": "an identifier or counter by its name",
        "device_id": "an identifier or counter by its name",
        "meta.ts": "an identifier or counter by its name",
        "uptime": "a counter: it rises on every message of a topic",
    }


def test_a_field_that_rises_on_one_topic_only_is_measured():
    rows = [("a", {"level": n}) for n in range(5)] + [(t, {"level": v}) for t in "bc" for v in (3, 1, 2, 5)]
    assert measurements([("level",)], _sample(rows)) == ([("level",)], {})


def test_without_a_sample_names_decide():
    assert measurements([("id",), ("v",)], []) == ([("v",)], {"id": "an identifier or counter by its name"})


def _colour_pixels(path: str, rgb: tuple[float, float, float]) -> int:
    """Pixels of the PNG at ``path`` within a small distance of colour ``rgb``."""
    import matplotlib.image as mpimg
    import numpy as np

    img = mpimg.imread(path)[:, :, :3]
    return int((np.abs(img - np.array(rgb)).sum(axis=2) < 0.08).sum())


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_every_series_shows_where_lines_coincide(tmp_path, n):
    """n nodes with the same traffic draw n lines on top of each other: each colour must show
    along the line, beyond what its legend entry accounts for."""
    import matplotlib

    xs = [T0 + dt.timedelta(minutes=i) for i in range(40)]
    ys = [100 + (i % 7) * 10 for i in range(40)]
    series = {f"n{i}": (xs, ys) for i in range(n)}
    path = line_chart(str(tmp_path / "c.png"), "t", series, "msgs/s")
    legend_only = line_chart(str(tmp_path / "l.png"), "t", {f"n{i}": ([], []) for i in range(n)}, "msgs/s")
    for i in range(n):
        rgb = matplotlib.colors.to_rgb(f"C{i}")
        drawn = _colour_pixels(path, rgb) - _colour_pixels(legend_only, rgb)
        assert drawn > 300, (f"n{i}", drawn)


def test_partial_windows_are_not_joined_to_the_line(tmp_path):
    """The last window holds a third of the traffic of the others: drawn joined, it is a
    fall of the line; as a partial window it is an open marker off the line."""
    import matplotlib

    xs = [T0 + dt.timedelta(minutes=i) for i in range(10)]
    ys = [300.0] * 9 + [100.0]
    joined = line_chart(str(tmp_path / "j.png"), "t", {"n1": (xs, ys)}, "msgs/s")
    marked = line_chart(str(tmp_path / "m.png"), "t", {"n1": (xs, ys)}, "msgs/s", {xs[-1]})
    rgb = matplotlib.colors.to_rgb("C0")
    # (the joined chart draws the long fall from 300 to 100; the marked one a small ring)
    assert _colour_pixels(joined, rgb) > _colour_pixels(marked, rgb) + 100
