"""Interop with Debian's mosquitto_pub / mosquitto_sub (every run bounded by -C/-W and timeouts)."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import threading

import pytest

from support.integration import make_password_file

pytestmark = [pytest.mark.process, pytest.mark.interop]


class MosqSub:
    """mosquitto_sub in debug mode (-d), its stdout read line by line on a thread."""

    def __init__(self, broker, *args: str):
        self.proc = subprocess.Popen(
            # stdbuf: line-buffered stdout, or the debug lines sit in a pipe buffer
            ["stdbuf", "-oL", "mosquitto_sub", "-h", broker.host, "-p", str(broker.port), "-d", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_line(self, pattern: str, timeout: float = 10.0) -> re.Match:
        """The first (new) output line matching ``pattern``."""
        rx = re.compile(pattern)
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(
                    f"mosquitto_sub printed no line matching {pattern!r}; output so far:\n" + "\n".join(self.seen)
                ) from None
            if line is None:
                raise AssertionError(
                    f"mosquitto_sub ended (rc={self.proc.wait(5)}) without "
                    f"{pattern!r}; output:\n" + "\n".join(self.seen)
                )
            self.seen.append(line)
            m = rx.search(line)
            if m:
                return m

    def subscribed(self) -> list[int]:
        """Wait for the SUBACK; the granted QoS values mosquitto_sub reports."""
        m = self.wait_line(r"Subscribed \(mid: \d+\): ([\d, ]+)")
        return [int(x) for x in m.group(1).split(",")]

    def finish(self, timeout: float = 10.0) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)
        self._reader.join(5)


@pytest.fixture
def mosq_sub():
    started: list[MosqSub] = []

    def start(broker, *args: str) -> MosqSub:
        s = MosqSub(broker, *args)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()


def mosquitto_pub(broker, *args: str, stdin: str | None = None, timeout: float = 15.0):
    return subprocess.run(
        ["mosquitto_pub", "-h", broker.host, "-p", str(broker.port), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


PUBLISH_LINE = r"received PUBLISH \(d(\d), q(\d), r(\d), m\d+, '([^']*)', \.\.\. \((\d+) bytes\)\)"


@pytest.mark.parametrize("pub_qos,sub_qos", [(0, 0), (1, 1), (2, 2), (2, 1), (1, 0), (0, 2)])
def test_mosquitto_pub_to_mosquitto_sub(broker, mosq_sub, pub_qos, sub_qos):
    """QoS 0/1/2 end to end between the Debian clients: the subscriber gets QoS
    min(publish, granted) [MQTT-3.8.4-6], DUP=0 and RETAIN=0 [MQTT-3.3.1-9]."""
    sub = mosq_sub(
        broker, "-t", "interop/t", "-q", str(sub_qos), "-C", "1", "-W", "10", "-v", "-i", f"msub-{pub_qos}{sub_qos}"
    )
    assert sub.subscribed() == [sub_qos]
    r = mosquitto_pub(
        broker, "-t", "interop/t", "-q", str(pub_qos), "-m", "hello mqttmesh", "-i", f"mpub-{pub_qos}{sub_qos}"
    )
    assert r.returncode == 0, r.stdout + r.stderr
    m = sub.wait_line(PUBLISH_LINE)
    assert m.groups() == ("0", str(min(pub_qos, sub_qos)), "0", "interop/t", "14")
    sub.wait_line(r"^interop/t hello mqttmesh$")
    assert sub.finish() == 0


def test_retained_with_mosquitto_pub_r(broker, mosq_sub, clients):
    """mosquitto_pub -r stores a retained message [MQTT-3.3.1-5]; a later mosquitto_sub
    gets it with RETAIN=1 [MQTT-3.3.1-8]; -r -n (empty) deletes it [MQTT-3.3.1-10]."""
    r = mosquitto_pub(broker, "-t", "interop/ret", "-q", "1", "-r", "-m", "kept")
    assert r.returncode == 0, r.stderr
    sub = mosq_sub(broker, "-t", "interop/#", "-q", "2", "-C", "1", "-W", "10", "-v")
    m = sub.wait_line(PUBLISH_LINE)
    assert m.groups() == ("0", "1", "1", "interop/ret", "4")
    sub.wait_line(r"^interop/ret kept$")
    assert sub.finish() == 0
    r = mosquitto_pub(broker, "-t", "interop/ret", "-q", "1", "-r", "-n")
    assert r.returncode == 0, r.stderr
    c = clients(broker, client_id="ret-check")
    assert c.sub(1, ("interop/#", 1)) == [1]
    c.expect_silence(0.3)


@pytest.mark.parametrize("retain", [False, True])
def test_will_of_mosquitto_sub_published_when_it_dies(broker, mosq_sub, clients, retain):
    """mosquitto_sub --will-*: killed with SIGKILL (no DISCONNECT), its will is published
    at its QoS [MQTT-3.1.2-8]; with --will-retain it is retained [MQTT-3.1.2-17]."""
    watcher = clients(broker, client_id="will-watch")
    assert watcher.sub(1, ("interop/will", 2)) == [2]
    args = [
        "-t",
        "interop/nothing",
        "-W",
        "30",
        "-i",
        "dying-sub",
        "--will-topic",
        "interop/will",
        "--will-payload",
        "mosquitto_sub died",
        "--will-qos",
        "2",
    ]
    if retain:
        args.append("--will-retain")
    sub = mosq_sub(broker, *args)
    assert sub.subscribed() == [0]
    sub.kill()
    (p,) = watcher.publishes(1)
    assert (p.topic, p.payload, p.qos, p.retain) == ("interop/will", b"mosquitto_sub died", 2, False)
    late = clients(broker, client_id="will-late")
    assert late.sub(1, ("interop/will", 2)) == [2]
    if retain:
        (r,) = late.publishes(1)
        assert (r.payload, r.retain) == (b"mosquitto_sub died", True)
    else:
        late.expect_silence(0.3)


def test_mosquitto_sub_clean_exit_publishes_no_will(broker, mosq_sub, clients):
    """mosquitto_sub -C 1 exits with DISCONNECT: its will is discarded [MQTT-3.14.4-3]."""
    watcher = clients(broker, client_id="nowill-watch")
    assert watcher.sub(1, ("interop/will2", 1)) == [1]
    sub = mosq_sub(
        broker,
        "-t",
        "interop/one",
        "-C",
        "1",
        "-W",
        "10",
        "--will-topic",
        "interop/will2",
        "--will-payload",
        "should not appear",
    )
    assert sub.subscribed() == [0]
    assert mosquitto_pub(broker, "-t", "interop/one", "-m", "x").returncode == 0
    assert sub.finish() == 0
    r = mosquitto_pub(broker, "-t", "interop/will2", "-q", "1", "-m", "marker")
    assert r.returncode == 0
    (p,) = watcher.publishes(1)
    assert p.payload == b"marker"


def test_persistent_session_with_mosquitto_sub_c(broker, mosq_sub):
    """mosquitto_sub -c -i ID (CleanSession=0): a QoS 1 message published while it is
    offline is delivered when it comes back [MQTT-3.1.2-5]."""
    sub = mosq_sub(broker, "-c", "-i", "mosq-persist", "-q", "1", "-t", "interop/p", "-C", "1", "-W", "10", "-v")
    assert sub.subscribed() == [1]
    assert mosquitto_pub(broker, "-t", "interop/p", "-q", "1", "-m", "online").returncode == 0
    sub.wait_line(r"^interop/p online$")
    assert sub.finish() == 0
    assert mosquitto_pub(broker, "-t", "interop/p", "-q", "1", "-m", "while away").returncode == 0
    # no -t: the session's stored subscription is what delivers
    sub = mosq_sub(
        broker, "-c", "-i", "mosq-persist", "-q", "1", "-C", "1", "-W", "10", "-v", "-t", "interop/unrelated"
    )
    sub.wait_line(r"received CONNACK \(0\)")
    sub.wait_line(r"^interop/p while away$")
    assert sub.finish() == 0


def test_many_lines_from_mosquitto_pub_arrive_in_order(broker, mosq_sub):
    """mosquitto_pub -l (one message per stdin line, QoS 1) -> mosquitto_sub -C 200:
    same order [MQTT-4.6.0-6]."""
    n = 200
    sub = mosq_sub(broker, "-t", "interop/lines", "-q", "1", "-C", str(n), "-W", "15")
    assert sub.subscribed() == [1]
    r = mosquitto_pub(broker, "-t", "interop/lines", "-q", "1", "-l", stdin="".join(f"line {i}\n" for i in range(n)))
    assert r.returncode == 0, r.stderr
    assert sub.finish(15) == 0
    sub._reader.join(5)
    while True:
        line = sub.lines.get(timeout=1)
        if line is None:
            break
        sub.seen.append(line)
    payloads = [line for line in sub.seen if line.startswith("line ")]
    assert payloads == [f"line {i}" for i in range(n)]


def test_mosquitto_clients_with_password_file(broker_factory, tmp_path, mosq_sub):
    """-u/-P against a password file: accepted with the right password; a wrong one is
    refused with 'bad user name or password' (CONNACK 0x04).
    [MQTT-3.2.2-5]"""
    pw = make_password_file(tmp_path / "pw", {"mosq": "quitto"})
    b = broker_factory("--password-file", str(pw), "--allow-anonymous", "false")
    sub = mosq_sub(b, "-u", "mosq", "-P", "quitto", "-t", "interop/auth", "-C", "1", "-W", "10", "-v")
    assert sub.subscribed() == [0]
    r = mosquitto_pub(b, "-u", "mosq", "-P", "quitto", "-t", "interop/auth", "-m", "ok")
    assert r.returncode == 0, r.stderr
    sub.wait_line(r"^interop/auth ok$")
    assert sub.finish() == 0
    r = mosquitto_pub(b, "-u", "mosq", "-P", "wrong", "-t", "interop/auth", "-m", "no")
    assert r.returncode != 0
    assert "bad user name or password" in (r.stdout + r.stderr).lower()
    r = mosquitto_pub(b, "-t", "interop/auth", "-m", "anonymous")
    assert r.returncode != 0
    assert "not authorised" in (r.stdout + r.stderr).lower() or "not authorized" in (r.stdout + r.stderr).lower()


def test_paho_publisher_to_mosquitto_sub_qos2(broker, mosq_sub, paho):
    """Two different client libraries, QoS 2 both ways through the broker. [MQTT-4.3.3-1]
    [MQTT-4.3.3-2]"""
    sub = mosq_sub(broker, "-t", "interop/mix", "-q", "2", "-C", "1", "-W", "10", "-v")
    assert sub.subscribed() == [2]
    p = paho("paho-mix")
    assert not p.connect(broker).is_failure
    p.publish("interop/mix", b"from paho", qos=2)
    m = sub.wait_line(PUBLISH_LINE)
    assert m.groups() == ("0", "2", "0", "interop/mix", "9")
    assert sub.finish() == 0
    assert [rc.value for rc in p.subscribe("interop/back", 2)] == [2]
    r = mosquitto_pub(broker, "-t", "interop/back", "-q", "2", "-m", "from mosquitto")
    assert r.returncode == 0
    assert p.get() == ("interop/back", b"from mosquitto", 2, False)


def test_paho_persistent_session_gets_queued_messages(broker, paho):
    """paho with clean_session=False: messages published while it was away arrive after
    it reconnects, at their QoS [MQTT-3.1.2-5]."""
    p = paho("paho-persistent", clean_session=False)
    assert not p.connect(broker).is_failure
    assert [rc.value for rc in p.subscribe("interop/queued", 2)] == [2]
    p.stop()
    for qos in (1, 2):
        r = mosquitto_pub(broker, "-t", "interop/queued", "-q", str(qos), "-m", f"q{qos}")
        assert r.returncode == 0
    again = paho("paho-persistent", clean_session=False)
    assert not again.connect(broker).is_failure
    got = [again.get(), again.get()]
    assert got == [("interop/queued", b"q1", 1, False), ("interop/queued", b"q2", 2, False)]
