"""The server Connection's own fields (server/connection.py): what a plain connection keeps
and what only a TLS listener's does (issue 26: an idle client's bytes). The Connection's
behaviour over real sockets is the integration tests'."""

from __future__ import annotations

import sys

import pytest

from mqttmesh.server.connection import Connection, TlsConnection, accepted


class _Node:
    """The node a Connection is made with (it keeps it; nothing here calls it)."""


def test_a_plain_connection_has_no_accept_time_nor_address_of_its_own():
    conn = accepted(_Node())
    assert type(conn) is Connection
    assert conn.accepted_at is None and conn.peer == "?"  # (no transport yet: its address comes from it)
    with pytest.raises(AttributeError):
        conn.peer = "127.0.0.1:1883"  # type: ignore[misc]  # (a plain connection has no slot for it)
    with pytest.raises(AttributeError):
        conn.accepted_at = 1.0


def test_a_tls_connection_keeps_its_accept_time_and_the_address_accept_gave():
    conn = accepted(_Node(), 12.5)
    assert type(conn) is TlsConnection and conn.accepted_at == 12.5
    assert conn.peer == "?"
    conn.peer = "127.0.0.1:40123"
    assert conn.peer == "127.0.0.1:40123"


def test_announced_is_the_time_of_connack():
    """``announced`` (CONNACK 0 sent) is ``connected_at`` set: no flag of its own."""
    conn = Connection(_Node())
    assert not conn.announced and conn.connected_at is None
    conn.connected_at = 3.0
    assert conn.announced


def test_a_plain_connection_is_two_slots_smaller_than_a_tls_one():
    """Guards the size of every connection (CPython 3.11, 64-bit: 144 bytes with the GC header;
    it was 176 with the TLS fields, a write-only ``paused`` and an ``announced`` flag)."""
    plain, tls = Connection(_Node()), TlsConnection(_Node(), 0.0)
    assert not hasattr(plain, "__dict__") and not hasattr(tls, "__dict__")
    assert sys.getsizeof(tls) - sys.getsizeof(plain) == 16
    if sys.version_info[:2] == (3, 11) and sys.maxsize > 2**32:
        assert sys.getsizeof(plain) == 144
