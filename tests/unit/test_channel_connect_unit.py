"""mqttmesh.channel.Channel with mqttmesh.broker.Broker: CONNECT, authentication, takeover,
sessions, keepalive, wills and the transition table.

Input bytes come from tests/support/mqttraw.py or are written by hand; output bytes are
compared exactly (``channel.data_to_send()``).
"""

from __future__ import annotations

import re
import sys

import pytest

from mqttmesh.auth import Auth, PasswordFile, hash_password
from mqttmesh.broker import Broker, BrokerPorts, BrokerSettings, counting_hex
from mqttmesh.channel import AUTHENTICATING, AWAIT_CONNECT, CLAIMING, CLOSED, CONNECTED, TRANSITIONS, Channel
from mqttmesh.codec import (
    CONNACK,
    CONNECT,
    DISCONNECT,
    PINGREQ,
    PINGRESP,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    Decoder,
    Will,
)
from mqttmesh.flow import Congestion
from mqttmesh.store import Journal
from support import mqttraw
from support.frames import Net, out, publishes

SPEC_ID = re.compile(r"\[MQTT-\d+\.\d+\.\d+-\d+\]")


def h(text: str) -> bytes:
    return bytes.fromhex(text)


ACCEPTED = h("20 02 00 00")
ACCEPTED_PRESENT = h("20 02 01 00")


@pytest.fixture
def net():
    return Net()


# --------------------------------------------------------------------------- CONNECT


def test_connect_accepted(net):
    ch = net.channel()
    assert ch.state == AWAIT_CONNECT
    ch.receive_data(mqttraw.connect("c1"), 0.0)
    assert ch.data_to_send() == ACCEPTED  # [MQTT-3.1.4-4] [MQTT-3.2.0-1]
    assert ch.state == CONNECTED
    assert ch.client_id == "c1"
    assert net.owner.wakes == [ch]
    assert net.owner.closes == []
    assert net.broker.sessions["c1"].channel is ch


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(mqttraw.connect("c", level=3), id="MQTT-level-3"),
        pytest.param(mqttraw.connect("c", proto=b"MQIsdp", level=3), id="MQIsdp-3"),
    ],
)
def test_connect_other_level_gets_connack_0x01_then_close(net, raw):
    """[MQTT-3.1.2-2] CONNACK 0x01 (unacceptable protocol level), then disconnect."""
    ch = net.channel()
    ch.receive_data(raw + mqttraw.publish("t", b"x", retain=True), 0.0)
    assert ch.data_to_send() == h("20 02 00 01")
    assert ch.state == CLOSED
    assert len(net.owner.reasons(ch)) == 1
    assert "0x01" in net.owner.reasons(ch)[0]
    assert net.broker.sessions == {}
    assert len(net.broker.retained) == 0


def test_connect_mqisdp_with_level_4_is_not_accepted(net):
    ch = net.channel()
    ch.receive_data(mqttraw.connect("c", proto=b"MQIsdp", level=4), 0.0)
    assert ch.data_to_send() in (b"", h("20 02 00 01"))
    assert ch.state == CLOSED


def test_connect_wrong_protocol_name_closes_without_connack(net):
    """[MQTT-3.1.2-1] we close; [MQTT-3.1.4-1] no CONNACK for a CONNECT that does not conform."""
    ch = net.channel()
    ch.receive_data(mqttraw.connect("c", proto=b"MQTX"), 0.0)
    assert ch.data_to_send() == b""
    assert ch.state == CLOSED
    [reason] = net.owner.reasons(ch)
    assert "[MQTT-3.1.2-1]" in reason


def test_connect_reserved_flag_closes_without_connack(net):
    """[MQTT-3.1.2-3]"""
    ch = net.channel()
    ch.receive_data(mqttraw.connect("c", flags_extra=0x01), 0.0)
    assert ch.data_to_send() == b""
    assert "[MQTT-3.1.2-3]" in net.owner.reasons(ch)[0]


def test_empty_client_id_without_clean_session_is_rejected(net):
    """[MQTT-3.1.3-8] CONNACK 0x02, then close."""
    ch = net.channel()
    ch.receive_data(mqttraw.connect("", clean=False), 0.0)
    assert ch.data_to_send() == h("20 02 00 02")
    assert ch.state == CLOSED
    assert len(net.owner.reasons(ch)) == 1
    assert net.broker.sessions == {}


def test_empty_client_id_with_clean_session_gets_a_unique_id(net):
    """[MQTT-3.1.3-6]"""
    a = net.connect("", clean=True)
    b = net.connect("", clean=True)
    assert a.client_id and b.client_id and a.client_id != b.client_id
    assert net.broker.sessions[a.client_id].channel is a
    assert net.broker.sessions[b.client_id].channel is b


