"""mqttmesh.mesh.routing.wire: one table of (records, exact bytes) drives each decoder and its encoder.

The bytes are written by hand from the formats in wire.py's docstring, never produced
by our encoder, so a bug mirrored in the encoder and the decoder shows. Every decoder
test feeds its bytes whole and followed by another group or record (which must then
decode too); malformed payloads are fed alone, after a valid group or record, and,
where more bytes cannot complete them, followed by a valid one.
"""

from __future__ import annotations

import pytest

from mqttmesh.mesh.routing.wire import (
    AckGroup,
    MeshProtocolError,
    UnicastRecord,
    decode_acks,
    decode_unicasts,
    encode_acks,
    encode_unicast,
    encode_unicasts,
)


def h(text: str) -> bytes:
    return bytes.fromhex(text)


# ---------------------------------------------------------------- e2e acknowledgements

# group: to:str8 from:str8 count:u32 seq:u64*count
ACK_NEXT = AckGroup("z", "y", (7,))
ACK_NEXT_BYTES = h("01 7a 01 79 00000001 0000000000000007")

ACKS = [
    pytest.param([], b"", id="empty"),
    pytest.param(
        [AckGroup("a", "bc", (1, 2**32 + 5))],
        h("01 61 02 62 63 00000002 0000000000000001 0000000100000005"),
        id="one-group",
    ),
    pytest.param([AckGroup("n1", "n2", ())], h("02 6e 31 02 6e 32 00000000"), id="no-seqs"),
    pytest.param(
        [AckGroup("a", "b", (3,)), AckGroup("ñ", "a", (2**64 - 1,))],
        h("01 61 01 62 00000001 0000000000000003") + h("02 c3 b1 01 61 00000001 ffffffffffffffff"),
        id="several-groups-utf8",
    ),
]


@pytest.mark.parametrize("groups, wire", ACKS)
def test_acks_encode_to_the_exact_bytes(groups, wire):
    assert encode_acks(groups) == wire


@pytest.mark.parametrize("groups, wire", ACKS)
def test_acks_decode_whole_and_followed_by_another_group(groups, wire):
    assert decode_acks(wire) == groups
    assert decode_acks(wire + ACK_NEXT_BYTES) == [*groups, ACK_NEXT]
    with pytest.raises(MeshProtocolError, match="malformed e2e acknowledgements"):
        decode_acks(wire + ACK_NEXT_BYTES[:-1])  # a partial group after them is not ignored


MALFORMED_ACKS = [
    pytest.param(h("01 61 01 62 00 00"), False, id="truncated-count"),
    pytest.param(h("01 61 01 62 00000002 0000000000000001"), False, id="seqs-past-the-end"),
    pytest.param(h("05 61"), False, id="name-past-the-end"),
    pytest.param(h("01 ff 01 62 00000000"), True, id="bad-utf8"),
]


@pytest.mark.parametrize("wire, still_bad_with_more", MALFORMED_ACKS)
def test_malformed_acks_raise(wire, still_bad_with_more):
    cases = [wire, ACK_NEXT_BYTES + wire]
    if still_bad_with_more:
        cases.append(wire + ACK_NEXT_BYTES)
    for payload in cases:
        with pytest.raises(MeshProtocolError, match="malformed e2e acknowledgements"):
            decode_acks(payload)


# ---------------------------------------------------------------- unicast records

# message: sent:f64 (the wall clock, Unix seconds), then the records
# record: hops:u8 age:u32 length:u32, then dest:str8 from:str8 kind:str8 body (length = names + body)
SENT = 1_700_000_000.25
SENT_BYTES = h("41 d9 54 fc 40 10 00 00")  # (IEEE 754 binary64, big-endian)
UNI_NEXT = UnicastRecord("q", "p", 3, "x", b"!", 7)
UNI_NEXT_BYTES = h("03 00000007 00000007 01 71 01 70 01 78 21")

