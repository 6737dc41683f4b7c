"""The peer handshake in the two state machines: mesh.client.LinkClient (the dialling side)
and channel.Channel in its provisional-peer state (the listening side).

Bytes in are built with tests/support/mqttraw.py, bytes out are split with support.frames' own
parser; the proofs come from mesh.peerauth (their format is pinned in test_peerauth_unit.py).
"""

from __future__ import annotations

import pytest

from mqttmesh.channel import CLOSED, CONNECTED, PEER_AUTH, TRANSITIONS
from mqttmesh.codec import DEFAULT_MAX_PACKET_SIZE, DISCONNECT, PINGREQ, PUBLISH, SUBSCRIBE
from mqttmesh.mesh.link.client import AuthFailed, LinkClient, ProtocolError, Ready, Received, Refused
from mqttmesh.mesh.link.peerauth import PEER_PROTOCOL, DiallerAuth, ListenerAuth, listen, parse_connect
from support import mqttraw
from support.frames import Net, out, split_frames, v1_token

SECRET = b"cluster-secret"
ND = bytes(range(16))
NL = bytes(range(100, 116))
CONNACK_0 = b"\x20\x02\x00\x00"
SUBACK_1 = b"\x90\x03\x00\x01\x01"


def challenge_for(nonce=ND, secret=SECRET, listener="b", listener_nonce=NL):
    dialler = DiallerAuth(SECRET, "a", 7, nonce)
    return ListenerAuth(secret, listener, 9, listener_nonce, parse_connect(dialler.password())).challenge()


def proof_for(challenge: bytes, nonce=ND) -> bytes:
    dialler = DiallerAuth(SECRET, "a", 7, nonce)
    return dialler.proof(dialler.check_listener(challenge))


# =========================================================================== dialling side


def link(timeout=10.0) -> LinkClient:
    return LinkClient("a", 7, SECRET, keepalive=1.0, handshake_timeout=timeout)


def connected(client: LinkClient, now=0.0) -> LinkClient:
    client.connection_made(now, ND)
    client.data_to_send()
    assert client.receive_data(CONNACK_0, now) == []
    client.data_to_send()
    assert client.receive_data(SUBACK_1, now + 0.002) == []
    return client


def test_connect_carries_version_node_incarnation_and_nonce():
    client = link()
    client.connection_made(0.0, ND)
    expected = mqttraw.connect(
        "$mesh-a",
        clean=False,
        keepalive=2,
        username="mqttmesh-peer",
        password=b"%d|a|7|" % PEER_PROTOCOL + ND.hex().encode(),
    )
    assert client.data_to_send() == expected
    assert client.state == "connecting"


def test_connack_then_subscribe_then_wait_for_the_proof():
    client = link()
    client.connection_made(0.0, ND)
    client.data_to_send()
    assert client.receive_data(CONNACK_0, 0.0) == []
    assert client.data_to_send() == mqttraw.subscribe(1, ("$mesh/to/a/#", 1))
    assert client.receive_data(SUBACK_1, 0.004) == []
    assert client.state == "authenticating"
    assert client.data_to_send() == b""
    # nothing goes out before the listener proved the secret, at any QoS
    client.publish("$mesh/from/a/lsa", b"x", 0)
    client.publish("$mesh/from/a/fwd", b"y", 1)
    assert client.data_to_send() == b""
    assert len(client.queue) == 1


def test_right_proof_makes_the_link_ready_and_ours_goes_out_first():
    client = connected(link())
    client.publish("$mesh/from/a/fwd", b"queued", 1)
    challenge = challenge_for()
    events = client.receive_data(mqttraw.publish("$mesh/to/a/auth", challenge), 0.01)
    assert events == [Ready(pytest.approx(0.002))]
    assert (client.peer, client.peer_incarnation, client.state) == ("b", 9, "ready")
    frames = split_frames(client.data_to_send())
    assert frames[0].type == PUBLISH and frames[0].qos == 0
    assert (frames[0].topic, frames[0].payload) == ("$mesh/from/a/auth", proof_for(challenge))
    assert (frames[1].topic, frames[1].payload, frames[1].qos) == ("$mesh/from/a/fwd", b"queued", 1)
    # then messages flow as before
    events = client.receive_data(mqttraw.publish("$mesh/to/a/hello", b"{}", 1, pid=5), 0.02)
    assert events == [Received("$mesh/to/a/hello", b"{}")]
    assert client.data_to_send() == mqttraw.puback(5)


