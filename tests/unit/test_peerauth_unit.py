"""mqttmesh.mesh.link.peerauth: the fields and proofs of the peer handshake (version 6; versions 2
to 5 had the same fields).

The expected MACs are computed here from the transcript as docs/design.md 2.6 states it,
with hmac and hashlib directly, so a mistake mirrored in making and checking a proof
cannot hide.
"""

from __future__ import annotations

import hashlib
import hmac

import pytest

from mqttmesh.mesh.link.peerauth import (
    NONCE_BYTES,
    PEER_PROTOCOL,
    DiallerAuth,
    Handshake,
    ListenerAuth,
    PeerAuthError,
    PeerConnect,
    parse_connect,
)
from support.frames import v1_token

SECRET = b"cluster-secret"
ND = bytes(range(16))  # the dialler's nonce
NL = bytes(range(100, 116))  # the listener's nonce
V = str(PEER_PROTOCOL).encode()  # the version, as the password spells it


def expected_mac(secret, label, dialler, d_inc, listener, l_inc, nd_hex, nl_hex, version=PEER_PROTOCOL):
    fields = ["mqttmesh-peer", label, str(version), dialler, str(d_inc), listener, str(l_inc), nd_hex, nl_hex]
    text = "".join(f"{len(f)}:{f}," for f in fields)
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()


def pair(d_secret=SECRET, l_secret=SECRET, nd=ND, nl=NL):
    dialler = DiallerAuth(d_secret, "a", 7, nd)
    listener = ListenerAuth(l_secret, "b", 9, nl, parse_connect(dialler.password()))
    return dialler, listener


# --------------------------------------------------------------------------- the CONNECT password


def test_the_peer_protocol_version():
    # (7: MQTT 5 properties in envelopes and cluster messages; 8: what is left of an expiring
    # message's life, issue 23; 9: unicast records say how long they were on the way; 10: a
    # release says when its claim was never accepted, reg.release "refused"; 11: and how long
    # ago its connection ended, with its delayed will, "ago" and "will"; 12: envelopes of
    # format 6, with the shared groups each destination serves; 13: a snapshot's entries and a
    # forwarded message name a shared group's re-send's root)
    assert PEER_PROTOCOL == 13
    assert NONCE_BYTES == 16


def test_dialler_password_fields():
    assert DiallerAuth(SECRET, "a", 7, ND).password() == V + b"|a|7|" + ND.hex().encode()
    assert parse_connect(V + b"|a|7|" + ND.hex().encode()) == PeerConnect(PEER_PROTOCOL, "a", 7, ND.hex())


def test_password_carries_no_mac_and_no_clock():
    # the same node and nonce give the same password whenever it is made
    assert DiallerAuth(SECRET, "a", 7, ND).password() == DiallerAuth(b"other", "a", 7, ND).password()


def test_version_1_token_is_recognised_as_version_1():
    got = parse_connect(v1_token(SECRET, "old", 3, 1_700_000_000))
    assert (got.version, got.node, got.incarnation) == (1, "old", 3)
    # a node named like a version number still reads as version 1 (its MAC has 64 hex digits)
    got = parse_connect(v1_token(SECRET, "2", 3, 1_700_000_000))
    assert (got.version, got.node) == (1, "2")


def test_other_versions_are_reported_with_their_number():
    assert parse_connect(b"%d|a|7|whatever|else" % (PEER_PROTOCOL + 1)).version == PEER_PROTOCOL + 1
    assert parse_connect(b"1").version == 1


@pytest.mark.parametrize(
    "password",
    [
        None,
        b"",
        b"\xff\xfe",
        V + "|é|1|".encode() + b"00" * 16,
        V + b"|a|7",  # 3 fields
        V + b"|a|7|" + b"00" * 16 + b"|x",  # 5 fields
        V + b"||7|" + b"00" * 16,  # no node
        V + b"|a b|7|" + b"00" * 16,  # a space in the node id
        V + b"|a|x|" + b"00" * 16,  # incarnation not a number
        V + b"|a|-1|" + b"00" * 16,
        V + b"|a|07|" + b"00" * 16,  # one spelling per number
        V + b"|a|7|" + b"00" * 15,  # nonce too short
        V + b"|a|7|" + b"00" * 17,  # too long
        V + b"|a|7|" + b"AB" * 16,  # upper case
        V + b"|a|7|" + b"zz" * 16,
        b"x|a|7|" + b"00" * 16,  # no version
        b"04|a|7|" + b"00" * 16,
    ],
)
def test_malformed_passwords_are_refused(password):
    with pytest.raises(PeerAuthError):
        parse_connect(password)