def test_auto_client_ids_come_from_the_brokers_random_hex():
    """[MQTT-3.1.3-6] ``auto-<node>-<12 hex digits>``: the randomness is a port (the server
    passes os.urandom's); a Broker built without one counts, so tests are deterministic."""
    net = Net()
    assert [net.connect("", clean=True).client_id for _ in range(2)] == ["auto-n1-000000000001", "auto-n1-000000000002"]
    drawn = []

    def random_hex(n):
        drawn.append(n)
        return "ab" * n

    broker = Broker(BrokerSettings(node_id="n7"), ports=BrokerPorts(random_hex=random_hex))
    ch = Channel(broker, net.owner, "peer", 0.0)
    ch.receive_data(mqttraw.connect("", clean=True), 0.0)
    assert ch.data_to_send() == h("20 02 00 00")
    assert ch.client_id == "auto-n7-abababababab" and drawn == [6]
    assert net.connect("named").client_id == "named"  # a ClientId of its own draws nothing
    hexes = counting_hex()
    assert (hexes(1), hexes(2), hexes(3)) == ("01", "0002", "000003")


def test_client_id_length_limit():
    """[MQTT-3.1.3-5] 23 bytes must be allowed; longer may be refused with 0x02 [MQTT-3.1.3-9]."""
    net = Net(max_client_id_length=23)
    net.connect("abcdefghijklmnopqrstuvw")
    ch = net.channel()
    ch.receive_data(mqttraw.connect("abcdefghijklmnopqrstuvwx"), 0.0)
    assert ch.data_to_send() == h("20 02 00 02")
    assert ch.state == CLOSED


# --------------------------------------------------------------------------- authentication


@pytest.fixture
def passwords(tmp_path):
    path = tmp_path / "passwd"
    path.write_text(f"alice:{hash_password('secret', iterations=1000, salt=b'alice-salt')}\n", encoding="utf-8")
    return PasswordFile.load(str(path))


@pytest.fixture
def auth_net(passwords):
    auth = Auth(allow_anonymous=False, passwords=passwords)
    return Net(auth=auth), auth


def test_anonymous_refused_with_0x05_and_close():
    """[MQTT-3.2.2-4] session present 0 with a non-zero code; [MQTT-3.2.2-5] then close."""
    net = Net(auth=Auth(allow_anonymous=False))
    ch = net.channel()
    ch.receive_data(mqttraw.connect("c"), 0.0)
    assert ch.data_to_send() == h("20 02 00 05")
    assert ch.state == CLOSED
    assert len(net.owner.reasons(ch)) == 1
    assert net.owner.auth_requests == []


@pytest.mark.parametrize("user, password", [("mallory", b"x"), ("alice", None), ("alice", b"wrong")])
def test_unknown_user_and_missing_password_take_the_slow_check_like_a_known_user(auth_net, user, password):
    """No quick refusal that would tell which user names exist: every named login waits for
    the owner's check, and its refusal comes from there (0x04, then close [MQTT-3.2.2-5])."""
    net, auth = auth_net
    ch = net.channel()
    ch.receive_data(mqttraw.connect("c", username=user, password=password), 0.0)
    assert ch.state == AUTHENTICATING
    assert ch.data_to_send() == b""
    assert net.owner.auth_requests == [(ch, user, password)]
    ch.authenticated(auth.check_slow(user, password), 1.0)
    assert ch.data_to_send() == h("20 02 00 04")
    assert ch.state == CLOSED


def test_slow_auth_accepts_then_processes_pipelined_packets(auth_net):
    net, auth = auth_net
    ch = net.channel()
    ch.receive_data(
        mqttraw.connect("c", username="alice", password=b"secret")
        + mqttraw.subscribe(3, ("a", 1))
        + mqttraw.publish("a", b"x", qos=1, pid=9),
        0.0,
    )
    assert ch.state == AUTHENTICATING
    assert ch.data_to_send() == b""
    assert net.owner.auth_requests == [(ch, "alice", b"secret")]
    ch.authenticated(auth.check_slow("alice", b"secret"), 1.0)
    assert ch.state == CONNECTED
    assert ch.data_to_send() == (ACCEPTED + h("90 03 00 03 01") + h("32 06 00 01 61 00 01 78") + h("40 02 00 09"))


def test_slow_auth_packets_arriving_while_authenticating_wait(auth_net):
    net, auth = auth_net
    ch = net.channel()
    ch.receive_data(mqttraw.connect("c", username="alice", password=b"secret"), 0.0)
    ch.receive_data(mqttraw.subscribe(3, ("a", 1)), 0.5)
    assert ch.state == AUTHENTICATING
    ch.authenticated(auth.check_slow("alice", b"secret"), 1.0)
    assert ch.data_to_send() == ACCEPTED + h("90 03 00 03 01")


