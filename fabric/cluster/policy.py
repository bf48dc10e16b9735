"""A cluster's ACLs and quotas, one etcd key each, shared by every node (issue 12).

Theory of operation
-------------------
On a single node ACLs and runtime quotas live in its ``meta.sqlite``. A cluster keeps them in
etcd, so that a rule added through any node or router holds on every store:

* ``/fabric/acls`` = ``{"rules": [{"principal", "operation", "resource"}, ...]}``
* ``/fabric/quotas`` = ``{"quotas": [{"target", "messages_per_s", "bytes_per_s", "burst_ms"}, ...]}``
  (a quota with both rates 0 stays in the list: it overrides a ``[quotas]`` entry of the config)

A change is a read-modify-write with a compare-and-swap on the key's ``mod_revision``
(``change_acl``, ``set_quota``, on a node's cluster thread): two ``acl add`` on two nodes at once
both land, the second one retrying on the first one's document. ``poll`` (the cluster thread,
every ``POLL_MS``) reads both keys and returns a document whose revision moved, for the node to
apply on its loop. The documents are small (rules and quotas are set by people), so they are read
whole rather than watched.

The merges (``merge_acl``, ``merge_quota``) are pure; the node validates what it applies.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fabric.cluster.meta import Compare, KeyValue, MetaStore, MetaUnavailable, Put

log = logging.getLogger(__name__)
ACLS_KEY = "/fabric/acls"
QUOTAS_KEY = "/fabric/quotas"
POLL_MS = 500
CAS_TRIES = 20
RULE_FIELDS = ("principal", "operation", "resource")
QUOTA_FIELDS = ("target", "messages_per_s", "bytes_per_s", "burst_ms")


def parse_rules(value: bytes | None) -> list[dict[str, str]]:
    """The rules of an ``/fabric/acls`` value (None: no key yet); unreadable entries are left out."""
    return [
        {f: r[f] for f in RULE_FIELDS}
        for r in _list(value, "rules")
        if all(isinstance(r.get(f), str) for f in RULE_FIELDS)
    ]


def parse_quotas(value: bytes | None) -> list[dict[str, Any]]:
    """The quotas of an ``/fabric/quotas`` value; unreadable entries are left out."""
    return [
        {f: q[f] for f in QUOTA_FIELDS}
        for q in _list(value, "quotas")
        if isinstance(q.get("target"), str) and all(type(q.get(f)) is int for f in QUOTA_FIELDS[1:])
    ]


def _list(value: bytes | None, field: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    try:
        doc = json.loads(value)
    except ValueError:
        log.warning("cannot read the cluster's %s: %r", field, value[:200])
        return []
    items = doc.get(field) if isinstance(doc, dict) else None
    return [x for x in items if isinstance(x, dict)] if isinstance(items, list) else []


def merge_acl(value: bytes | None, rule: dict[str, str], add: bool) -> tuple[bytes | None, bool, int]:
    """``rule`` added to (or removed from) the document ``value``: (the new value, or None when
    nothing changed; changed; how many rules it holds)."""
    rules = parse_rules(value)
    rule = {f: rule[f] for f in RULE_FIELDS}
    present = rule in rules
    if present == add:
        return None, False, len(rules)
    rules = [*rules, rule] if add else [r for r in rules if r != rule]
    return json.dumps({"rules": rules}, sort_keys=True).encode(), True, len(rules)


def merge_quota(value: bytes | None, quota: dict[str, Any]) -> bytes | None:
    """``quota`` set in the document ``value`` (replacing its target's): the new value, or None
    when it held exactly that already."""
    quotas = parse_quotas(value)
    quota = {f: quota[f] for f in QUOTA_FIELDS}
    if quota in quotas:
        return None
    quotas = [q for q in quotas if q["target"] != quota["target"]] + [quota]
    return json.dumps({"quotas": quotas}, sort_keys=True).encode()


class Policy:
    """The cluster thread's side: CAS writes and the poll of both keys."""

    def __init__(self, meta: MetaStore) -> None:
        self._meta = meta
        self._revisions = {ACLS_KEY: -1, QUOTAS_KEY: -1}  # mod_revision applied (0: no key)
        self._next_poll_ms = 0

    def change_acl(self, rule: dict[str, str], add: bool) -> tuple[list[dict[str, str]], bool]:
        """Add or remove ``rule`` in etcd: (the rules now, changed). Raises MetaUnavailable."""
        for _ in range(CAS_TRIES):
            kv = self._meta.get(ACLS_KEY)
            new, changed, _count = merge_acl(kv.value if kv else None, rule, add)
            if new is None:
                return parse_rules(kv.value if kv else None), False
            if self._cas(ACLS_KEY, kv, new):
                return parse_rules(new), changed
        raise MetaUnavailable("could not change the ACLs (etcd busy: other writers); retry")

    def set_quota(self, quota: dict[str, Any]) -> list[dict[str, Any]]:
        """Set ``quota`` in etcd: the quotas now. Raises MetaUnavailable."""
        for _ in range(CAS_TRIES):
            kv = self._meta.get(QUOTAS_KEY)
            new = merge_quota(kv.value if kv else None, quota)
            if new is None:
                return parse_quotas(kv.value if kv else None)
            if self._cas(QUOTAS_KEY, kv, new):
                return parse_quotas(new)
        raise MetaUnavailable("could not set the quota (etcd busy: other writers); retry")

    def _cas(self, key: str, kv: KeyValue | None, value: bytes) -> bool:
        cond = Compare.modified_at(key, kv.mod_revision) if kv is not None else Compare.absent(key)
        return self._meta.txn([cond], [Put(key, value)]).succeeded

    def poll(self, now_ms: int) -> tuple[list[dict[str, str]] | None, list[dict[str, Any]] | None]:
        """(rules, quotas) whose key changed since the last poll (None: unchanged, or not due)."""
        if now_ms < self._next_poll_ms:
            return None, None
        self._next_poll_ms = now_ms + POLL_MS
        out: list[Any] = []
        for key, parse in ((ACLS_KEY, parse_rules), (QUOTAS_KEY, parse_quotas)):
            try:
                kv = self._meta.get(key)
            except MetaUnavailable:
                out.append(None)
                continue
            revision = kv.mod_revision if kv is not None else 0
            if revision == self._revisions[key]:
                out.append(None)
                continue
            self._revisions[key] = revision
            out.append(parse(kv.value if kv is not None else None))
        return out[0], out[1]
