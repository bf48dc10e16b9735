"""The CurveZMQ keys of a deployment, in one directory (``fabric auth init DIR``).

Layout::

    DIR/server.key            the nodes' public key: every client needs it (not secret)
    DIR/server.key_secret     the nodes' key pair (0600): only the nodes and routers read it
    DIR/clients/NAME.key      the public key of each allowed client: NAME is its principal
    DIR/issued/NAME.key_secret the key pair handed to client NAME (0600; move it to the client)
    DIR/revoked/NAME.key      revoked clients (their key is refused from then on)

Files are zmq.auth certificates (ZPL text, z85 keys). A node reads ``clients/`` when it starts
and again whenever the directory changes, so ``add-client`` and ``revoke`` need no restart; a
revoked client's connection is refused at its next request.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import zmq
import zmq.auth

from fabric.errors import BadParameter, ConfigError

SERVER = "server"


def _private(path: Path) -> None:
    os.chmod(path, 0o600)


def init(directory: str | Path) -> Path:
    """Create the directory and the server key pair; refuses to overwrite an existing one."""
    d = Path(directory)
    if (d / f"{SERVER}.key_secret").exists():
        raise ConfigError(f"{d} already holds a deployment's keys (server.key_secret); nothing changed")
    for sub in ("", "clients", "issued", "revoked"):
        (d / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(d / sub, 0o700)
    public, secret = zmq.auth.create_certificates(str(d), SERVER)
    _private(Path(secret))
    os.chmod(public, 0o644)
    return d


def _check_name(name: str) -> None:
    if not name or not all(c.isalnum() or c in "._-" for c in name) or name.startswith("."):
        raise BadParameter(f"client name {name!r}: letters, digits, '.', '_' and '-'")


def add_client(directory: str | Path, name: str) -> tuple[Path, Path]:
    """A key pair for client ``name``: (its public key in clients/, its key pair in issued/)."""
    d = Path(directory)
    _check_name(name)
    if not (d / f"{SERVER}.key").exists():
        raise ConfigError(f"{d} holds no deployment keys: run `fabric auth init {d}` first")
    if (d / "clients" / f"{name}.key").exists():
        raise BadParameter(f"client {name!r} exists already")
    (d / "revoked" / f"{name}.key").unlink(missing_ok=True)
    public, secret = zmq.auth.create_certificates(str(d / "issued"), name)
    _private(Path(secret))
    shutil.move(public, d / "clients" / f"{name}.key")
    return d / "clients" / f"{name}.key", Path(secret)


def revoke(directory: str | Path, name: str) -> None:
    d = Path(directory)
    _check_name(name)
    src = d / "clients" / f"{name}.key"
    if not src.exists():
        raise BadParameter(f"no client {name!r} in {d / 'clients'}")
    shutil.move(src, d / "revoked" / f"{name}.key")
    (d / "issued" / f"{name}.key_secret").unlink(missing_ok=True)


def list_clients(directory: str | Path) -> list[dict[str, str]]:
    d = Path(directory)
    out = []
    for state in ("clients", "revoked"):
        for p in sorted((d / state).glob("*.key")):
            public, _ = zmq.auth.load_certificate(str(p))
            out.append(
                {"name": p.stem, "state": "allowed" if state == "clients" else "revoked", "key": public.decode()}
            )
    return out


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