class _InlineAuthOwner:
    """An owner that runs the slow check at once, inside ``authenticate``."""

    def __init__(self, auth, recorder):
        self.auth, self.rec = auth, recorder

    def __getattr__(self, name):
        return getattr(self.rec, name)

    def authenticate(self, channel, user, password):
        channel.authenticated(self.auth.check_slow(user, password), 0.0)


def test_slow_auth_inline_owner(auth_net):
    net, auth = auth_net
    ch = net.channel()
    ch.owner = _InlineAuthOwner(auth, net.owner)
    ch.receive_data(mqttraw.connect("c", username="alice", password=b"secret"), 0.0)
    assert ch.data_to_send() == ACCEPTED
    assert ch.state == CONNECTED


def test_slow_auth_refused_processes_nothing_after_connect(auth_net):
    """[MQTT-3.1.4-5] nothing sent after a refused CONNECT is processed."""
    net, auth = auth_net
    ch = net.channel()
    ch.receive_data(
        mqttraw.connect("c", username="alice", password=b"wrong") + mqttraw.publish("r", b"x", retain=True), 0.0
    )
    assert net.owner.auth_requests == [(ch, "alice", b"wrong")]
    ch.authenticated(auth.check_slow("alice", b"wrong"), 1.0)
    assert ch.data_to_send() == h("20 02 00 04")
    assert ch.state == CLOSED
    ch.receive_data(mqttraw.publish("r", b"y", retain=True), 2.0)
    assert ch.data_to_send() == b""
    assert len(net.broker.retained) == 0
    assert net.broker.stats.messages_received == 0


def test_fast_refusal_processes_nothing_after_connect():
    """[MQTT-3.1.4-5]"""
    net = Net(auth=Auth(allow_anonymous=False))
    ch = net.channel()
    ch.receive_data(mqttraw.connect("c") + mqttraw.publish("r", b"x", retain=True) + mqttraw.PINGREQ_BYTES, 0.0)
    assert ch.data_to_send() == h("20 02 00 05")
    assert len(net.broker.retained) == 0
    assert len(net.owner.reasons(ch)) == 1


def test_a_remembered_login_still_goes_to_the_owner(auth_net):
    """The owner decides when to answer a login it checked before (it may have to make
    it wait: server/logins.py), so the channel asks it every time."""
    net, auth = auth_net
    ch = net.channel()
    ch.receive_data(mqttraw.connect("c1", username="alice", password=b"secret"), 0.0)
    ch.authenticated(auth.check_slow("alice", b"secret"), 0.0)
    auth.remember("alice", b"secret")
    ch2 = net.channel()
    ch2.receive_data(mqttraw.connect("c2", username="alice", password=b"secret"), 0.0)
    assert ch2.state == AUTHENTICATING
    assert len(net.owner.auth_requests) == 2


def test_refusal_sets_session_present_0_even_with_a_stored_session(auth_net):
    """[MQTT-3.2.2-4]"""
    net, auth = auth_net
    ch = net.channel()
    ch.receive_data(mqttraw.connect("c1", clean=False, username="alice", password=b"secret"), 0.0)
    ch.authenticated(auth.check_slow("alice", b"secret"), 0.0)
    ch.receive_data(mqttraw.DISCONNECT_BYTES, 0.0)
    assert "c1" in net.broker.sessions
    ch2 = net.channel()
    ch2.receive_data(mqttraw.connect("c1", clean=False, username="alice", password=b"bad"), 1.0)
    ch2.authenticated(auth.check_slow("alice", b"bad"), 1.0)
    assert ch2.data_to_send() == h("20 02 00 04")
    assert "c1" in net.broker.sessions  # a refused CONNECT does not touch the session


def test_authenticated_after_connection_lost_is_ignored(auth_net):
    net, auth = auth_net
    ch = net.channel()
    ch.receive_data(mqttraw.connect("c", username="alice", password=b"secret"), 0.0)
    ch.connection_lost(0.5)
    ch.authenticated(0, 1.0)
    assert ch.state == CLOSED
    assert ch.data_to_send() == b""
    assert net.broker.sessions == {}


# --------------------------------------------------------------------------- takeover, session present


def test_takeover_closes_the_old_connection_and_publishes_its_will(net):
    """[MQTT-3.1.4-2]"""
    watcher = net.subscriber("w", ("will/#", 1))
    old = net.connect("dup", will=("will/dup", b"gone", 1, False))
    new = net.connect("dup", now=5.0)
    assert old.state == CLOSED
    assert len(net.owner.reasons(old)) == 1
    assert new.state == CONNECTED
    assert net.broker.sessions["dup"].channel is new
    assert publishes(watcher) == [("will/dup", b"gone", 1, False, False, 1)]
    old.connection_lost(6.0)  # the socket of the old one goes away later
    assert publishes(watcher) == []
    assert net.broker.sessions["dup"].channel is new


