"""Captured reads: the archive's record of what a client published, one read at a time.

Pure. A node that archives every topic does not make a record per message: for each
read from a client connection it keeps the bytes of the packets it processed (the
decoder hands them over, codec.Decoder.keep) and, from the channel, which of the
PUBLISH packets in them became messages and with which sequence numbers. The writer
process then takes the messages out of the bytes here, so the broker's hot path does
almost nothing per message (measured: a record tuple per message and its marshalling
cost the broker 11 % of its fan-in throughput; a read costs one copy of its bytes).

A read record is ``(publisher, timestamp, data, segments, skips, count)``:

- ``data``: whole MQTT packets, as the client sent them; PUBLISH packets are numbered
  0, 1, ... in order (their ordinals), other packets are not numbered;
- ``count``: PUBLISH packets the broker handled; those after them (a read cut short by
  a protocol error) are not messages;
- ``skips``: ordinals of PUBLISH packets that did not become messages (not authorised,
  a QoS 2 re-send);
- ``segments``: ``(ordinal, seq)`` pairs, ascending: the message of that ordinal got
  ``seq`` and each following one the next number, up to the next segment or skip.

Every message of a read has the read's timestamp and publisher, as the broker gives
them (channel.py: ``now`` is per read).
"""

from __future__ import annotations

__all__ = ["publishes", "columns", "ReadError"]

_PUBLISH = 3


class ReadError(ValueError):
    """A read record whose bytes or numbering do not fit together."""


def publishes(data, segments, skips, count: int) -> list[tuple[int, int, bytes, bytes]]:
    """(seq, first byte, topic bytes, payload) of each message of one read, in order."""
    firsts, topics, payloads = bytearray(), [], []
    _parse(data, skips, count, firsts, topics, payloads)
    return list(zip(_seqs(segments, skips, count), firsts, topics, payloads))


def columns(reads):
    """The publish-record columns of read records, one entry per message: timestamps,
    seqs, publishers, topics (bytes), first bytes (QoS and RETAIN), payloads."""
    ts, seqs, pubs, topics, firsts, payloads = [], [], [], [], bytearray(), []
    for publisher, timestamp, data, segments, skips, count in reads:
        n = _parse(data, skips, count, firsts, topics, payloads)
        seqs += _seqs(segments, skips, count)
        if len(seqs) != len(topics):
            raise ReadError(f"{n} messages in the read but {count - len(skips)} numbered")
        ts += [timestamp] * n
        pubs += [publisher] * n
    return ts, seqs, pubs, topics, bytes(firsts), payloads


def _seqs(segments, skips, count: int):
    """The seq of each message of a read, from its segments and skips."""
    if not skips and len(segments) == 1 and segments[0][0] == 0:
        seq = segments[0][1]
        return range(seq, seq + count)  # the usual read: no skip, no gap
    ends = sorted({*(o for o, _ in segments), *skips, count})
    out: list[int] = []
    skipped = set(skips)
    for ordinal, seq in segments:
        if ordinal in skipped or not 0 <= ordinal < count:
            raise ReadError(f"segment at ordinal {ordinal} of {count} is a skip or outside the read")
        end = next(e for e in ends if e > ordinal)
        out += range(seq, seq + end - ordinal)
    return out


def _parse(data, skips, count: int, firsts: bytearray, topics: list, payloads: list) -> int:
    """Append the first byte, topic and payload of each message of one read; how many."""
    before = len(topics)
    k = 0
    if skips:
        skips = sorted(skips)
        skips.append(count)
        next_skip = skips[0]
    else:
        next_skip = count  # no ordinal reaches it
    add_first, add_topic, add_payload = firsts.append, topics.append, payloads.append
    pos = 0
    ordinal = 0
    try:
        while ordinal < count:
            first = data[pos]
            length = data[pos + 1]
            if length & 0x80:
                i, length = _remaining_length(data, pos)
            else:
                i = pos + 2
            end = i + length
            if first & 0xF0 == 0x30:  # PUBLISH
                if ordinal != next_skip:
                    tend = i + 2 + ((data[i] << 8) | data[i + 1])
                    add_first(first)
                    add_topic(data[i + 2:tend])
                    add_payload(data[tend + 2 if first & 0x06 else tend:end])
                else:
                    k += 1
                    next_skip = skips[k]
                ordinal += 1
            pos = end
    except IndexError:
        raise ReadError(f"read ends after {ordinal} of {count} PUBLISH packets") from None
    if pos > len(data):  # packets follow each other: only the last one can overrun
        raise ReadError(f"the last packet overruns the read by {pos - len(data)} bytes")
    return len(topics) - before


def _remaining_length(data, pos: int) -> tuple[int, int]:
    """(first byte after the fixed header, remaining length) of the packet at ``pos``."""
    length = 0
    shift = 0
    i = pos + 1
    while True:
        if shift > 21:
            raise ReadError(f"bad fixed header at byte {pos}")
        byte = data[i]
        i += 1
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return i, length
        shift += 7
