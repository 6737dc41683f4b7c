"""server/logins.py's pure helpers: what failures are counted against, how user names are logged."""

from __future__ import annotations

import pytest

from mqttmesh.server.logins import address_key, quote_user


@pytest.mark.parametrize(
    "peername, key",
    [
        (("203.0.113.7", 51234), "203.0.113.7"),
        (("2001:db8:1:2:3:4:5:6", 1883, 0, 0), "2001:db8:1:2::/64"),  # one host's usual share
        (("2001:db8:1:2:ffff::1", 1883, 0, 0), "2001:db8:1:2::/64"),
        (("::ffff:198.51.100.2", 1883, 0, 0), "198.51.100.2"),  # IPv4-mapped
        (("fe80::1%eth0", 1883, 0, 2), "fe80::/64"),
        ("", ""),  # a Unix socket
    ],
)
def test_address_key(peername, key):
    assert address_key(peername) == key


def test_quote_user_escapes_and_cuts():
    assert quote_user("alice") == "'alice'"
    assert quote_user(None) == "-"
    assert quote_user("a\nb\x1b[31m") == r"'a\nb\x1b[31m'"
    assert quote_user("\u202eevil") == r"'\u202eevil'"  # no bidi overrides in the log
    long = quote_user("x" * 70000)
    assert long.startswith("'" + "x" * 64 + "'") and long.endswith("(70000 characters)") and len(long) < 100