@pytest.mark.parametrize("nonce", [b"", bytes(15), bytes(17), "00" * 16])
def test_a_nonce_is_sixteen_bytes(nonce):
    with pytest.raises(ValueError):
        DiallerAuth(SECRET, "a", 7, nonce)
    with pytest.raises(ValueError):
        ListenerAuth(SECRET, "b", 9, nonce, PeerConnect(PEER_PROTOCOL, "a", 7, ND.hex()))


def test_no_secret_no_handshake():
    with pytest.raises(ValueError):
        DiallerAuth(b"", "a", 7, ND)
    with pytest.raises(ValueError):
        ListenerAuth(b"", "b", 9, NL, PeerConnect(PEER_PROTOCOL, "a", 7, ND.hex()))


def test_listener_refuses_to_start_a_handshake_of_another_version():
    with pytest.raises(ValueError):
        ListenerAuth(SECRET, "b", 9, NL, PeerConnect(1, "a", 7, ""))


# --------------------------------------------------------------------------- the proofs


def test_challenge_is_the_listeners_fields_and_mac_over_the_transcript():
    _, listener = pair()
    mac = expected_mac(SECRET, "listener", "a", 7, "b", 9, ND.hex(), NL.hex())
    assert listener.challenge() == f"b|9|{NL.hex()}|{mac}".encode()


def test_dialler_proof_is_the_mac_over_the_transcript():
    dialler, listener = pair()
    hs = dialler.check_listener(listener.challenge())
    assert hs == Handshake("a", 7, ND.hex(), "b", 9, NL.hex(), PEER_PROTOCOL)
    assert dialler.proof(hs) == expected_mac(SECRET, "dialler", "a", 7, "b", 9, ND.hex(), NL.hex()).encode()


def test_both_proofs_verify():
    dialler, listener = pair()
    hs = dialler.check_listener(listener.challenge())
    listener.check_dialler(dialler.proof(hs))  # no exception


def test_listener_without_the_secret_is_refused_by_the_dialler():
    dialler, listener = pair(l_secret=b"wrong")
    with pytest.raises(PeerAuthError, match="failed to prove"):
        dialler.check_listener(listener.challenge())


def test_dialler_without_the_secret_is_refused_by_the_listener():
    dialler, listener = pair(d_secret=b"wrong")
    # (a dialler without the secret cannot check the challenge either; it answers anyway)
    hs = Handshake("a", 7, ND.hex(), "b", 9, NL.hex())
    with pytest.raises(PeerAuthError, match="failed to prove"):
        listener.check_dialler(dialler.proof(hs))


def test_reflected_proof_is_refused_both_ways():
    dialler, listener = pair()
    challenge = listener.challenge()
    listener_mac = challenge.rsplit(b"|", 1)[1]
    # the listener's own MAC sent back to it as the dialler's answer
    with pytest.raises(PeerAuthError):
        listener.check_dialler(listener_mac)
    # a dialler's MAC (label "dialler") presented as a listener's proof
    hs = dialler.check_listener(challenge)
    forged = challenge.rsplit(b"|", 1)[0] + b"|" + dialler.proof(hs)
    with pytest.raises(PeerAuthError):
        DiallerAuth(SECRET, "a", 7, ND).check_listener(forged)


def test_mac_with_swapped_label_is_refused():
    dialler, listener = pair()
    swapped = expected_mac(SECRET, "dialler", "a", 7, "b", 9, ND.hex(), NL.hex())
    with pytest.raises(PeerAuthError):
        dialler.check_listener(f"b|9|{NL.hex()}|{swapped}".encode())
    swapped = expected_mac(SECRET, "listener", "a", 7, "b", 9, ND.hex(), NL.hex())
    with pytest.raises(PeerAuthError):
        listener.check_dialler(swapped.encode())