def test_takeover_of_a_persistent_session_keeps_it(net):
    old = net.subscriber("p", ("a", 1), clean=False)
    new = net.connect("p", clean=False, expect=ACCEPTED_PRESENT)  # [MQTT-3.2.2-2]
    assert old.state == CLOSED
    pub = net.connect("pub")
    pub.receive_data(mqttraw.publish("a", b"x", qos=1, pid=1), 0.0)
    assert publishes(new) == [("a", b"x", 1, False, False, 1)]
    assert publishes(old) == []


def test_session_present_flags(net):
    """[MQTT-3.2.2-1] clean: 0; [MQTT-3.2.2-3] no stored session: 0; [MQTT-3.2.2-2] stored: 1."""
    ch = net.connect("c", clean=True, expect=ACCEPTED)
    ch.receive_data(mqttraw.DISCONNECT_BYTES, 0.0)
    ch = net.connect("c", clean=False, expect=ACCEPTED)
    ch.receive_data(mqttraw.subscribe(1, ("a", 1)) + mqttraw.DISCONNECT_BYTES, 0.0)
    ch = net.connect("c", clean=False, expect=ACCEPTED_PRESENT)
    ch.connection_lost(1.0)
    ch = net.connect("c", clean=True, expect=ACCEPTED)  # discards the stored session [MQTT-3.1.2-6]
    ch.receive_data(mqttraw.DISCONNECT_BYTES, 0.0)
    ch = net.connect("c", clean=False, expect=ACCEPTED)
    assert net.broker.sessions["c"].subscriptions == {}


def test_clean_session_ends_with_the_connection(net):
    """[MQTT-3.1.2-6]"""
    ch = net.subscriber("c", ("a/#", 1))
    ch.receive_data(mqttraw.DISCONNECT_BYTES, 0.0)
    assert "c" not in net.broker.sessions
    assert len(net.broker.trie) == 0


def test_persistent_session_keeps_messages_while_offline(net):
    """[MQTT-3.1.2-4] [MQTT-3.1.2-5] QoS 1/2 stored while offline, QoS 0 not."""
    ch = net.subscriber("c", ("a", 2), clean=False)
    ch.receive_data(mqttraw.DISCONNECT_BYTES, 0.0)
    pub = net.connect("pub")
    pub.receive_data(
        mqttraw.publish("a", b"0")
        + mqttraw.publish("a", b"1", qos=1, pid=1)
        + mqttraw.publish("a", b"2", qos=2, pid=2),
        0.0,
    )
    ch = net.connect("c", clean=False, expect=ACCEPTED_PRESENT)
    assert publishes(ch) == [("a", b"1", 1, False, False, 1), ("a", b"2", 2, False, False, 2)]


def test_reconnect_resends_unacknowledged_with_dup(net):
    """[MQTT-4.4.0-1] [MQTT-3.3.1-1]"""
    ch = net.subscriber("c", ("a", 2), clean=False)
    pub = net.connect("pub")
    pub.receive_data(mqttraw.publish("a", b"1", qos=1, pid=1) + mqttraw.publish("a", b"2", qos=2, pid=2), 0.0)
    assert publishes(ch) == [("a", b"1", 1, False, False, 1), ("a", b"2", 2, False, False, 2)]
    ch.receive_data(mqttraw.pubrec(2), 0.0)
    assert out(ch)[0].type == mqttraw.PUBREL
    ch.connection_lost(1.0)
    ch = net.channel(2.0)
    ch.receive_data(mqttraw.connect("c", clean=False), 2.0)
    assert ch.data_to_send() == ACCEPTED_PRESENT + h("3a 06 00 01 61 00 01 31") + h("62 02 00 02")


# --------------------------------------------------------------------------- keepalive and timeouts


def test_keepalive_one_and_a_half_times():
    """[MQTT-3.1.2-24]"""
    net = Net()
    watcher = net.subscriber("w", ("will", 0))
    ch = net.connect("c", now=100.0, keepalive=10, will=("will", b"bye", 0, False))
    assert ch.deadline() == 115.0
    ch.tick(114.9)
    assert ch.state == CONNECTED
    ch.receive_data(mqttraw.PINGREQ_BYTES, 105.0)
    assert ch.data_to_send() == h("d0 00")  # [MQTT-3.12.4-1]
    assert ch.deadline() == 120.0
    ch.tick(119.99)
    assert ch.state == CONNECTED
    assert net.owner.reasons(ch) == []
    ch.tick(120.0)
    assert ch.state == CLOSED
    [reason] = net.owner.reasons(ch)
    assert "keepalive" in reason
    assert publishes(watcher) == [("will", b"bye", 0, False, False, None)]  # as if the network failed


