"""TLS (`rediss://`) with a private CA and a client certificate: the connect options reach the
Rust crate's TLS settings."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import redsem
from conftest import Server


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    # The Valkey build of install-deps has no TLS: TLS runs on Debian's redis-server.
    redis_server = shutil.which("redis-server")
    if not shutil.which("openssl") or not redis_server:
        pytest.skip("no openssl to make certificates, or no redis-server")
    d = tmp_path
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=redsem test CA",
             "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for who in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={who}",
                 "-keyout", str(d / f"{who}.key"), "-out", str(d / f"{who}.csr"))
        _openssl("x509", "-req", "-in", str(d / f"{who}.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
                 "-CAcreateserial", "-days", "2", "-extfile", str(d / "san.cnf"), "-out", str(d / f"{who}.pem"))
    s = Server([
        "--tls-port", "{tls_port}", "--tls-cert-file", str(d / "server.pem"), "--tls-key-file", str(d / "server.key"),
        "--tls-ca-cert-file", str(d / "ca.pem"), "--tls-auth-clients", "yes",
    ], binary=redis_server)
    yield s, d
    s.stop()


async def test_rediss_with_a_private_ca_and_a_client_certificate(tls_server: tuple[Server, Path], name: str) -> None:
    server, d = tls_server
    url = f"rediss://127.0.0.1:{server.tls_port}/"
    async with await redsem.connect(url, tls_ca=d / "ca.pem", tls_cert=d / "client.pem", tls_key=d / "client.key") as c:
        sem = await c.semaphore(name, limit=1)
        async with sem.acquire(timeout=10) as p:
            assert p.slots == [0]
    async with await redsem.connect(url, tls_ca_pem=(d / "ca.pem").read_bytes(),
                                    tls_cert_pem=(d / "client.pem").read_bytes(),
                                    tls_key_pem=(d / "client.key").read_bytes()) as c:
        assert (await c.inspect(name)).grants_total == 1
    # without the private CA the server's certificate is not trusted
    with pytest.raises(redsem.RedsemError):
        await redsem.connect(url, connect_timeout=5.0, tls_cert=d / "client.pem", tls_key=d / "client.key")
    with pytest.raises(redsem.InvalidArgument):
        await redsem.connect(url, tls_ca=d / "missing.pem")