def test_unacknowledged_messages_are_resent_only_after_the_proof():
    client = connected(link())
    client.publish("$mesh/from/a/fwd", b"m", 1)
    client.receive_data(mqttraw.publish("$mesh/to/a/auth", challenge_for()), 0.01)
    client.data_to_send()
    client.connection_lost()
    # a new connection: a new nonce, and the unacknowledged message waits for the new proof
    nd2 = bytes(range(50, 66))
    client.connection_made(1.0, nd2)
    assert client.data_to_send() == mqttraw.connect(
        "$mesh-a",
        clean=False,
        keepalive=2,
        username="mqttmesh-peer",
        password=b"%d|a|7|" % PEER_PROTOCOL + nd2.hex().encode(),
    )
    client.receive_data(CONNACK_0 + SUBACK_1, 1.0)
    assert client.data_to_send() == mqttraw.subscribe(1, ("$mesh/to/a/#", 1))
    # the challenge of the previous connection is refused on this one
    events = client.receive_data(mqttraw.publish("$mesh/to/a/auth", challenge_for()), 1.01)
    assert isinstance(events[0], AuthFailed)
    assert client.data_to_send() == b""


@pytest.mark.parametrize(
    "packet,why",
    [
        (lambda: mqttraw.publish("$mesh/to/a/auth", challenge_for(secret=b"wrong")), "failed to prove"),
        (lambda: mqttraw.publish("$mesh/to/a/auth", challenge_for(nonce=bytes(16))), "failed to prove"),
        (lambda: mqttraw.publish("$mesh/to/a/auth", challenge_for(listener="a")), "own id"),
        (lambda: mqttraw.publish("$mesh/to/a/auth", b"garbage"), "fields"),
        (lambda: mqttraw.publish("$mesh/to/a/auth", challenge_for(), 1, pid=1), "QoS 1"),
        (lambda: mqttraw.publish("$mesh/to/a/hello", b'{"node": "b", "inc": 1}', 1, pid=1), "hello"),
    ],
)
def test_wrong_or_missing_proof_fails_and_nothing_is_sent(packet, why):
    client = connected(link())
    client.publish("$mesh/from/a/fwd", b"m", 1)
    events = client.receive_data(packet(), 0.01)
    assert len(events) == 1 and isinstance(events[0], AuthFailed) and why in events[0].reason, events
    assert client.state == "refused"
    assert client.data_to_send() == b""
    assert client.peer is None


def test_publish_before_suback_is_a_protocol_error():
    client = link()
    client.connection_made(0.0, ND)
    events = client.receive_data(CONNACK_0 + mqttraw.publish("$mesh/to/a/auth", challenge_for()), 0.0)
    assert isinstance(events[0], ProtocolError)
    assert client.state == "refused"


def test_refusal_codes_are_reported():
    client = link()
    client.connection_made(0.0, ND)
    assert client.receive_data(b"\x20\x02\x00\x04", 0.0) == [Refused(4)]
    assert client.state == "refused"


def test_handshake_must_finish_within_its_timeout_even_if_the_listener_answers_pings():
    client = connected(link(timeout=10.0), now=0.0)
    for t in range(1, 10):
        assert client.tick(float(t)) is None
        client.receive_data(b"\xd0\x00", float(t))  # PINGRESP keeps the link alive, not the handshake
    reason = client.tick(10.5)
    assert reason is not None and "handshake" in reason


def test_ready_link_has_no_handshake_deadline():
    client = connected(link(timeout=10.0))
    client.receive_data(mqttraw.publish("$mesh/to/a/auth", challenge_for()), 0.01)
    for t in range(1, 30):
        client.receive_data(b"\xd0\x00", float(t))
        assert client.tick(float(t)) is None


# =========================================================================== listening side


