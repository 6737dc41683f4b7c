"""The hello (mesh/link/hello.py): its JSON form, today's hellos without ``proto``, and refusals."""

from __future__ import annotations

import json

import pytest

from mqttmesh.mesh.link.hello import Hello, HelloVersionError, encode_hello, parse_hello
from mqttmesh.mesh.link.peerauth import PEER_PROTOCOL, version_mismatch
from mqttmesh.mesh.routing.wire import MeshProtocolError


def test_round_trip():
    hello = Hello("a", 7, ["a.example:1883", "10.0.0.1:1883"], 40_000.0)
    assert parse_hello(encode_hello(hello)) == hello


def test_wire_form_adds_proto_to_todays_keys():
    body = json.loads(encode_hello(Hello("a", 1, [], 40_000.4)))
    assert body == {"node": "a", "inc": 1, "addr": [], "rtt": 40_000, "proto": PEER_PROTOCOL}
    assert "rtt" not in json.loads(encode_hello(Hello("a", 1)))  # only the dialler measured one


def test_a_hello_without_proto_is_version_2_and_refused():
    # what the nodes of the release before the key sent: version 2, which mesh protocol 3
    # (issue 15: settlement versions in session snapshots) no longer speaks
    with pytest.raises(HelloVersionError) as info:
        parse_hello(b'{"node": "a", "inc": 3, "addr": ["h:1"], "rtt": 2500}')
    assert str(info.value) == f"peer 'a' speaks mesh protocol 2, this node {PEER_PROTOCOL}"


@pytest.mark.parametrize("proto", [v for v in range(1, PEER_PROTOCOL + 2) if v != PEER_PROTOCOL])
def test_another_version_is_refused_naming_both(proto):
    with pytest.raises(HelloVersionError) as info:
        parse_hello(encode_hello(Hello("a", 1, proto=proto)))
    assert str(info.value) == f"peer 'a' speaks mesh protocol {proto}, this node {PEER_PROTOCOL}"
    assert isinstance(info.value, MeshProtocolError)  # a caller that only knows that still closes


def test_the_version_words_are_the_connects():
    assert version_mismatch("d", 1) == f"peer 'd' speaks mesh protocol 1, this node {PEER_PROTOCOL}"


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"{", "invalid hello"),
        (b"\xff", "invalid hello"),
        (b"[1]", "not a JSON object"),
        (b'{"inc": 1}', "'node' missing"),
        (b'{"node": 5, "inc": 1}', "'node' missing or not a string"),
        (b'{"node": "a"}', "'inc' missing"),
        (b'{"node": "a", "inc": "1"}', "'inc' missing or not an integer"),
        (b'{"node": "a", "inc": 1, "proto": "2"}', "'proto' is not an integer"),
        (b'{"node": "a", "inc": 1, "proto": true}', "'proto' is not an integer"),
    ],
)
def test_malformed_hellos_are_refused_with_a_reason(payload, why):
    with pytest.raises(MeshProtocolError) as info:
        parse_hello(payload)
    assert why in str(info.value) and str(info.value).startswith("invalid hello")
    assert not isinstance(info.value, HelloVersionError)


def test_odd_optional_fields_are_ignored_as_before():
    hello = parse_hello(b'{"node": "a", "inc": 1, "addr": ["h:1", 5, null], "rtt": -3, "proto": %d}' % PEER_PROTOCOL)
    assert (hello.addresses, hello.rtt_us) == (["h:1"], None)
    hello = parse_hello(b'{"node": "a", "inc": 1, "addr": "h:1", "rtt": "fast", "proto": %d}' % PEER_PROTOCOL)
    assert (hello.addresses, hello.rtt_us) == ([], None)
