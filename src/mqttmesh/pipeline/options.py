"""Job options that need no Spark: times, topic filters as regular expressions, expectations.

Pure. Bad input raises OptionError with a message that names the option.
"""

from __future__ import annotations

import datetime as dt
import re

from ..codec import MalformedPacket, validate_topic_filter

__all__ = ["OptionError", "parse_time", "parse_as_of", "filter_regex", "Expectation", "parse_expectation"]


class OptionError(ValueError):
    """An option value the jobs cannot use; the message names the option."""


_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str, option: str = "time", now: float | None = None) -> dt.datetime:
    """An instant in UTC from ISO 8601 (no zone means UTC), epoch seconds, or ``-30m``/``-2h``/``-1d``
    before ``now`` (epoch seconds; required for relative times)."""
    text = text.strip()
    m = _RELATIVE.match(text)
    if m:
        if now is None:
            raise OptionError(f"{option}: a relative time needs the current time")
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
        return dt.datetime.fromtimestamp(now - seconds, dt.UTC)
    try:
        return dt.datetime.fromtimestamp(float(text), dt.UTC)
    except ValueError:
        pass
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise OptionError(
            f"{option}: {text!r} is not a time (ISO 8601 such as 2026-01-31T12:00, epoch seconds, or -30m / -2h / -1d)"
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.astimezone(dt.UTC)


def parse_as_of(text: str, now: float | None = None) -> int | dt.datetime:
    """``--as-of``: a table version (a whole number, 0 or more) or an instant (``parse_time``)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    if text.startswith("-") and text[1:].isdigit():
        raise OptionError(f"--as-of: {text!r}: a version is 0 or more (a relative time is -30m, -2h, -1d)")
    return parse_time(text, "--as-of", now)


def filter_regex(topic_filter: str) -> str:
    """A Java regular expression (Spark ``rlike``) matching exactly the topics a filter matches.

    ``+`` is one level, ``#`` any number of levels including none (``a/#`` matches ``a``),
    and a filter starting with a wildcard does not match ``$`` topics [MQTT-4.7.2-1].
    """
    try:
        validate_topic_filter(topic_filter)
    except MalformedPacket as exc:
        raise OptionError(f"{topic_filter!r} is not a topic filter: {exc}") from None
    levels = topic_filter.split("/")
    out: list[str] = []
    for i, level in enumerate(levels):
        if level == "#":  # always the last level
            if not out:
                return "^(?!\\$).*$"
            return "^" + "/".join(out) + "(/.*)?$"  # "a/#" also matches "a" [MQTT-4.7.1-2]
        if level == "+":
            out.append("[^/]*" if i else "(?!\\$)[^/]*")
        else:
            out.append(re.escape(level))  # Java accepts a backslash before any punctuation
    return "^" + "/".join(out) + "$"


class Expectation:
    """A subscriber that should have received what matched its filters (in a time range)."""

    __slots__ = ("client_id", "filters", "since", "until")

    def __init__(self, client_id: str, filters: list[str], since=None, until=None):
        self.client_id = client_id
        self.filters = filters
        self.since = since
        self.until = until

    def __repr__(self):
        return f"Expectation({self.client_id!r}, {self.filters!r}, {self.since}, {self.until})"


def parse_expectation(text: str, now: float | None = None) -> Expectation:
    """``CLIENT=FILTER[,FILTER...][@SINCE[..UNTIL]]``, e.g. ``dashboard=sensors/#@2026-01-31T12:00..-5m``."""
    client, sep, rest = text.partition("=")
    if not sep or not client or not rest:
        raise OptionError(f"--expect: {text!r} is not CLIENT=FILTER[,FILTER...][@SINCE[..UNTIL]]")
    filters_text, _, window = rest.partition("@")
    filters = [f for f in filters_text.split(",") if f]
    if not filters:
        raise OptionError(f"--expect: {text!r} names no topic filter")
    for f in filters:
        try:
            filter_regex(f)
        except OptionError as exc:
            raise OptionError(f"--expect {client}: {exc}") from None
    since = until = None
    if window:
        a, _, b = window.partition("..")
        since = parse_time(a, f"--expect {client} since", now) if a else None
        until = parse_time(b, f"--expect {client} until", now) if b else None
    return Expectation(client, filters, since, until)
