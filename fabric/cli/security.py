"""`fabric auth` (the CurveZMQ keys and TLS certificates of a deployment) and `fabric acl` (who may do what)."""

from __future__ import annotations

from typing import Any

import click

from fabric.cli.common import ENDPOINT, JSON, _admin, _emit, _Group, _table

KEYS_DIR = click.option(
    "--dir",
    "keys_dir",
    envvar="FABRIC_KEYS_DIR",
    default="./fabric-keys",
    show_default=True,
    help="The deployment's keys directory ([security] keys_dir; env FABRIC_KEYS_DIR).",
)


@click.group(cls=_Group)
def auth() -> None:
    """Keys for CurveZMQ (tcp://) and certificates for TLS (fabric://): the nodes' and one per
    client (its name is its principal)."""


@auth.command("init")
@KEYS_DIR
@click.option(
    "--host",
    "hosts",
    multiple=True,
    help="A name or address clients reach the nodes' stream transport by (repeatable; 127.0.0.1, ::1 "
    "and localhost are always in the certificate).",
)
def auth_init(keys_dir: str, hosts: tuple[str, ...]) -> None:
    """Create the keys directory: the nodes' key pair, a deployment CA and the nodes' TLS
    certificate (secret files 0600). On a directory made before TLS: adds the certificates."""
    from pathlib import Path

    from fabric.security import keys

    upgrade = (Path(keys_dir) / "server.key_secret").exists()
    had_tls = (Path(keys_dir) / "ca.crt").exists()
    had_internal = keys.has_internal(keys_dir)
    d = keys.init(keys_dir, hosts)
    if upgrade:
        if not had_tls:
            click.echo(f"TLS certificates added to {d.resolve()} (keys unchanged): ca.crt (give it to every client)")
            click.echo(f"next: `fabric auth add-client NAME --dir {d}` gives each existing client its certificate")
        if not had_internal:
            click.echo(
                f"internal key pair in {d.resolve()} (nodes and routers of a cluster connect to each other with it): "
                "copy the directory to every machine"
            )
        return
    click.echo(
        f"keys in {d.resolve()}: server.key and ca.crt (give them to every client), "
        "server.key_secret, internal.key_secret and tls/ (nodes and routers only; in a cluster copy the "
        "directory to every machine)"
    )
    click.echo(
        f"next: set [security] keys_dir = {str(d.resolve())!r} in the node's config, then `fabric auth add-client NAME`"
    )


@auth.command("add-client")
@click.argument("name")
@KEYS_DIR
def auth_add_client(name: str, keys_dir: str) -> None:
    """Allow client NAME (its principal): writes its key pair to hand over (0600)."""
    from pathlib import Path

    from fabric.security import keys

    public, secret, bundle = keys.add_client(keys_dir, name)
    server = (Path(keys_dir) / "server.key").resolve()
    click.echo(f"client {name} allowed ({public}); its key pair: {secret.resolve()}")
    if bundle is not None:
        click.echo(f"its TLS key and certificate (CN={name}): {bundle.resolve()} (keep it beside the key pair)")
    click.echo(f"the client uses: FABRIC_CLIENT_CERT={secret.resolve()} FABRIC_SERVER_CERT={server}")


@auth.command("list")
@KEYS_DIR
@JSON
def auth_list(keys_dir: str, as_json: bool) -> None:
    """Clients, whether they are allowed or revoked, their key and their certificate."""
    from fabric.security import keys

    _emit(
        keys.list_clients(keys_dir),
        as_json,
        lambda rows: _table(rows, ["name", "state", "key", "certificate"]) if rows else "no clients",
    )


@auth.command("revoke")
@click.argument("name")
@KEYS_DIR
def auth_revoke(name: str, keys_dir: str) -> None:
    """Revoke client NAME (its key and its certificate): running nodes refuse its requests within a
    second, and its new connections."""
    from fabric.security import keys

    keys.revoke(keys_dir, name)
    click.echo(f"client {name} revoked")


@click.group(cls=_Group)
def acl() -> None:
    """Who may produce, consume or administer which queues and groups (authentication on)."""


def _rule_args(fn: Any) -> Any:
    fn = click.argument("resource")(fn)
    fn = click.argument("operation", type=click.Choice(["produce", "consume", "admin"]))(fn)
    return click.argument("principal")(fn)


@acl.command("add")
@_rule_args
@ENDPOINT
@JSON
def acl_add(principal: str, operation: str, resource: str, endpoint: str, as_json: bool) -> None:
    """Allow PRINCIPAL to OPERATION on RESOURCE: a queue, a prefix ending in * (orders.*), or
    group:NAME. Deny by default: what no rule allows is refused."""

    with _admin(endpoint) as admin:
        changed = admin.acl_add(principal, operation, resource)
    _emit({"changed": changed}, as_json, lambda d: "added" if d["changed"] else "already there")