@pytest.mark.parametrize("field,value", [("listener", "c"), ("l_inc", 10), ("nl", "11" * 16)])
def test_challenge_with_other_fields_than_its_mac_covers_is_refused(field, value):
    dialler, _ = pair()
    mac = expected_mac(SECRET, "listener", "a", 7, "b", 9, ND.hex(), NL.hex())
    fields = {"listener": "b", "l_inc": 9, "nl": NL.hex()}
    fields[field] = value
    with pytest.raises(PeerAuthError):
        dialler.check_listener(f"{fields['listener']}|{fields['l_inc']}|{fields['nl']}|{mac}".encode())


@pytest.mark.parametrize("dialler,d_inc", [("x", 7), ("a", 8)])
def test_proof_made_for_another_dialler_is_refused(dialler, d_inc):
    _, listener = pair()
    mac = expected_mac(SECRET, "dialler", dialler, d_inc, "b", 9, ND.hex(), NL.hex())
    with pytest.raises(PeerAuthError):
        listener.check_dialler(mac.encode())
    # and a listener's proof made for another dialler
    mac = expected_mac(SECRET, "listener", dialler, d_inc, "b", 9, ND.hex(), NL.hex())
    with pytest.raises(PeerAuthError):
        DiallerAuth(SECRET, "a", 7, ND).check_listener(f"b|9|{NL.hex()}|{mac}".encode())


def test_stale_challenge_from_an_earlier_connection_is_refused():
    old_dialler, old_listener = pair(nd=bytes(16))
    recorded = old_listener.challenge()
    old_dialler.check_listener(recorded)  # fine on its own connection
    with pytest.raises(PeerAuthError):
        DiallerAuth(SECRET, "a", 7, ND).check_listener(recorded)  # a new connection, a new nonce


def test_replayed_dialler_proof_is_refused_by_a_fresh_listener():
    dialler, listener = pair()
    recorded = dialler.proof(dialler.check_listener(listener.challenge()))
    # the same CONNECT replayed: the listener (this one or another) draws a new nonce
    for node in ("b", "c"):
        fresh = ListenerAuth(SECRET, node, 9, bytes(range(200, 216)), parse_connect(dialler.password()))
        with pytest.raises(PeerAuthError):
            fresh.check_dialler(recorded)


def test_proof_of_another_version_is_refused():
    dialler, listener = pair()
    mac = expected_mac(SECRET, "listener", "a", 7, "b", 9, ND.hex(), NL.hex(), version=PEER_PROTOCOL + 1)
    with pytest.raises(PeerAuthError):
        dialler.check_listener(f"b|9|{NL.hex()}|{mac}".encode())
    hs = Handshake("a", 7, ND.hex(), "b", 9, NL.hex(), version=1)
    with pytest.raises(PeerAuthError):
        listener.check_dialler(hs.mac(SECRET, "dialler").encode())


def test_listener_claiming_the_diallers_own_id_is_refused():
    dialler = DiallerAuth(SECRET, "a", 7, ND)
    listener = ListenerAuth(SECRET, "a", 9, NL, parse_connect(dialler.password()))
    with pytest.raises(PeerAuthError, match="own id"):
        dialler.check_listener(listener.challenge())


@pytest.mark.parametrize(
    "payload",
    [
        None,
        b"",
        b"\xff",
        b"b|9|x",
        b"b|9|" + NL.hex().encode() + b"|" + b"0" * 63,
        b"b|9|" + NL.hex().encode() + b"|" + b"0" * 64 + b"|extra",
        b"b|x|" + NL.hex().encode() + b"|" + b"0" * 64,
        b"b|9|" + NL.hex()[:-2].encode() + b"|" + b"0" * 64,
        b"b|9|" + NL.hex().encode() + b"|" + b"A" * 64,
        b"|9|" + NL.hex().encode() + b"|" + b"0" * 64,
        b"b|9|" + NL.hex().encode() + b"|" + "é".encode() * 32,
    ],
)
def test_malformed_challenges_are_refused(payload):
    with pytest.raises(PeerAuthError):
        DiallerAuth(SECRET, "a", 7, ND).check_listener(payload)


@pytest.mark.parametrize("payload", [None, b"", b"0" * 63, b"0" * 65, b"A" * 64, "é".encode() * 32, b"0" * 64 + b"\n"])
def test_malformed_dialler_proofs_are_refused(payload):
    _, listener = pair()
    with pytest.raises(PeerAuthError):
        listener.check_dialler(payload)