def test_keepalive_zero_has_no_deadline():
    net = Net()
    ch = net.connect("c", keepalive=0)
    assert ch.deadline() is None
    ch.tick(1e9)
    assert ch.state == CONNECTED


def test_connect_timeout():
    net = Net(connect_timeout=10.0)
    ch = net.channel(now=50.0)
    assert ch.deadline() == 60.0
    ch.tick(59.9)
    assert ch.state == AWAIT_CONNECT
    ch.tick(60.0)
    assert ch.state == CLOSED
    assert len(net.owner.reasons(ch)) == 1
    assert ch.data_to_send() == b""


def test_partial_connect_does_not_connect_and_still_times_out():
    net = Net(connect_timeout=10.0)
    ch = net.channel(now=0.0)
    raw = mqttraw.connect("c")
    ch.receive_data(raw[:-1], 1.0)
    assert ch.state == AWAIT_CONNECT and ch.data_to_send() == b""
    ch.tick(10.0)
    assert ch.state == CLOSED


# --------------------------------------------------------------------------- wills


@pytest.mark.parametrize("end", ["close", "connection_lost", "malformed"])
def test_will_published_when_the_connection_ends_without_disconnect(net, end):
    """[MQTT-3.1.2-8]"""
    watcher = net.subscriber("w", ("will/#", 2))
    ch = net.connect("c", will=("will/c", b"bye", 1, False))
    if end == "close":
        ch.close("server shutdown")
    elif end == "connection_lost":
        ch.connection_lost(1.0)
    else:
        ch.receive_data(h("36 05 00 01 61 00 01"), 1.0)  # QoS 3: malformed
    assert publishes(watcher) == [("will/c", b"bye", 1, False, False, 1)]
    ch.connection_lost(2.0)
    ch.close("again")
    assert publishes(watcher) == []  # [MQTT-3.1.2-10] once


def test_no_will_after_disconnect(net):
    """[MQTT-3.14.4-3]"""
    watcher = net.subscriber("w", ("will/#", 2))
    ch = net.connect("c", will=("will/c", b"bye", 1, True))
    ch.receive_data(mqttraw.DISCONNECT_BYTES, 1.0)
    assert ch.state == CLOSED
    assert ch.clean_disconnect
    assert len(net.owner.reasons(ch)) == 1
    ch.connection_lost(1.5)
    assert publishes(watcher) == []
    assert len(net.broker.retained) == 0


def test_no_will_without_will_flag(net):
    """[MQTT-3.1.2-12]"""
    watcher = net.subscriber("w", ("#", 2))
    ch = net.connect("c")
    ch.connection_lost(1.0)
    assert publishes(watcher) == []


def test_will_retain_1_is_published_retained(net):
    """[MQTT-3.1.2-17] retained for later subscribers; live subscribers get RETAIN=0 [MQTT-3.3.1-9]."""
    watcher = net.subscriber("w", ("will/#", 2))
    ch = net.connect("c", will=("will/c", b"bye", 2, True))
    ch.connection_lost(1.0)
    assert publishes(watcher) == [("will/c", b"bye", 2, False, False, 1)]
    later = net.subscriber("later", ("will/#", 2))
    assert publishes(later) == [("will/c", b"bye", 2, True, False, 1)]


def test_will_retain_0_is_not_retained(net):
    """[MQTT-3.1.2-16]"""
    ch = net.connect("c", will=("will/c", b"bye", 0, False))
    ch.connection_lost(1.0)
    later = net.subscriber("later", ("will/#", 2))
    assert publishes(later) == []
    assert len(net.broker.retained) == 0


def test_the_will_is_numbered_at_connect_and_its_message_takes_that_number(net):
    """The sequence number of a will's message is reserved at CONNECT (whichever node
    publishes it publishes the same message) and kept on the Channel's copy of the will
    (``Will.seq``: no slot of the Channel's for it, issue 26); a client without one keeps 0."""
    got = []
    watcher = net.subscriber("w", ("will/#", 1))
    watcher.session.adapt(deliver=lambda msg, qos, retain=False: got.append(msg))
    plain = net.connect("p")
    assert plain.will is None and plain.will_seq == 0
    first = net.connect("c", will=("will/c", b"bye", 1, False))
    second = net.connect("d", will=("will/d", b"bye", 1, False))
    seq = first.will_seq
    assert seq > 0 and second.will_seq not in (0, seq)
    assert first.will == Will("will/c", b"bye", 1, False, None, seq)
    first.connection_lost(1.0)
    assert [(m.topic, m.origin, m.seq) for m in got] == [("will/c", "n1", seq)]
    assert first.will is None and first.will_seq == 0  # [MQTT-3.1.2-10]


