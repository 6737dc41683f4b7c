"""Reload without restart (issue 22 point 5): SIGHUP re-reads the password file, the ACL file,
the TLS files and the log level; new rules apply to live sessions' next deliveries; a file
with an error keeps the one in force and the log names the file and line. SIGHUP used to
kill the node."""

from __future__ import annotations

import os
import signal

import pytest

from support.integration import Client, connack, log_has, make_password_file, wait_log

pytestmark = [pytest.mark.process]


def hup(b, count_before: int) -> None:
    """SIGHUP, and wait for the node to say it reloaded (one more "reloaded" line)."""
    os.kill(b.proc.pid, signal.SIGHUP)
    wait_log_count(b, "reloaded:", count_before + 1)


def wait_log_count(b, needle: str, n: int) -> None:
    from support.processes import wait_for

    wait_for(lambda: b.log().count(needle) >= n, 10, what=f"{n} log lines with {needle!r}")


def test_an_acl_change_applies_to_a_live_subscription_and_a_broken_file_is_kept_out(broker_factory, tmp_path):
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite a/#\n")
    b = broker_factory("--acl-file", str(acl))
    with Client(b.host, b.port) as sub, Client(b.host, b.port) as pub:
        assert connack(sub.connect(client_id="live-sub"))[1] == 0
        assert connack(pub.connect(client_id="live-pub"))[1] == 0
        assert sub.sub(1, ("a/#", 0)) == [0]
        pub.pub("a/secret", b"1", qos=1, pid=1)
        (p,) = sub.publishes(1)
        assert p.topic == "a/secret"
        acl.write_text("topic readwrite a/#\ntopic deny a/secret\n")
        hup(b, 0)
        assert b.proc.poll() is None  # (SIGHUP no longer stops the node)
        pub.pub("a/secret", b"2", qos=1, pid=2)
        pub.pub("a/open", b"3", qos=1, pid=3)
        (p,) = sub.publishes(1)
        assert (p.topic, p.payload) == ("a/open", b"3")  # the live session's next delivery
        # a file with an error: the rules in force stay, the log says where
        acl.write_text("topic readwrite a/#\ntopic deny a/secret\ntopik read b\n")
        hup(b, 1)
        wait_log(b, "reload:", f"{acl}:3", "the ACL in force is kept")
        pub.pub("a/secret", b"4", qos=1, pid=4)
        pub.pub("a/open", b"5", qos=1, pid=5)
        (p,) = sub.publishes(1)
        assert (p.topic, p.payload) == ("a/open", b"5")
        assert log_has(b, "reloaded:", "kept after an error: ACL")


def test_a_changed_password_takes_effect_and_the_old_one_is_forgotten(broker_factory, tmp_path):
    pw = make_password_file(tmp_path / "passwd", {"dev": "old-pw"})
    b = broker_factory("--password-file", str(pw), "--allow-anonymous", "false")
    with Client(b.host, b.port) as c:
        assert connack(c.connect(client_id="d1", username="dev", password="old-pw"))[1] == 0  # (remembered now)
    pw.unlink()
    make_password_file(pw, {"dev": "new-pw"})
    hup(b, 0)
    with Client(b.host, b.port) as c:
        assert connack(c.connect(client_id="d2", username="dev", password="old-pw"))[1] == 4
    with Client(b.host, b.port) as c:
        assert connack(c.connect(client_id="d3", username="dev", password="new-pw"))[1] == 0


def test_a_config_file_with_an_error_changes_nothing(broker_factory, tmp_path):
    config = tmp_path / "node.toml"
    config.write_text('log_level = "info"\n')
    b = broker_factory("--config", str(config))
    config.write_text('log_level = "info"\n[auth\n')
    os.kill(b.proc.pid, signal.SIGHUP)
    wait_log(b, "reload:", str(config), "the configuration in force is kept")
    assert b.proc.poll() is None
    with Client(b.host, b.port) as c:
        assert connack(c.connect(client_id="still-up"))[1] == 0