class FakeMesh:
    """The Channels' PeerPort: hands out ListenerAuth with a known nonce, records peer input."""

    def __init__(self, node_id="b", nonces=(NL,), certificate_required=False):
        self.node_id = node_id
        self.certificate_required = certificate_required
        self.nonces = list(nonces)
        self.inputs = []
        self.closed = []

    def listen(self, client_id, password, certified):
        # the real checks (PeerLinks.listen calls the same), with a known nonce
        return listen(
            SECRET,
            self.node_id,
            9,
            lambda: self.nonces.pop(0),
            client_id,
            password,
            certified,
            self.certificate_required,
        )

    def peer_input(self, channel, msg, now):
        self.inputs.append((channel.peer_node, msg.topic, msg.payload))
        return 0, ()

    def peer_closed(self, channel, now):
        self.closed.append(channel)
        self.closed_at = now


@pytest.fixture
def net():
    return Net(node_id="b", connect_timeout=10.0, peers=FakeMesh())


def peer_connect(node="a", nonce=ND, client_id=None, password=None):
    pw = password if password is not None else DiallerAuth(SECRET, node, 7, nonce).password()
    return mqttraw.connect(
        client_id or f"$mesh-{node}", clean=False, keepalive=2, username="mqttmesh-peer", password=pw
    )


def provisional(net, now=0.0):
    ch = net.channel(now)
    ch.receive_data(peer_connect(), now)
    assert ch.data_to_send() == CONNACK_0
    return ch


def challenged(net, now=0.0):
    ch = provisional(net, now)
    ch.receive_data(mqttraw.subscribe(1, ("$mesh/to/a/#", 1)), now)
    frames = out(ch)
    assert [f.type for f in frames] == [9, PUBLISH]
    assert frames[0].body == b"\x00\x01\x01"
    assert (frames[1].topic, frames[1].qos, frames[1].retain) == ("$mesh/to/a/auth", 0, False)
    return ch, frames[1].payload


def test_peer_connect_is_accepted_provisionally(net):
    ch = provisional(net)
    assert ch.state == PEER_AUTH
    assert not ch.is_peer and ch.peer_node is None
    assert net.broker.sessions == {}  # no session, so nothing is routed to it
    settings = net.broker.settings  # before its proof it is held to the pre-auth limit
    assert ch.decoder.max_packet_size == min(settings.max_connect_size, settings.max_packet_size)
    assert ch.deadline() == 10.0


def test_subscribe_gets_suback_and_the_challenge(net):
    ch, challenge = challenged(net)
    hs = DiallerAuth(SECRET, "a", 7, ND).check_listener(challenge)
    assert (hs.listener, hs.listener_incarnation, hs.listener_nonce) == ("b", 9, NL.hex())
    assert ch.state == PEER_AUTH


def test_right_proof_makes_a_peer_and_what_follows_is_peer_traffic(net):
    ch, challenge = challenged(net)
    ch.receive_data(
        mqttraw.publish("$mesh/from/a/auth", proof_for(challenge))
        + mqttraw.publish("$mesh/from/a/hello", b"{}", 1, pid=1),
        0.1,
    )
    assert ch.state == CONNECTED
    assert ch.is_peer and ch.peer_node == "a"
    assert ch.decoder.max_packet_size == DEFAULT_MAX_PACKET_SIZE
    session = net.broker.sessions["$mesh-a"]
    assert session.channel is ch and "$mesh/to/a/#" in session.subscriptions
    assert net.peers.inputs == [("a", "$mesh/from/a/hello", b"{}")]  # the proof is not a message
    assert out(ch)[0].body == b"\x00\x01"  # PUBACK of the hello
    assert net.owner.closes == []


def peer(net, now=0.0):
    ch, challenge = challenged(net, now)
    ch.receive_data(mqttraw.publish("$mesh/from/a/auth", proof_for(challenge)), now)
    assert ch.state == CONNECTED and ch.is_peer
    return ch


def test_a_peer_link_ended_by_keepalive_goes_down_at_the_time_of_the_tick(net):
    # (the engine dates the link's end, and its new router advertisement, by that time)
    ch = peer(net, 0.1)
    ch.tick(3.5)  # keepalive 2 s: nothing read for more than 1.5 x 2 s
    assert net.peers.closed == [ch] and net.peers.closed_at == 3.5


def test_a_peer_link_the_node_resets_goes_down_at_the_time_it_gives(net):
    ch = peer(net, 0.1)
    ch.close("slow consumer", 7.0)
    assert net.peers.closed == [ch] and net.peers.closed_at == 7.0


