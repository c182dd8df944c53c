"""TLS between the tiers: the CA that signed the NATS servers' certificates, and this client's own
certificate and key where the servers verify clients (mutual TLS).

Rule: with TLS configured the client performs the TLS handshake **first**, before it reads a byte
from the server (the server's ``tls { handshake_first: true }``, nats-server >= 2.10.4). Without it a
NATS client reads the server's plain-text INFO and upgrades only if that INFO asks for TLS, so a
peer that answers in clear (a misconfigured server, or anything in the path) would receive the
client's password in clear. ``handshake_first=False`` exists for servers that cannot be configured
so; it is then the server's ``tls_required`` that keeps the password off the wire.

Paths are validated at start-up (``validate()`` raises ``ValueError`` naming the field): each file
present and readable, a certificate and its key given together, the key readable by its owner
only (as the credentials file). No third-party package: the standard library's ``ssl``.
"""
from __future__ import annotations

import ssl
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TlsConfig"]


def _readable(field: str, path: str) -> Path:
    p = Path(path)
    try:
        with p.open("rb"):
            pass
    except OSError as e:
        raise ValueError(f"nats.tls.{field} {path!r}: {e.strerror}") from None
    return p


@dataclass(frozen=True)
class TlsConfig:
    ca: str | None = None               # PEM bundle of the CA(s) that signed the servers; None: the system's
    cert: str | None = None             # this client's certificate (PEM), for servers with `verify: true`
    key: str | None = None              # its private key (PEM, mode 0600)
    handshake_first: bool = True        # TLS before the server's INFO (see the module's rule)

    def validate(self) -> "TlsConfig":
        if (self.cert is None) != (self.key is None):
            raise ValueError("nats.tls: a client certificate and its key are given together (--tls-cert with --tls-key)")
        if self.ca is not None:
            _readable("ca", self.ca)
        if self.cert is not None and self.key is not None:
            _readable("cert", self.cert)
            key = _readable("key", self.key)
            mode = key.stat().st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise ValueError(f"nats.tls.key {self.key!r}: readable by group or others "
                                 f"(mode {stat.S_IMODE(mode):04o}): chmod 600")
        try:
            self.context()
        except (ssl.SSLError, OSError) as e:
            raise ValueError(f"nats.tls: the CA, certificate or key does not load: {e}") from None
        return self

    def context(self) -> ssl.SSLContext:
        """A client context: server certificates verified against ``ca`` (or the system's CAs) and
        their host name checked; TLS 1.2 at least; this client's certificate where one is given."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert is not None:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx

    def connect_kwargs(self) -> dict:
        """nats-py ``connect`` arguments."""
        return {"tls": self.context(), "tls_handshake_first": self.handshake_first}
