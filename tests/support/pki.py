"""A test PKI made with the openssl command: a CA, a node certificate for 127.0.0.1 and
localhost, and a client certificate (tests/test_tls.py, tests/integration/test_websocket.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(args, cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(d: Path) -> Path:
    """Write ca.pem/ca.key, node.pem/node.key and client.pem/client.key into ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    _run(
        "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=mqttmesh-test-ca", cwd=d,
    )  # fmt: skip
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("node", "client"):
        _run(
            "openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={name}", cwd=d,
        )  # fmt: skip
        _run(
            "openssl", "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", "ext.cnf", cwd=d,
        )  # fmt: skip
    return d