def test_a_peer_link_lost_goes_down_at_the_time_of_the_loss(net):
    ch = peer(net, 0.1)
    ch.connection_lost(2.5)
    assert net.peers.closed == [ch] and net.peers.closed_at == 2.5


@pytest.mark.parametrize(
    "proof",
    [
        pytest.param(lambda c: b"0" * 64, id="wrong-mac"),
        pytest.param(lambda c: c.rsplit(b"|", 1)[1], id="reflected-listener-mac"),
        pytest.param(lambda c: proof_for(challenge_for(listener_nonce=bytes(16))), id="proof-for-another-nonce"),
        pytest.param(lambda c: b"not hex", id="malformed"),
    ],
)
def test_wrong_proof_closes_and_makes_no_peer(net, proof):
    ch, challenge = challenged(net)
    ch.receive_data(mqttraw.publish("$mesh/from/a/auth", proof(challenge)), 0.1)
    assert ch.state == CLOSED and not ch.is_peer
    assert net.broker.sessions == {}
    assert net.broker.stats.connections_refused == 1
    assert len(net.owner.reasons(ch)) == 1


@pytest.mark.parametrize(
    "packet",
    [
        pytest.param(lambda: mqttraw.publish("$mesh/from/a/hello", b"{}", 1, pid=1), id="hello-before-proof"),
        pytest.param(lambda: mqttraw.publish("$mesh/from/a/auth", b"0" * 64, 1, pid=1), id="proof-at-qos1"),
        pytest.param(lambda: mqttraw.publish("x/y", b"0" * 64), id="other-topic"),
        pytest.param(lambda: mqttraw.subscribe(2, ("$mesh/to/a/#", 1)), id="second-subscribe"),
        pytest.param(lambda: mqttraw.unsubscribe(2, "$mesh/to/a/#"), id="unsubscribe"),
        pytest.param(lambda: mqttraw.puback(1), id="puback"),
    ],
)
def test_anything_else_from_a_provisional_peer_closes_it(net, packet):
    ch, _ = challenged(net)
    ch.receive_data(packet(), 0.1)
    assert ch.state == CLOSED and not ch.is_peer
    assert net.peers.inputs == []
    assert net.broker.sessions == {}


@pytest.mark.parametrize("filters", [[("$mesh/to/b/#", 1)], [("#", 1)], [("$mesh/to/a/#", 1), ("x", 0)]])
def test_subscribe_to_anything_but_its_own_topic_closes(net, filters):
    ch = provisional(net)
    ch.receive_data(mqttraw.subscribe(1, *filters), 0.0)
    assert ch.state == CLOSED
    assert ch.data_to_send() == b""  # no SUBACK, no challenge


def test_proof_before_the_challenge_closes(net):
    ch = provisional(net)
    ch.receive_data(mqttraw.publish("$mesh/from/a/auth", b"0" * 64), 0.0)
    assert ch.state == CLOSED


def test_pingreq_is_answered_while_provisional(net):
    ch = provisional(net)
    ch.receive_data(mqttraw.PINGREQ_BYTES, 0.5)
    assert ch.data_to_send() == b"\xd0\x00"
    assert ch.state == PEER_AUTH


def test_disconnect_ends_a_provisional_peer_quietly(net):
    ch = provisional(net)
    ch.receive_data(mqttraw.DISCONNECT_BYTES, 0.5)
    assert ch.state == CLOSED and ch.clean_disconnect


def test_unfinished_handshake_is_closed_at_the_connect_timeout(net):
    ch, _ = challenged(net)
    ch.receive_data(mqttraw.PINGREQ_BYTES, 9.0)  # pings do not extend it
    ch.tick(9.9)
    assert ch.state == PEER_AUTH
    ch.tick(10.0)
    assert ch.state == CLOSED
    assert "did not prove the cluster secret" in net.owner.reasons(ch)[0]


