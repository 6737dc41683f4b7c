"""`mqttmesh broker --config FILE.toml`: errors name the key; flags override the file."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time

import pytest

from support import mqttraw
from support.integration import PYTHON, run_cli
from support.processes import free_port, wait_for

pytestmark = pytest.mark.process


def write(tmp_path, text: str, name: str = "mqttmesh.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "toml,names",
    [
        ("bogus = 1\n", ["'bogus'"]),
        ("[limits]\nmax_inflite = 5\n", ["'limits.max_inflite'"]),
        ("max_inflight = 5\n", ["'max_inflight'", "limits.max_inflight"]),  # with a hint
        ("[nosuchsection]\nx = 1\n", ["nosuchsection"]),
        ('port = "abc"\n', ["port", "integer", "'abc'"]),
        ("port = 70000\n", ["port", "70000"]),
        ("port = 1.5\n", ["port"]),
        ('[limits]\nmax_inflight = "many"\n', ["limits.max_inflight", "'many'"]),
        ("[limits]\nmax_inflight = 0\n", ["limits.max_inflight", "minimum"]),
        ("[limits]\nqueue_qos0 = 3\n", ["limits.queue_qos0", "true or false"]),
        ('[limits]\ndrop_policy = "random"\n', ["limits.drop_policy", "'random'"]),
        ('[auth]\nallow_anonymous = "perhaps"\n', ["auth.allow_anonymous", "'perhaps'"]),
        ("[limits]\nconnect_timeout = [1, 2]\n", ["limits.connect_timeout"]),
    ],
)
def test_bad_toml_value_exits_non_zero_naming_the_key(tmp_path, toml, names):
    """A wrong key or value in the TOML file: exit non-zero, name the key and the file, no
    traceback. (Operations; no statement of the standard.)"""
    path = write(tmp_path, toml)
    r = run_cli("broker", "--config", str(path), "--port", "0", timeout=20)
    assert r.returncode != 0
    for name in names:
        assert name in r.stderr, r.stderr
    assert str(path) in r.stderr, r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_invalid_toml_syntax_names_the_file(tmp_path):
    """Unparsable TOML: exit non-zero naming the file. (Operations.)"""
    path = write(tmp_path, "[limits\nmax_inflight = \n")
    r = run_cli("broker", "--config", str(path), "--port", "0", timeout=20)
    assert r.returncode != 0
    assert str(path) in r.stderr and "TOML" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_missing_config_file_names_the_file(tmp_path):
    """--config pointing nowhere: exit non-zero naming the file. (Operations.)"""
    path = tmp_path / "absent.toml"
    r = run_cli("broker", "--config", str(path), "--port", "0", timeout=20)
    assert r.returncode != 0
    assert str(path) in r.stderr and "not found" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "flag,value,names",
    [
        ("--max-inflight", "many", ["--max-inflight", "'many'"]),
        ("--max-inflight", "0", ["--max-inflight", "minimum"]),
        ("--queue-qos0", "sometimes", ["--queue-qos0", "'sometimes'"]),
        ("--connect-timeout", "-1", ["--connect-timeout"]),
        ("--port", "65536", ["--port", "65536"]),
    ],
)
def test_bad_flag_value_exits_non_zero_naming_the_flag(flag, value, names):
    """A bad command-line value: exit non-zero naming the flag. (Operations.)"""
    r = run_cli("broker", "--port", "0", flag, value, timeout=20)
    assert r.returncode != 0
    for name in names:
        assert name in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_missing_password_and_acl_files_are_named(tmp_path):
    """A password or ACL file that does not exist is named. (Operations.)"""
    for flag in ("--password-file", "--acl-file"):
        missing = tmp_path / f"missing{flag}"
        r = run_cli("broker", "--port", "0", flag, str(missing), timeout=20)
        assert r.returncode != 0
        assert str(missing) in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


def test_bad_acl_line_is_named(tmp_path):
    """An ACL line that does not parse is named as FILE:LINE. (Operations.)"""
    acl = write(tmp_path, "topic read ok/#\ntopic sometimes a/b\n", "acl")
    r = run_cli("broker", "--port", "0", "--acl-file", str(acl), timeout=20)
    assert r.returncode != 0
    assert f"{acl}:2" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@contextlib.contextmanager
def broker_from_config(tmp_path, *args: str):
    """A broker started with exactly ``args`` (no --port added); yields its bound port."""
    port_file = tmp_path / "cfg.port"
    if port_file.exists():
        port_file.unlink()
    log = open(tmp_path / "cfg.log", "ab")
    proc = subprocess.Popen(
        [PYTHON, "-m", "mqttmesh", "broker", "--port-file", str(port_file), *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    log.close()
    try:

        def ready():
            assert proc.poll() is None, (tmp_path / "cfg.log").read_text()
            return port_file.exists() and port_file.read_text().strip()

        yield int(wait_for(ready, 15, what="broker listening"))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class _At:
    """Just host and port, for the ``clients`` fixture."""

    def __init__(self, port: int):
        self.host, self.port = "127.0.0.1", port


def test_port_from_toml_is_used_and_the_flag_overrides_it(tmp_path, clients):
    """TOML `port` applies when no flag is given; `--port` wins over it. (Operations.)"""
    toml_port = free_port()
    path = write(tmp_path, f'host = "127.0.0.1"\nport = {toml_port}\n[sys]\ninterval = 0\n')
    with broker_from_config(tmp_path, "--config", str(path)) as port:
        assert port == toml_port
        clients(_At(port), client_id="toml-port").ping()
    flag_port = free_port()
    with broker_from_config(tmp_path, "--config", str(path), "--port", str(flag_port)) as port:
        assert port == flag_port
        clients(_At(port), client_id="flag-port").ping()
        with pytest.raises(ConnectionRefusedError):  # nothing listens on the TOML port
            socket.create_connection(("127.0.0.1", toml_port), 2).close()


def received_before_silence(c, window=0.4) -> int:
    n = 0
    while True:
        try:
            p = c.recv(window)
        except TimeoutError:
            return n
        assert p.type == mqttraw.PUBLISH
        n += 1


@pytest.mark.parametrize("extra,expected", [((), 3), (("--max-inflight", "5"), 5)])
def test_toml_limit_applies_and_flag_overrides_it(broker_factory, tmp_path, clients, extra, expected):
    """[limits] max_inflight = 3 from the file; --max-inflight 5 overrides it (counted as
    unacknowledged QoS 1 messages a subscriber receives).
    (Operations.)"""
    path = write(tmp_path, "[limits]\nmax_inflight = 3\n")
    b = broker_factory("--config", str(path), *extra)
    sub = clients(b, client_id="inflight-sub")
    assert sub.sub(1, ("cfg/t", 1)) == [1]
    pub = clients(b, client_id="inflight-pub")
    for i in range(8):
        pub.pub("cfg/t", str(i).encode(), qos=1, pid=i + 1)
    assert received_before_silence(sub) == expected


def test_toml_bool_and_flag_override(broker_factory, tmp_path, clients):
    """[auth] allow_anonymous = false refuses anonymous clients (0x05); the flag
    --allow-anonymous true given after --config overrides it.
    (Operations; the refusal itself is [MQTT-3.2.2-5].)"""
    path = write(tmp_path, "[auth]\nallow_anonymous = false\n")
    b = broker_factory("--config", str(path))
    c = clients.raw(b)
    c.send(mqttraw.connect(client_id="anon-cfg"))
    assert c.recv().body == b"\x00\x05"
    b2 = broker_factory("--config", str(path), "--allow-anonymous", "true")
    clients(b2, client_id="anon-ok").ping()


def test_config_reference_lists_every_key():
    """`mqttmesh config-reference` documents the keys used above. (Operations.)"""
    r = run_cli("config-reference", timeout=20)
    assert r.returncode == 0
    for key in (
        "`port`",
        "`limits.max_inflight`",
        "`auth.allow_anonymous`",
        "`--max-inflight`",
        "`limits.slow_consumer_timeout`",
    ):
        assert key in r.stdout, key


def test_sigterm_stops_the_broker_cleanly(broker, clients):
    """A graceful stop of a broker that is serving exits 0, promptly, and says so. (Operations.)"""
    clients(broker, client_id="before-stop").ping()
    t0 = time.monotonic()
    assert broker.stop() == 0
    assert time.monotonic() - t0 < 5
    assert "stopped" in broker.log()
    assert "Traceback" not in broker.log()


def test_sigterm_right_after_the_port_file_appears_is_a_graceful_stop(tmp_path):
    """Once the broker says it listens (port file), SIGTERM means a graceful stop (exit 0).
    Tried up to 30 times with the signal sent as soon as the file exists.
    (Operations.)"""
    for i in range(30):
        port_file = tmp_path / f"race{i}.port"
        proc = subprocess.Popen(
            [PYTHON, "-m", "mqttmesh", "broker", "--port", "0", "--port-file", str(port_file), "--sys-interval", "0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 15
            while not port_file.exists():
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.0002)  # tight polling: this test is about the first moments
            proc.terminate()
            rc = proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        assert rc == 0, f"attempt {i}: exit status {rc} after SIGTERM"
