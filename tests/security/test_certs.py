"""The certificates `fabric auth` issues (fabric/security/certs.py) and the TLS pieces of the
stream transport (fabric/transport/stream_tls.py), in memory: no node, no sockets."""

from __future__ import annotations

import ssl
from collections import deque
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from fabric.errors import BadParameter, ConfigError
from fabric.security import certs, keys
from fabric.transport import stream_tls


def _mode(p: Path) -> int:
    return p.stat().st_mode & 0o777


def _cert(p: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(p.read_bytes())


def test_init_makes_a_ca_and_a_server_certificate_for_the_hosts(tmp_path: Path) -> None:
    d = keys.init(tmp_path / "k", hosts=["10.1.2.3", "node1.example"])
    ca = _cert(d / "ca.crt")
    server_crt, server_key = certs.server_files(d)
    assert _mode(d / "tls" / "ca.key") == 0o600 and _mode(server_key) == 0o600
    assert _mode(d / "server.key_secret") == 0o600  # the CurveZMQ keys are made as before
    assert (d / "server.key").exists()
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    server = _cert(server_crt)
    server.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1", "10.1.2.3"}
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "node1.example"}
    eku = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku
    with pytest.raises(ConfigError, match="nothing changed"):
        keys.init(d)


def test_a_bad_host_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(BadParameter, match="host"):
        keys.init(tmp_path / "k", hosts=["bad host!"])
    assert not (tmp_path / "k" / "server.key_secret").exists()
    assert not (tmp_path / "k" / "ca.crt").exists()


def test_client_certificates_are_issued_listed_and_revoked(tmp_path: Path) -> None:
    d = keys.init(tmp_path / "k")
    public, secret, bundle = keys.add_client(d, "alice")
    assert public == d / "clients" / "alice.key" and secret.exists()
    assert bundle == d / "issued" / "alice.pem" and _mode(bundle) == 0o600
    cert = _cert(d / "clients" / "alice.crt")
    assert certs.common_name(cert) == "alice"
    cert.verify_directly_issued_by(_cert(d / "ca.crt"))
    assert ExtendedKeyUsageOID.CLIENT_AUTH in cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert certs.allowed(d) == {"alice": cert.serial_number}
    ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(bundle)  # key and certificate, one file
    listed = keys.list_clients(d)
    assert listed[0]["name"] == "alice" and listed[0]["certificate"].startswith(f"{cert.serial_number:x}"[:16])

    keys.revoke(d, "alice")
    assert certs.allowed(d) == {}
    assert (d / "revoked" / "alice.crt").exists() and not bundle.exists()
    assert keys.list_clients(d)[0]["state"] == "revoked"

    keys.add_client(d, "alice")  # allowed again: a new certificate, the old one stays refused
    again = certs.allowed(d)["alice"]
    assert again != cert.serial_number
    assert not (d / "revoked" / "alice.crt").exists()


def test_a_certificate_whose_name_is_not_its_file_is_not_allowed(tmp_path: Path) -> None:
    d = keys.init(tmp_path / "k")
    keys.add_client(d, "alice")
    (d / "clients" / "alice.crt").rename(d / "clients" / "admin.crt")
    assert certs.allowed(d) == {}


def test_a_keys_dir_made_before_tls_gets_certificates(tmp_path: Path) -> None:
    d = keys.init(tmp_path / "k")
    keys.add_client(d, "old")
    for f in ("ca.crt", "tls/ca.key", "tls/server.crt", "tls/server.key", "clients/old.crt", "issued/old.pem"):
        (d / f).unlink()
    secret = (d / "server.key_secret").read_bytes()
    assert not certs.has_tls(d)
    with pytest.raises(ConfigError, match="no TLS certificates"):
        certs.require_tls(d)
    with pytest.raises(ConfigError, match="cannot read the deployment CA"):
        certs.issue_client(d, "old")
    keys.init(d)  # adds the certificates, keeps the keys
    assert certs.has_tls(d) and (d / "server.key_secret").read_bytes() == secret
    public, _, bundle = keys.add_client(d, "old")  # the existing client gets its certificate only
    assert bundle is not None and bundle.exists() and public.exists()
    with pytest.raises(BadParameter, match="exists already"):
        keys.add_client(d, "old")