def test_the_codec_leaves_a_will_unnumbered():
    """``Will.seq`` is the node's, not the wire's: decoding gives 0, and ``numbered`` makes a
    copy, the packet's own unchanged."""
    decoder = Decoder()
    decoder.feed(mqttraw.connect("c", will=("will/c", b"bye", 1, True)))
    (pkt,) = decoder.packets()
    assert pkt.will == Will("will/c", b"bye", 1, True) and pkt.will.seq == 0
    numbered = pkt.will.numbered(7)
    assert (numbered.topic, numbered.payload, numbered.qos, numbered.retain, numbered.seq) == (
        "will/c",
        b"bye",
        1,
        True,
        7,
    )
    assert pkt.will.seq == 0 and numbered != pkt.will


def test_an_idle_channel_keeps_no_will_number_nor_peer_flag_of_its_own(net):
    """A connected 3.1.1 client's Channel (issue 26): the will's number is ``Will.seq``, a
    peer link is ``peer_node`` set (``is_peer``); CPython 3.11, 64-bit: 240 bytes with the GC
    header (256 with a slot for each)."""
    ch = net.subscriber("c", ("idle/c/#", 1))
    assert not ch.is_peer and ch.peer_node is None and not hasattr(ch, "__dict__")
    if sys.version_info[:2] == (3, 11) and sys.maxsize > 2**32:
        assert sys.getsizeof(ch) == 240


def test_refused_connect_has_no_will(passwords):
    net = Net(auth=Auth(allow_anonymous=True, passwords=passwords))
    watcher = net.subscriber("w", ("#", 0))
    ch = net.channel()
    ch.receive_data(mqttraw.connect("c", username="mallory", password=b"x", will=("will", b"bye", 0, False)), 0.0)
    ch.authenticated(net.broker.auth.check_slow("mallory", b"x"), 0.5)
    assert ch.data_to_send() == h("20 02 00 04")
    ch.connection_lost(1.0)
    assert publishes(watcher) == []


# --------------------------------------------------------------------------- the transition table

CLIENT_BYTES = {
    CONNECT: mqttraw.connect("x"),
    CONNACK: h("20 02 00 00"),
    PUBLISH: h("30 03 00 01 74"),
    PUBACK: h("40 02 00 01"),
    PUBREC: h("50 02 00 01"),
    PUBREL: h("62 02 00 01"),
    PUBCOMP: h("70 02 00 01"),
    SUBSCRIBE: h("82 06 00 01 00 01 61 00"),
    SUBACK: h("90 03 00 01 00"),
    UNSUBSCRIBE: h("a2 05 00 01 00 01 61"),
    UNSUBACK: h("b0 02 00 01"),
    PINGREQ: h("c0 00"),
    PINGRESP: h("d0 00"),
    DISCONNECT: h("e0 00"),
}


def test_transition_table_contents():
    assert set(TRANSITIONS[AWAIT_CONNECT]) == {CONNECT}
    assert set(TRANSITIONS[CONNECTED]) == {
        PUBLISH,
        PUBACK,
        PUBREC,
        PUBREL,
        PUBCOMP,
        SUBSCRIBE,
        UNSUBSCRIBE,
        PINGREQ,
        DISCONNECT,
    }
    assert TRANSITIONS[CLOSED] == {}


@pytest.mark.parametrize("ptype", sorted(set(CLIENT_BYTES) - set(TRANSITIONS[AWAIT_CONNECT])))
def test_first_packet_not_connect_closes(net, ptype):
    """[MQTT-3.1.0-1]"""
    ch = net.channel()
    ch.receive_data(CLIENT_BYTES[ptype], 0.0)
    assert ch.state == CLOSED
    assert ch.data_to_send() == b""
    [reason] = net.owner.reasons(ch)
    assert "[MQTT-3.1.0-1]" in reason


@pytest.mark.parametrize("ptype", sorted(set(CLIENT_BYTES) - set(TRANSITIONS[CONNECTED])))
def test_packet_not_in_table_when_connected_closes(net, ptype):
    """[MQTT-3.1.0-2] a second CONNECT; server-only packets from a client [MQTT-4.8.0-1]."""
    watcher = net.subscriber("w", ("will", 0))
    ch = net.connect("c", will=("will", b"bye", 0, False))
    ch.receive_data(CLIENT_BYTES[ptype] + mqttraw.PINGREQ_BYTES, 1.0)
    assert ch.state == CLOSED
    assert ch.data_to_send() == b""  # not even the PINGRESP behind it
    [reason] = net.owner.reasons(ch)
    assert SPEC_ID.search(reason), reason
    if ptype == CONNECT:
        assert "[MQTT-3.1.0-2]" in reason
    assert publishes(watcher) == [("will", b"bye", 0, False, False, None)]


