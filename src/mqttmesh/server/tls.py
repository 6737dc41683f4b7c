"""TLS contexts for the client listener and for peer links, from the configuration."""

from __future__ import annotations

import ssl

from ..auth import ConfigError
from ..config import Config


def server_context(config: Config) -> ssl.SSLContext | None:
    """The context of the TLS listeners (``tls.port``, ``websocket.tls_port``), or None when
    TLS is off."""
    if not config.get("tls.port") and not config.get("mesh.tls") and not config.get("websocket.tls_port"):
        return None
    cert, key = config.get("tls.cert_file"), config.get("tls.key_file")
    if not cert or not key:
        raise ConfigError("tls.cert_file and tls.key_file: a TLS listener needs both")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
        if config.get("tls.ca_file"):
            ctx.load_verify_locations(config.get("tls.ca_file"))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"tls: cannot load the certificate or key ({exc})") from None
    if config.get("tls.require_certificate"):
        if not config.get("tls.ca_file"):
            raise ConfigError("tls.require_certificate: needs tls.ca_file to check client certificates")
        ctx.verify_mode = ssl.CERT_REQUIRED
    elif peer_certificate_required(config):
        # asked, not required: clients without one still connect; a peer CONNECT without a
        # verified one is refused (channel.py). A certificate that does not verify fails the
        # handshake, as it does with tls.require_certificate.
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def peer_certificate_required(config: Config) -> bool:
    """Mutual TLS between peers (``mesh.tls_mutual``): a peer link needs a client certificate."""
    if not config.get("mesh.tls_mutual"):
        return False
    if not config.get("mesh.tls"):
        raise ConfigError("mesh.tls_mutual: needs mesh.tls (peers dial each other with TLS)")
    if not config.get("tls.ca_file"):
        raise ConfigError("mesh.tls_mutual: needs tls.ca_file to check the peers' certificates")
    return True


def peer_context(config: Config) -> ssl.SSLContext | None:
    """The context for dialling peers when ``mesh.tls`` is on: the peer's certificate must
    chain to ``tls.ca_file``; its name is checked only with ``mesh.tls_check_hostname``
    (mesh nodes are often dialled by IP address)."""
    if not config.get("mesh.tls"):
        return None
    if not config.get("tls.ca_file"):
        raise ConfigError("mesh.tls: needs tls.ca_file to check the peers' certificates")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = bool(config.get("mesh.tls_check_hostname"))
    try:
        ctx.load_verify_locations(config.get("tls.ca_file"))
        if config.get("tls.cert_file") and config.get("tls.key_file"):
            ctx.load_cert_chain(config.get("tls.cert_file"), config.get("tls.key_file"))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"tls: cannot load the CA, certificate or key ({exc})") from None
    return ctx