def _pump(client: ssl.SSLObject, server: ssl.SSLObject, bios: tuple[ssl.MemoryBIO, ...]) -> None:
    """Run both sides' handshakes to the end in memory (raises the first side's error)."""
    c_in, c_out, s_in, s_out = bios
    done = {"c": False, "s": False}
    for _ in range(20):
        for name, obj in (("c", client), ("s", server)):
            if not done[name]:
                try:
                    obj.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return
    raise AssertionError("handshake did not finish")


def _handshake(tmp_path: Path, client_dir: Path, server_dir: Path, name: str) -> ssl.SSLObject:
    cert, key = certs.server_files(server_dir)
    sctx = stream_tls.server_context(str(cert), str(key), str(server_dir / "ca.crt"))
    cctx = stream_tls.client_context(str(server_dir / "ca.crt"), str(client_dir / "issued" / f"{name}.pem"))
    bios = (ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO())
    client = cctx.wrap_bio(bios[0], bios[1], server_hostname="127.0.0.1")
    server = sctx.wrap_bio(bios[2], bios[3], server_side=True)
    _pump(client, server, bios)
    try:  # TLS 1.3: the server's verdict on the client reaches the client with the next read
        server.write(b"FABRIC\x01\x00")
        bios[0].write(bios[3].read())
        assert client.read(8) == b"FABRIC\x01\x00"
    except ssl.SSLError:
        bios[0].write(bios[3].read())
        raise
    return server


def test_mutual_tls_names_the_principal_and_refuses_another_ca(tmp_path: Path) -> None:
    d = keys.init(tmp_path / "k")
    keys.add_client(d, "alice")
    server = _handshake(tmp_path, d, d, "alice")
    assert server.version() == "TLSv1.3"
    assert stream_tls.principal(server.getpeercert()) == ("alice", certs.allowed(d)["alice"])
    other = keys.init(tmp_path / "other")
    keys.add_client(other, "alice")
    with pytest.raises(ssl.SSLError) as err:
        _handshake(tmp_path, other, d, "alice")
    assert "CERTIFICATE_VERIFY_FAILED" in str(err.value) or "certificate" in str(err.value).lower()


def test_principal_of_odd_certificates() -> None:
    assert stream_tls.principal(None) == ("", -1)
    assert stream_tls.principal({"subject": ((("commonName", "x"),),), "serialNumber": "zz"}) == ("x", -1)


class _Sock:
    """A TLS socket that takes ``room`` bytes per call and says WantWrite when it has none."""

    def __init__(self, rooms: list[int]) -> None:
        self.rooms = rooms
        self.calls: list[bytes] = []
        self.got = bytearray()

    def send(self, data: bytes | memoryview) -> int:
        self.calls.append(bytes(data))
        room = self.rooms.pop(0) if self.rooms else 1 << 30
        if room == 0:
            raise ssl.SSLWantWriteError()
        n = min(room, len(data))
        self.got += bytes(data)[:n]
        return n


def test_tls_write_offers_an_unfinished_write_again_with_the_same_bytes() -> None:
    out: deque = deque([b"a" * 10, b"b" * 20, memoryview(b"c" * (stream_tls.WRITE_BYTES + 5))])
    sock = _Sock([0])
    sent, chunk = stream_tls.tls_write(sock, out, None)  # type: ignore[arg-type]
    assert sent == 0 and bytes(chunk) == b"a" * 10 + b"b" * 20
    sock.rooms = [0]
    sent, chunk2 = stream_tls.tls_write(sock, out, chunk)  # type: ignore[arg-type]
    assert sent == 0 and sock.calls[-1] == sock.calls[-2]  # the very same bytes again
    sent, rest = stream_tls.tls_write(sock, out, chunk2)  # type: ignore[arg-type]
    assert rest is None and not out
    assert bytes(sock.got) == b"a" * 10 + b"b" * 20 + b"c" * (stream_tls.WRITE_BYTES + 5)
    assert max(len(c) for c in sock.calls) <= stream_tls.WRITE_BYTES
