"""The TLS certificates of a deployment (the stream transport), beside its CurveZMQ keys.

Layout, in the keys directory of :mod:`fabric.security.keys`::

    DIR/ca.crt               the deployment CA's certificate: every stream client needs it (not secret)
    DIR/tls/ca.key           the CA's private key (0600): only `fabric auth` reads it, to sign
    DIR/tls/server.crt       the nodes' certificate (SAN 127.0.0.1, ::1, localhost and --host names)
    DIR/tls/server.key       its private key (0600): only the nodes read it
    DIR/clients/NAME.crt     the certificate of each allowed client (CN=NAME): the node admits
                             exactly this certificate (name and serial number)
    DIR/issued/NAME.pem      client NAME's private key and certificate in one file (0600; hand it
                             over with NAME.key_secret)
    DIR/revoked/NAME.crt     revoked clients' certificates

Keys are ECDSA P-256 (fast handshakes); certificates are X.509 v3 made with ``cryptography``.
A principal is the certificate's common name, which is also its CurveZMQ key file's name: one
`fabric auth add-client NAME` makes both, one `fabric auth revoke NAME` revokes both. The
node does not trust the CA alone: a certificate must also be the one in ``clients/`` (the
same serial number), so a revoked or never-listed certificate signed by the CA is refused.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fabric.errors import BadParameter, ConfigError

CA_CERT = "ca.crt"
TLS = "tls"
DEFAULT_HOSTS = ("127.0.0.1", "::1", "localhost")
CA_DAYS = 3650
CERT_DAYS = 825


def ca_cert_path(directory: str | Path) -> Path:
    return Path(directory) / CA_CERT


def server_files(directory: str | Path) -> tuple[Path, Path]:
    """(certificate, private key) of the nodes."""
    d = Path(directory) / TLS
    return d / "server.crt", d / "server.key"


def has_tls(directory: str | Path) -> bool:
    cert, key = server_files(directory)
    return ca_cert_path(directory).exists() and cert.exists() and key.exists()


def require_tls(directory: str | Path) -> None:
    """ConfigError, saying what to run, if the keys directory has no certificates (made before
    the stream transport had TLS)."""
    if not has_tls(directory):
        raise ConfigError(
            f"the keys directory {directory} has no TLS certificates for the stream transport "
            f"(stream_listen): run `fabric auth init --dir {directory}` to add them (existing keys stay), "
            "then `fabric auth add-client NAME` for each client that uses fabric:// endpoints"
        )


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write a file created with ``mode`` from the start (a private key is never world-readable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _builder(subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, days: int) -> x509.CertificateBuilder:
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks a little apart
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        if not host or not all(c.isalnum() or c in ".-*" for c in host):
            raise BadParameter(f"host {host!r}: an IP address or a DNS name") from None
        return x509.DNSName(host)


def init(directory: str | Path, hosts: Sequence[str] = ()) -> None:
    """The CA and the nodes' certificate (for 127.0.0.1, ::1, localhost and ``hosts``).
    Refuses to replace a CA that is there (clients trust it)."""
    d = Path(directory)
    if ca_cert_path(d).exists():
        raise ConfigError(f"{d} already holds a deployment CA ({CA_CERT}); nothing changed")
    names = [_san(h) for h in dict.fromkeys([*DEFAULT_HOSTS, *hosts])]  # checked before anything is written
    (d / TLS).mkdir(parents=True, exist_ok=True)
    os.chmod(d / TLS, 0o700)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"fabric deployment CA ({d.resolve().name})")])
    ca = (
        _builder(f"fabric deployment CA ({d.resolve().name})", ca_name, ca_key, CA_DAYS)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    server = (
        _leaf("fabric node", ca, ca_key, key, ExtendedKeyUsageOID.SERVER_AUTH)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = server_files(d)
    _write(d / TLS / "ca.key", _key_pem(ca_key), 0o600)
    _write(key_path, _key_pem(key), 0o600)
    _write(cert_path, _cert_pem(server), 0o644)
    _write(ca_cert_path(d), _cert_pem(ca), 0o644)  # last: its presence says the rest is there


def _usage(*, cert_sign: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _leaf(
    name: str,
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    key: ec.EllipticCurvePrivateKey,
    usage: x509.ObjectIdentifier,
) -> x509.CertificateBuilder:
    return (
        _builder(name, ca.subject, key, CERT_DAYS)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )


def _load_ca(d: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        ca = x509.load_pem_x509_certificate(ca_cert_path(d).read_bytes())
        ca_key = serialization.load_pem_private_key((d / TLS / "ca.key").read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the deployment CA in {d}: {exc} (made by `fabric auth init`)") from None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{d / TLS / 'ca.key'} is not the EC key `fabric auth init` makes")
    return ca, ca_key


def issue_client(directory: str | Path, name: str) -> tuple[Path, Path]:
    """A certificate with CN=``name`` signed by the CA: (the allowed copy in clients/, the
    client's key and certificate in issued/NAME.pem, 0600)."""
    d = Path(directory)
    ca, ca_key = _load_ca(d)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _leaf(name, ca, ca_key, key, ExtendedKeyUsageOID.CLIENT_AUTH).sign(ca_key, hashes.SHA256())
    (d / "revoked" / f"{name}.crt").unlink(missing_ok=True)
    bundle = d / "issued" / f"{name}.pem"
    _write(bundle, _key_pem(key) + _cert_pem(cert), 0o600)
    allowed = d / "clients" / f"{name}.crt"
    _write(allowed, _cert_pem(cert), 0o644)
    return allowed, bundle


def revoke_client(directory: str | Path, name: str) -> bool:
    """Move client ``name``'s certificate to revoked/ (False: it had none)."""
    d = Path(directory)
    (d / "issued" / f"{name}.pem").unlink(missing_ok=True)
    src = d / "clients" / f"{name}.crt"
    if not src.exists():
        return False
    shutil.move(src, d / "revoked" / f"{name}.crt")
    return True


def _read(path: Path) -> x509.Certificate | None:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return None


def common_name(cert: x509.Certificate) -> str:
    attrs = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = attrs[0].value if attrs else ""
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def allowed(directory: str | Path) -> dict[str, int]:
    """Allowed client certificates: name -> serial number (a file whose CN is not its name is skipped)."""
    out = {}
    for p in (Path(directory) / "clients").glob("*.crt"):
        cert = _read(p)
        if cert is not None and common_name(cert) == p.stem:
            out[p.stem] = cert.serial_number
    return out


def describe(path: Path) -> str:
    """``serial (until date)`` of a certificate file, "" if it is not there or unreadable."""
    cert = _read(path)
    if cert is None:
        return ""
    return f"{cert.serial_number:x}"[:16] + f" (until {cert.not_valid_after_utc.date()})"