UNICASTS = [
    pytest.param([], b"", id="empty"),
    pytest.param(
        [UnicastRecord("n2", "n0", 255, "claim", b"\x00binary\xff")],
        h("ff 00000000 00000014 02 6e 32 02 6e 30 05 63 6c 61 69 6d 00 62 69 6e 61 72 79 ff"),
        id="one-record",
    ),
    pytest.param(
        [UnicastRecord("b", "a", 1, "k", b"", 1)], h("01 00000001 00000006 01 62 01 61 01 6b"), id="empty-body"
    ),
    pytest.param(
        [UnicastRecord("b", "a", 2, "k", b"1", 0x01020304), UnicastRecord("ñ", "a", 9, "", b"{}")],
        h("02 01020304 00000007 01 62 01 61 01 6b 31") + h("09 00000000 00000008 02 c3 b1 01 61 00 7b 7d"),
        id="several-records-utf8",
    ),
]


@pytest.mark.parametrize("records, wire", UNICASTS)
def test_unicasts_encode_to_the_exact_bytes(records, wire):
    assert encode_unicasts([encode_unicast(*r) for r in records], SENT) == SENT_BYTES + wire


@pytest.mark.parametrize("records, wire", UNICASTS)
def test_unicasts_decode_whole_and_followed_by_another_record(records, wire):
    # read at the instant they were sent: as old as they were then
    assert list(decode_unicasts(SENT_BYTES + wire, SENT)) == records
    assert list(decode_unicasts(SENT_BYTES + wire + UNI_NEXT_BYTES, SENT)) == [*records, UNI_NEXT]
    with pytest.raises(MeshProtocolError):
        list(decode_unicasts(SENT_BYTES + wire + UNI_NEXT_BYTES[:-1], SENT))  # a partial record after them


def test_a_record_is_older_by_what_the_wall_clock_says_passed_since_it_was_sent():
    wire = SENT_BYTES + UNI_NEXT_BYTES
    assert [r.age_ms for r in decode_unicasts(wire, SENT + 2.5)] == [7 + 2500]
    # a reader whose clock is behind the sender's takes nothing off (never adds life)
    assert [r.age_ms for r in decode_unicasts(wire, SENT - 60.0)] == [7]
    # nor does a message whose time is not a number
    assert [r.age_ms for r in decode_unicasts(h("7f f8 00 00 00 00 00 00") + UNI_NEXT_BYTES, SENT)] == [7]


def test_a_relay_passes_the_age_on_and_it_saturates():
    relayed = encode_unicast("q", "p", 2, "x", b"!", 2507)
    assert [r.age_ms for r in decode_unicasts(encode_unicasts([relayed], SENT + 3), SENT + 4)] == [3507]
    big = encode_unicast("q", "p", 2, "x", b"!", 1 << 40)
    assert list(decode_unicasts(encode_unicasts([big], SENT), SENT))[0].age_ms == 0xFFFFFFFF


MALFORMED_UNICASTS = [
    pytest.param(h("01 00 00"), "malformed unicast", False, id="truncated-header"),
    pytest.param(
        h("01 00000000 00000009 01 62 01 61 01 6b"), "overruns its message", False, id="record-overruns-message"
    ),
    pytest.param(
        h("01 00000000 00000004 01 62 01 61 01 6b"), "header overruns its record", True, id="header-overruns-record"
    ),
    pytest.param(h("01 00000000 00000001 05"), "malformed unicast", False, id="name-past-the-end"),
    pytest.param(h("01 00000000 00000006 01 ff 01 61 01 6b"), "malformed unicast", True, id="bad-utf8"),
]


@pytest.mark.parametrize("wire, message, still_bad_with_more", MALFORMED_UNICASTS)
def test_malformed_unicasts_raise(wire, message, still_bad_with_more):
    cases = [wire]
    if still_bad_with_more:
        cases.append(wire + UNI_NEXT_BYTES)
    for payload in cases:
        with pytest.raises(MeshProtocolError, match=message):
            list(decode_unicasts(SENT_BYTES + payload, SENT))
    # after a valid record: that one comes out first (the engine relays it), then the error
    records = decode_unicasts(SENT_BYTES + UNI_NEXT_BYTES + wire, SENT)
    assert next(records) == UNI_NEXT
    with pytest.raises(MeshProtocolError, match=message):
        next(records)


@pytest.mark.parametrize("payload", [b"", h("00 00 00 00 00 00 00")], ids=["empty", "short-time"])
def test_a_unicast_message_without_its_time_raises(payload):
    with pytest.raises(MeshProtocolError, match="malformed unicast"):
        list(decode_unicasts(payload, SENT))