@acl.command("remove")
@_rule_args
@ENDPOINT
@JSON
def acl_remove(principal: str, operation: str, resource: str, endpoint: str, as_json: bool) -> None:
    """Remove a rule."""

    with _admin(endpoint) as admin:
        changed = admin.acl_remove(principal, operation, resource)
    _emit({"changed": changed}, as_json, lambda d: "removed" if d["changed"] else "no such rule")


@acl.command("list")
@click.option("--principal", default=None, help="Only this principal's rules.")
@ENDPOINT
@JSON
def acl_list(principal: str | None, endpoint: str, as_json: bool) -> None:
    """The rules in force (and the [security] admins, who may do everything)."""

    with _admin(endpoint) as admin:
        d = admin.acl_list(principal)
    _emit(
        d,
        as_json,
        lambda d: (
            (_table(d["rules"], ["principal", "operation", "resource"]) if d["rules"] else "no rules")
            + f"\nadmins: {', '.join(d['admins']) or 'none'}"
        ),
    )


@click.group(cls=_Group)
def quota() -> None:
    """Rate limits per queue or per principal: producers over them are slowed, not failed."""


@quota.command("set")
@click.argument("target")
@click.option("--messages-per-s", type=click.IntRange(min=0), default=0, show_default=True, help="0 = no limit.")
@click.option("--bytes-per-s", type=click.IntRange(min=0), default=0, show_default=True, help="0 = no limit.")
@click.option(
    "--burst-ms", type=click.IntRange(1, 60_000), default=1000, show_default=True, help="Burst, in ms of the rate."
)
@ENDPOINT
@JSON
def quota_set(target: str, messages_per_s: int, bytes_per_s: int, burst_ms: int, endpoint: str, as_json: bool) -> None:
    """Limit TARGET (queue:NAME or principal:NAME; both rates 0 removes the limit)."""

    with _admin(endpoint) as admin:
        q = admin.quota_set(target, messages_per_s=messages_per_s, bytes_per_s=bytes_per_s, burst_ms=burst_ms)
    _emit(
        q,
        as_json,
        lambda q: f"{q['target']}: {q['messages_per_s']} msg/s, {q['bytes_per_s']} B/s, burst {q['burst_ms']} ms",
    )


@quota.command("list")
@ENDPOINT
@JSON
def quota_list(endpoint: str, as_json: bool) -> None:
    """The quotas in force, and how much throttle time each has handed out."""

    with _admin(endpoint) as admin:
        d = admin.quota_list()
    rows = [
        {**q, "throttled_ms": d["throttled_ms"].get(q["target"], 0), "refused": d["refused"].get(q["target"], 0)}
        for q in d["quotas"]
    ]
    _emit(
        d,
        as_json,
        lambda _: (
            _table(rows, ["target", "messages_per_s", "bytes_per_s", "burst_ms", "throttled_ms", "refused"])
            if rows
            else "no quotas"
        ),
    )


# ------------------------------------------------------------------ encryption at rest


@auth.group("at-rest-key", cls=_Group)
def at_rest_key() -> None:
    """The key file of queues encrypted at rest (queue setting encrypt = true): AES-256-GCM keys
    with ids. The newest key encrypts; every key ever used stays, for the data it sealed."""


@at_rest_key.command("init")
@click.argument("file", type=click.Path(dir_okay=False))
def at_rest_key_init(file: str) -> None:
    """Create FILE (mode 0600) with a first key, id 1."""
    import time
    from pathlib import Path

    from fabric.security import at_rest

    entry = at_rest.init_key_file(file, now_ms=time.time_ns() // 1_000_000)
    path = Path(file).resolve()
    click.echo(f"at-rest key id {entry.key_id} ({entry.fingerprint}) in {path}")
    click.echo(f"next: set [security] at_rest_key_file = {str(path)!r} in the node's config (every node of a cluster)")


@at_rest_key.command("rotate")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
def at_rest_key_rotate(file: str) -> None:
    """Add a new key to FILE: new batches are encrypted with it, older ones keep theirs. Running
    nodes take it within a second; copy FILE to every node of a cluster."""
    import time

    from fabric.security import at_rest

    entry = at_rest.rotate_key_file(file, now_ms=time.time_ns() // 1_000_000)
    click.echo(f"at-rest key id {entry.key_id} ({entry.fingerprint}) added; it encrypts new batches from now on")


@at_rest_key.command("list")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@JSON
def at_rest_key_list(file: str, as_json: bool) -> None:
    """The keys of FILE: id, fingerprint (not the key), creation time, which one is newest."""
    from fabric.security import at_rest

    _emit(
        at_rest.list_key_file(file),
        as_json,
        lambda rows: _table(rows, ["id", "algorithm", "fingerprint", "created_ms", "newest"]),
    )
