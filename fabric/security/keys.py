"""The CurveZMQ keys of a deployment, in one directory (``fabric auth init DIR``).

Layout::

    DIR/server.key            the nodes' public key: every client needs it (not secret)
    DIR/server.key_secret     the nodes' key pair (0600): only the nodes and routers read it
    DIR/clients/NAME.key      the public key of each allowed client: NAME is its principal
    DIR/issued/NAME.key_secret the key pair handed to client NAME (0600; move it to the client)
    DIR/revoked/NAME.key      revoked clients (their key is refused from then on)
    DIR/internal.key_secret   the cluster's internal key pair (0600): what nodes and routers connect
                              to other nodes with (replication, requests passed on, routed clients)
    DIR/clients/__internal.key its public key: the principal ``__internal``, allowed everything,
                              and the only one that may send internal requests

Names starting with ``__`` are fabric's own: ``add-client`` and ``revoke`` refuse them.

Files are zmq.auth certificates (ZPL text, z85 keys). A node reads ``clients/`` when it starts
and again whenever the directory changes, so ``add-client`` and ``revoke`` need no restart; a
revoked client's connection is refused at its next request.

The same directory holds the TLS certificates of the stream transport (:mod:`fabric.security.certs`:
``ca.crt``, ``tls/``, ``clients/NAME.crt``, ``issued/NAME.pem``): ``init`` makes the CA and the
nodes' certificate too, ``add_client`` a client certificate with the key pair, ``revoke`` revokes
both. A directory made before TLS keeps working for ZeroMQ; ``init`` on it adds the certificates.
A directory made before the internal identity keeps working for a single node; ``init`` on it
adds the internal key pair (a cluster with ``keys_dir`` needs it), leaving everything else as it
is.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import zmq
import zmq.auth

from fabric.errors import BadParameter, ConfigError
from fabric.security import certs

SERVER = "server"
INTERNAL = "__internal"  # the principal of the cluster's own connections (nodes, routers)
INTERNAL_PAIR = "internal"  # DIR/internal.key_secret
RESERVED_PREFIX = "__"


def _private(path: Path) -> None:
    os.chmod(path, 0o600)


def init(directory: str | Path, hosts: Sequence[str] = ()) -> Path:
    """Create the directory, the server key pair, the internal key pair and the TLS certificates
    (the nodes' for ``hosts`` besides loopback); refuses to overwrite existing ones. On a directory
    made before TLS or before the internal identity, adds what is missing and keeps the rest."""
    d = Path(directory)
    if (d / f"{SERVER}.key_secret").exists():
        tls, internal = certs.ca_cert_path(d).exists(), has_internal(d)
        if tls and internal:
            raise ConfigError(f"{d} already holds a deployment's keys (server.key_secret); nothing changed")
        if not tls:
            certs.init(d, hosts)
        if not internal:
            _make_internal(d)
        return d
    for sub in ("", "clients", "issued", "revoked"):
        (d / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(d / sub, 0o700)
    certs.init(d, hosts)  # first: it checks the host names before it writes anything
    public, secret = zmq.auth.create_certificates(str(d), SERVER)
    _private(Path(secret))
    os.chmod(public, 0o644)
    _make_internal(d)
    return d


def has_internal(directory: str | Path) -> bool:
    d = Path(directory)
    return (d / f"{INTERNAL_PAIR}.key_secret").exists() and (d / "clients" / f"{INTERNAL}.key").exists()


def _make_internal(d: Path) -> None:
    """The internal key pair: its secret beside the server's, its public key in clients/."""
    public, secret = zmq.auth.create_certificates(str(d), INTERNAL_PAIR)
    _private(Path(secret))
    shutil.move(public, d / "clients" / f"{INTERNAL}.key")


def internal_pair(directory: str | Path) -> tuple[bytes, bytes]:
    """The internal key pair (public, secret): ConfigError naming the command that makes it."""
    d = Path(directory)
    path = d / f"{INTERNAL_PAIR}.key_secret"
    if not has_internal(d):
        raise ConfigError(
            f"{d} has no internal key pair ({path.name} and clients/{INTERNAL}.key), which the nodes and "
            f"routers of a cluster connect to each other with: run `fabric auth init --dir {d}` (it adds them "
            "and changes nothing else), then copy the directory to every machine"
        )
    public, secret = load_pair(path)
    if secret is None:
        raise ConfigError(f"{path} holds no secret key")
    return public, secret


def _check_name(name: str) -> None:
    if not name or not all(c.isalnum() or c in "._-" for c in name) or name.startswith("."):
        raise BadParameter(f"client name {name!r}: letters, digits, '.', '_' and '-'")
    if name.startswith(RESERVED_PREFIX):
        raise BadParameter(f"client name {name!r}: names starting with {RESERVED_PREFIX!r} are fabric's own")


def add_client(directory: str | Path, name: str) -> tuple[Path, Path, Path | None]:
    """A key pair for client ``name`` and, when the directory has a CA, its TLS certificate:
    (its public key in clients/, its key pair in issued/, its key and certificate in issued/ or
    None). A client that has a key but no certificate yet (made before TLS) gets only the
    certificate."""
    d = Path(directory)
    _check_name(name)
    if not (d / f"{SERVER}.key").exists():
        raise ConfigError(f"{d} holds no deployment keys: run `fabric auth init {d}` first")
    tls = certs.ca_cert_path(d).exists()
    if (d / "clients" / f"{name}.key").exists():
        if not tls or (d / "clients" / f"{name}.crt").exists():
            raise BadParameter(f"client {name!r} exists already")
        return d / "clients" / f"{name}.key", d / "issued" / f"{name}.key_secret", certs.issue_client(d, name)[1]
    (d / "revoked" / f"{name}.key").unlink(missing_ok=True)
    public, secret = zmq.auth.create_certificates(str(d / "issued"), name)
    _private(Path(secret))
    shutil.move(public, d / "clients" / f"{name}.key")
    bundle = certs.issue_client(d, name)[1] if tls else None
    return d / "clients" / f"{name}.key", Path(secret), bundle


def revoke(directory: str | Path, name: str) -> None:
    d = Path(directory)
    _check_name(name)
    src = d / "clients" / f"{name}.key"
    if not src.exists():
        raise BadParameter(f"no client {name!r} in {d / 'clients'}")
    shutil.move(src, d / "revoked" / f"{name}.key")
    (d / "issued" / f"{name}.key_secret").unlink(missing_ok=True)
    certs.revoke_client(d, name)


def list_clients(directory: str | Path) -> list[dict[str, str]]:
    """Allowed and revoked clients, then the internal identity (state ``internal``) if any."""
    d = Path(directory)
    out = []
    for state in ("clients", "revoked"):
        for p in sorted((d / state).glob("*.key")):
            if p.stem.startswith(RESERVED_PREFIX):
                continue
            out.append(_listed(d, state, p))
    internal = d / "clients" / f"{INTERNAL}.key"
    if internal.exists():
        out.append({**_listed(d, "clients", internal), "state": "internal"})
    return out


def _listed(d: Path, state: str, p: Path) -> dict[str, str]:
    public, _ = zmq.auth.load_certificate(str(p))
    return {
        "name": p.stem,
        "state": "allowed" if state == "clients" else "revoked",
        "key": public.decode(),
        "certificate": certs.describe(d / state / f"{p.stem}.crt"),
    }


def client_keys(directory: str | Path) -> dict[bytes, str]:
    """Allowed clients: z85 public key -> name."""
    d = Path(directory) / "clients"
    out = {}
    for p in d.glob("*.key"):
        try:
            public, _ = zmq.auth.load_certificate(str(p))
        except (OSError, ValueError):
            continue
        out[public] = p.stem
    return out


def server_pair(directory: str | Path) -> tuple[bytes, bytes]:
    path = Path(directory) / f"{SERVER}.key_secret"
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the server key pair {path}: {exc} (made by `fabric auth init`)") from None
    if secret is None:
        raise ConfigError(f"{path} holds no secret key")
    return public, secret


def load_pair(path: str | Path) -> tuple[bytes, bytes | None]:
    try:
        return zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the key file {path}: {exc}") from None