def test_provisional_peer_does_not_take_over_a_live_link(net):
    first, challenge = challenged(net)
    first.receive_data(mqttraw.publish("$mesh/from/a/auth", proof_for(challenge)), 0.1)
    assert first.state == CONNECTED
    # the same CONNECT again (a replay, or the same node reconnecting): the live link stays
    # until the new connection proves the secret
    net.peers.nonces.append(bytes(range(200, 216)))
    second = net.channel(1.0)
    second.receive_data(peer_connect(), 1.0)
    assert second.data_to_send() == b"\x20\x02\x01\x00"  # session present: the live link's
    second.receive_data(mqttraw.subscribe(1, ("$mesh/to/a/#", 1)), 1.0)
    out(second)
    second.receive_data(mqttraw.publish("$mesh/from/a/auth", proof_for(challenge)), 1.1)  # replayed
    assert second.state == CLOSED
    assert first.state == CONNECTED and net.broker.sessions["$mesh-a"].channel is first
    assert net.owner.reasons(first) == []


def test_a_real_reconnect_takes_the_link_over_once_proved(net):
    first, challenge = challenged(net)
    first.receive_data(mqttraw.publish("$mesh/from/a/auth", proof_for(challenge)), 0.1)
    nl2 = bytes(range(200, 216))
    nd2 = bytes(range(30, 46))
    net.peers.nonces.append(nl2)
    second = net.channel(1.0)
    second.receive_data(peer_connect(nonce=nd2), 1.0)
    second.data_to_send()
    second.receive_data(mqttraw.subscribe(1, ("$mesh/to/a/#", 1)), 1.0)
    challenge2 = out(second)[1].payload
    second.receive_data(mqttraw.publish("$mesh/from/a/auth", proof_for(challenge2, nonce=nd2)), 1.1)
    assert second.state == CONNECTED
    assert first.state == CLOSED and net.broker.sessions["$mesh-a"].channel is second


def test_version_1_peer_is_refused_naming_both_versions(net):
    ch = net.channel()
    ch.receive_data(peer_connect(password=v1_token(SECRET, "a", 7, 1_700_000_000)), 0.0)
    assert ch.data_to_send() == b"\x20\x02\x00\x04"
    assert ch.state == CLOSED
    assert f"peer 'a' speaks mesh protocol 1, this node {PEER_PROTOCOL}" in net.owner.reasons(ch)[0]


def test_newer_version_peer_is_refused_naming_both_versions(net):
    ch = net.channel()
    ch.receive_data(peer_connect(password=b"%d|a|7|anything" % (PEER_PROTOCOL + 1)), 0.0)
    assert ch.data_to_send() == b"\x20\x02\x00\x04"
    assert f"peer 'a' speaks mesh protocol {PEER_PROTOCOL + 1}, this node {PEER_PROTOCOL}" in net.owner.reasons(ch)[0]


@pytest.mark.parametrize("certified,expected", [(False, b"\x20\x02\x00\x05"), (True, CONNACK_0)])
def test_mutual_tls_needs_a_verified_client_certificate_for_a_peer(net, certified, expected):
    from mqttmesh.channel import Channel

    peers = FakeMesh(certificate_required=True)
    ch = Channel(net.broker, net.owner, "peer", 0.0, certified, peers=peers)
    ch.receive_data(peer_connect(), 0.0)
    assert ch.data_to_send() == expected
    if not certified:
        assert "mesh.tls_mutual" in net.owner.reasons(ch)[0]
    # an ordinary client needs none
    client = Channel(net.broker, net.owner, "client", 0.0, False, peers=peers)
    client.receive_data(mqttraw.connect("plain"), 0.0)
    assert client.data_to_send() == CONNACK_0


def test_transition_table_of_a_provisional_peer():
    assert set(TRANSITIONS[PEER_AUTH]) == {SUBSCRIBE, PUBLISH, PINGREQ, DISCONNECT}


# =========================================================================== both sides


def test_linkclient_and_channel_complete_the_handshake_over_a_byte_pipe(net):
    client = link()
    ch = net.channel(0.0)
    client.connection_made(0.0, ND)
    events = []
    for step in range(6):  # bytes go back and forth until both are quiet
        ch.receive_data(client.data_to_send(), step / 100)
        events += client.receive_data(ch.data_to_send(), step / 100)
    assert [type(e) for e in events] == [Ready]
    assert client.peer == "b" and ch.is_peer and ch.peer_node == "a" and ch.state == CONNECTED