@pytest.mark.parametrize("ptype", sorted(TRANSITIONS[CONNECTED]))
def test_packets_in_table_when_connected_do_not_close(net, ptype):
    ch = net.connect("c")
    ch.receive_data(CLIENT_BYTES[ptype], 1.0)
    assert ch.state == (CLOSED if ptype == DISCONNECT else CONNECTED)
    if ptype != DISCONNECT:
        assert net.owner.reasons(ch) == []


def test_second_connect_pipelined_behind_a_slow_auth_closes(auth_net):
    net, auth = auth_net
    ch = net.channel()
    ch.receive_data(mqttraw.connect("c", username="alice", password=b"secret") + mqttraw.connect("c"), 0.0)
    ch.authenticated(auth.check_slow("alice", b"secret"), 1.0)
    assert ch.data_to_send() == ACCEPTED
    assert ch.state == CLOSED
    assert "[MQTT-3.1.0-2]" in net.owner.reasons(ch)[0]


def test_nothing_processed_after_close(net):
    ch = net.connect("c")
    ch.close("bye")
    ch.receive_data(mqttraw.PINGREQ_BYTES + mqttraw.subscribe(1, ("a", 0)), 1.0)
    assert ch.data_to_send() == b""
    assert len(net.owner.reasons(ch)) == 1
    assert len(net.broker.trie) == 0


@pytest.mark.parametrize(
    "raw, rule",
    [
        (h("36 05 00 01 61 00 01"), "MQTT-3.3.1-4"),
        (h("80 06 00 01 00 01 61 00"), "MQTT-3.8.1-1"),
        (h("30 03 00 01 23"), "MQTT-3.3.2-2"),
        (h("82 02 00 01"), "MQTT-3.8.3-3"),
        (h("30 05 00 03 ed a0 80"), "MQTT-1.5.3-1"),
    ],
)
def test_malformed_packet_closes_with_its_rule(net, raw, rule):
    ch = net.connect("c")
    ch.receive_data(raw, 1.0)
    assert ch.state == CLOSED
    assert ch.data_to_send() == b""
    assert f"[{rule}]" in net.owner.reasons(ch)[0]
    assert net.broker.stats.protocol_errors == 1


def test_packet_over_max_packet_size_closes():
    net = Net(max_packet_size=100)
    ch = net.connect("c")
    ch.receive_data(mqttraw.publish("t", b"x" * 200)[:3], 1.0)  # the header says 205 bytes
    assert ch.state == CLOSED
    assert len(net.owner.reasons(ch)) == 1


def test_durable_session_discarded_then_recreated_journals_the_delete():
    j = Journal()
    net = Net(journal=j)
    ch = net.connect("c", clean=False)
    ch.receive_data(mqttraw.subscribe(1, ("a", 1)), 0.0)
    ch.receive_data(mqttraw.DISCONNECT_BYTES, 0.0)
    pub = net.connect("pub")
    pub.receive_data(mqttraw.publish("a", b"queued", qos=1, pid=1), 0.0)
    j.take()  # committed: the store holds session c with one queued message
    ch = net.connect("c", clean=True)
    ch.receive_data(mqttraw.DISCONNECT_BYTES, 0.0)
    net.connect("c", clean=False)
    ops = j.take()[1]
    assert ("session_delete", "c") in ops
    assert ops.index(("session_delete", "c")) < ops.index(("session_put", "c", {}, None))


# --------------------------------------------------------------------------- before CONNACK (issue 13)


def test_first_byte_not_connect_closes_at_once_without_waiting_for_the_body(net):
    """[MQTT-3.1.0-1] a PUBLISH header announcing 2 MB as the first bytes: refused at once."""
    ch = net.channel()
    ch.receive_data(b"\x30\xff\xff\x7f", 0.0)
    assert ch.state == CLOSED
    assert "[MQTT-3.1.0-1]" in net.owner.reasons(ch)[0]
    assert ch.data_to_send() == b""  # no CONNACK to a client that never sent CONNECT


def test_connect_with_reserved_flags_closes_at_the_first_byte(net):
    """[MQTT-2.2.2-2] CONNECT's flags are reserved (0): 0x12 is refused before its body."""
    ch = net.channel()
    ch.receive_data(b"\x12", 0.0)
    assert ch.state == CLOSED
    assert "[MQTT-2.2.2-2]" in net.owner.reasons(ch)[0]


