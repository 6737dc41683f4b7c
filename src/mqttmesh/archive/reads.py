"""Captured reads: the archive's record of what a client published, one read at a time.

Pure (numpy, no I/O). A node that archives every topic does not make a record per
message: for each read from a client connection it keeps the bytes of the packets it
processed (the decoder hands them over, codec.Decoder.keep) and, from the channel,
which of the PUBLISH packets in them became messages and with which sequence
numbers. The writer process then takes the messages out of the bytes here, so the
broker's hot path does almost nothing per message (measured: a record tuple per
message and its marshalling cost the broker 11 % of its fan-in throughput; a read
costs one copy of its bytes).

A read record is ``(publisher, timestamp, data, segments, skips, count)`` in the node;
on the pipe and in the writer, ``data`` is replaced by its size and the bytes of a
chunk's reads follow each other in one buffer (archive/wire.py):

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

The only loop over packets in Python is the one that finds where each packet starts
(each start depends on the length in the one before). Everything after it works on
whole columns: the fixed headers, the topics and payloads (as byte ranges of the
reads, which the writer hands to Arrow without copying them one by one), the seqs
and the read each message came from. Measured on the benchmark harness's fan-in reads
(about 430 PUBLISH packets of 64-byte payloads each, chunks of 8,192 messages): 0.17 us
a message, 0.07 of it the loop, against 0.46 for a walk that sliced every topic and
payload out in Python.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Messages", "messages", "ReadError"]


class ReadError(ValueError):
    """A read record whose bytes or numbering do not fit together."""


class Messages(NamedTuple):
    """The messages of a list of reads, as columns (one entry per message, in order)."""

    timestamp: np.ndarray  # float64: the read's timestamp
    seq: np.ndarray  # int64
    publisher: np.ndarray  # int32: index into ``publishers``
    publishers: list  # the reads' publishers, each once
    first: np.ndarray  # uint8: the PUBLISH packet's first byte (QoS and RETAIN)
    data: bytes  # the reads' bytes, one read after the other (as given)
    bounds: np.ndarray  # int64, shape (n, 4): topic start, topic end, payload start and
    # payload end in ``data``; ascending, row after row

    def topic(self, i: int) -> bytes:
        return self.data[self.bounds[i, 0] : self.bounds[i, 1]]

    def payload(self, i: int) -> bytes:
        return self.data[self.bounds[i, 2] : self.bounds[i, 3]]


def messages(reads, data: bytes) -> Messages:
    """The messages of read records ``(publisher, timestamp, size, segments, skips, count)``
    whose bytes are ``data``; ReadError names the first read that does not add up."""
    read_ends = np.cumsum(np.fromiter((r[2] for r in reads), np.int64, len(reads)))
    if len(reads) and read_ends[-1] != len(data):
        raise ReadError(f"the reads add up to {read_ends[-1]} bytes, not the {len(data)} given")
    buf = np.frombuffer(data, np.uint8)

    edges = np.array(_packet_starts(data), np.int64)  # packet starts, and the end of the last
    inner = read_ends[:-1]  # every read but the last ends where a packet starts
    misfit = np.flatnonzero(edges[np.searchsorted(edges, inner)] != inner)
    if len(misfit):
        raise ReadError(f"read {int(misfit[0])}: its last packet overruns the read")
    starts, ends = edges[:-1], edges[1:]

    # the PUBLISH packets: fixed header, topic, packet identifier (QoS 1 and 2), payload
    first = buf[starts]
    pub = np.flatnonzero((first & 0xF0) == 0x30)
    ps, pe, pfirst = starts[pub], ends[pub], first[pub]
    body = ps + 2
    cont = np.flatnonzero(buf[ps + 1] & 0x80)  # remaining lengths of more than one byte
    for k in (2, 3):
        if not len(cont):
            break
        body[cont] += 1
        cont = cont[buf[ps[cont] + k] & 0x80 != 0]
    body[cont] += 1
    short = np.flatnonzero(body + 2 > pe)
    if len(short):
        raise ReadError(f"PUBLISH at byte {int(ps[short[0]])} is too short for its topic length")
    tstart = body + 2
    tend = tstart + ((buf[body].astype(np.int64) << 8) | buf[body + 1])
    pstart = tend + ((pfirst & 0x06) != 0) * 2
    over = np.flatnonzero(pstart > pe)
    if len(over):
        raise ReadError(f"PUBLISH at byte {int(ps[over[0]])}: its topic overruns the packet")

    # which read each PUBLISH came from, its ordinal there, and which are messages
    n_reads = len(reads)
    read_of = np.searchsorted(read_ends, ps, side="right")
    found = np.bincount(read_of, minlength=n_reads)
    counts = np.fromiter((r[5] for r in reads), np.int64, n_reads)
    lacking = np.flatnonzero(found < counts)
    if len(lacking):
        r = int(lacking[0])
        raise ReadError(f"read {r} ends after {found[r]} of {counts[r]} PUBLISH packets")
    found_l = found.tolist()
    keep = None
    if (found != counts).any():  # PUBLISH packets after the handled ones: no messages
        ordinal = np.arange(len(ps)) - (np.cumsum(found) - found)[read_of]
        keep = ordinal < counts[read_of]
    base = 0
    drop: list[int] = []
    run_seq: list[int] = []
    run_len: list[int] = []
    kept: list[int] = []
    index: dict[str, int] = {}
    pub_of: list[int] = []
    for r, (publisher, _, _, segments, skips, count) in enumerate(reads):
        if not skips and len(segments) == 1 and segments[0][0] == 0:
            run_seq.append(segments[0][1])  # the usual read: no skip, no gap
            run_len.append(count)
            kept.append(count)
        else:
            numbered = _runs(segments, skips, count, run_seq, run_len)
            if numbered != count - len(skips):
                raise ReadError(f"read {r}: {count - len(skips)} messages in the read but {numbered} numbered")
            kept.append(numbered)
            drop += [base + s for s in skips]
        base += found_l[r]
        pub_of.append(index.setdefault(publisher, len(index)))
    if drop or keep is not None:
        if keep is None:
            keep = np.ones(len(ps), bool)
        keep[drop] = False
        keep = np.flatnonzero(keep)  # type: ignore[assignment]  # (the mask becomes its indices)
        pfirst, tstart, tend, pstart, pe = (a[keep] for a in (pfirst, tstart, tend, pstart, pe))  # type: ignore[assignment]

    total = sum(kept)
    lengths = np.array(run_len, np.int64)
    seq = np.repeat(np.array(run_seq, np.int64) - (np.cumsum(lengths) - lengths), lengths) + np.arange(total)
    timestamp = np.repeat(np.fromiter((r[1] for r in reads), np.float64, n_reads), kept)
    publisher = np.repeat(np.array(pub_of, np.int32), kept)
    bounds = np.empty((len(tstart), 4), np.int64)
    bounds[:, 0], bounds[:, 1], bounds[:, 2], bounds[:, 3] = tstart, tend, pstart, pe
    return Messages(timestamp, seq, publisher, list(index), pfirst, data, bounds)


def _runs(segments, skips, count: int, run_seq: list, run_len: list) -> int:
    """Append the (first seq, length) runs of a read with skips or gaps; how many it numbers."""
    skipped = set(skips)
    if len(skipped) != len(skips) or not all(0 <= s < count for s in skipped):
        raise ReadError(f"skips {sorted(skips)} are not distinct ordinals of the read's {count}")
    ends = sorted({*(o for o, _ in segments), *skipped, count})
    numbered = 0
    for ordinal, seq in segments:
        if ordinal in skipped or not 0 <= ordinal < count:
            raise ReadError(f"segment at ordinal {ordinal} of {count} is a skip or outside the read")
        length = next(e for e in ends if e > ordinal) - ordinal
        run_seq.append(seq)
        run_len.append(length)
        numbered += length
    return numbered


def _packet_starts(data) -> list[int]:
    """Where each packet of ``data`` starts, and where the last one ends (len(data)).

    The one loop over packets in Python, kept to the least it can do: each start is the
    previous one plus its fixed header and remaining length.
    """
    starts: list[int] = []
    add = starts.append
    pos = 0
    size = len(data)
    try:
        while pos < size:
            add(pos)
            length = data[pos + 1]
            if length < 128:
                pos += length + 2
            else:
                pos = _long_packet_end(data, pos)
    except IndexError:  # a fixed header cut off by the end of the data
        raise ReadError(f"the last packet overruns the read: its fixed header ends after byte {size}") from None
    if pos != size:
        raise ReadError(f"the last packet overruns the read by {pos - size} bytes")
    add(pos)
    return starts


def _long_packet_end(data, pos: int) -> int:
    """End of the packet at ``pos``, whose remaining length takes more than one byte."""
    length = 0
    shift = 0
    i = pos + 1
    while True:
        byte = data[i]
        i += 1
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return i + length
        shift += 7
        if shift > 21:
            raise ReadError(f"bad fixed header at byte {pos}: remaining length longer than four bytes")