def test_connect_larger_than_max_connect_size_is_refused_from_its_header():
    net = Net(max_connect_size=1024)
    ch = net.channel()
    big = mqttraw.connect("c", username="u", password=b"p" * 2000)
    ch.receive_data(big[:4], 0.0)  # the fixed header says 2 kB
    assert ch.state == CLOSED
    assert "maximum packet size 1024" in net.owner.reasons(ch)[0]


def test_after_connack_the_ordinary_packet_size_limit_applies():
    net = Net(max_connect_size=1024, max_packet_size=1 << 20)
    ch = net.channel()
    ch.receive_data(mqttraw.connect("c") + mqttraw.subscribe(1, ("t", 0)), 0.0)
    ch.receive_data(mqttraw.publish("t", b"x" * 100_000), 0.1)
    assert ch.state == CONNECTED
    assert len(ch.data_to_send()) > 100_000  # the SUBACK, then the message delivered back


def test_bytes_piling_up_while_the_password_is_checked_close_the_connection(auth_net):
    """The I/O layer stops reading during the check (server/connection.py); if bytes still
    arrive, more than one read's worth behind the CONNECT ends the connection."""
    from mqttmesh.channel import PREAUTH_READ_SLACK

    net, _ = auth_net
    ch = net.channel()
    ch.receive_data(mqttraw.connect("c", username="alice", password=b"secret"), 0.0)
    assert ch.state == AUTHENTICATING
    ch.receive_data(b"\x30" + b"\x00" * PREAUTH_READ_SLACK, 0.1)
    assert ch.state == AUTHENTICATING
    ch.receive_data(b"\x00" * 70_000, 0.2)
    assert ch.state == CLOSED
    assert "before CONNACK" in net.owner.reasons(ch)[0]


# --------------------------------------------------------------------------- small ports of the Channel


class _Claims:
    """A mesh that takes the claim and answers later (mesh/cluster/cluster.py Cluster.connect)."""

    def __init__(self):
        self.calls = []

    def connect(self, channel, client_id, clean, will, now, will_seq=0, fresh=None, expiry=0xFFFFFFFF):
        self.calls.append((channel, client_id))

    def disconnected(self, channel, now, delayed=False):
        self.calls.append((channel, "disconnected"))


def test_claiming_is_true_while_the_mesh_claims_the_client_id(net):
    claims = _Claims()
    ch = Channel(net.broker, net.owner, "peer", 0.0, claims=claims)
    assert ch.claiming is False
    ch.receive_data(mqttraw.connect("c"), 0.0)
    assert ch.state is CLAIMING and ch.claiming is True
    assert claims.calls == [(ch, "c")]
    session, _ = net.broker.table.open_session(ch, "c", True, 0.0)
    ch.claimed(session, False, 1.0)
    assert ch.state is CONNECTED and ch.claiming is False
    assert net.owner.connects == [ch]


def test_a_refused_claim_answers_the_connect_with_its_code_and_closes(net):
    # room for issue 15 (fencing): the ClaimPort may refuse; nothing refuses yet
    claims = _Claims()
    ch = Channel(net.broker, net.owner, "peer", 0.0, claims=claims)
    ch.receive_data(mqttraw.connect("c", will=("w", b"gone", 0, False)), 0.0)
    assert ch.claiming
    ch.refused(0x03, "registrar unreachable", 1.0)
    assert ch.data_to_send() == h("20 02 00 03")  # session present 0 [MQTT-3.2.2-4]
    assert ch.state is CLOSED and "0x03" in ch.close_reason and "registrar unreachable" in ch.close_reason
    assert claims.calls == [(ch, "c")]  # never connected: no disconnected(), and no will
    assert net.broker.stats.wills_published == 0
    ch.refused(0x03, "twice", 2.0)  # only a claiming channel is answered
    assert ch.data_to_send() == b""


def test_a_channel_is_paused_and_resumed_through_its_owner_while_connected(net):
    """flow.py pauses a publisher as a ports.Pausable; the Channel asks its owner."""
    congestion = Congestion(backpressure_timeout=1.0)
    slow = object()
    congestion.add(slow, "queue")
    ch = net.connect("p")
    congestion.hold(ch, congestion.check([slow]), 0.0)
    assert net.owner.paused == [ch]
    congestion.remove(slow, "queue")
    assert net.owner.resumed == [ch]
    other = net.connect("q")
    congestion.add(slow, "queue")
    congestion.hold(other, congestion.check([slow]), 0.0)
    other.state = CLOSED  # (closed without the Channel's own unpause)
    congestion.remove(slow, "queue")
    assert net.owner.resumed == [ch]  # a closed channel's socket is not touched
