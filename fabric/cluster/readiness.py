"""When a started cluster is ready: what ``fabric up --config`` waits for before it says so.

Theory of operation
-------------------
A cluster is ready when a client given the routers can use it at once (the README's next step,
``fabric queue create orders -p 3``, succeeds):

* every configured store is registered in etcd (its key under ``/fabric/nodes/``, held by its
  live lease), so the controller places replicas on all of them;
* a controller is elected (``/fabric/controller``), so queue requests have somewhere to go;
* every configured router is registered (``/fabric/routers/``) and **reaches** every store: a
  PING sent through the router naming the store (``node``) is answered by that store. The router
  sends such a PING to the store only when its map names the store and its link to it is up, so
  the answer shows both.

``judge`` is the rule, over what etcd holds and a ``reaches(router_endpoint, store)`` probe
passed in (the probe is a client request, which this layer may not make itself); ``read_view``
reads etcd. ``Readiness.missing`` names what is not there yet, for the progress line and for
the error when the wait times out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fabric.cluster.keys import CONTROLLER_KEY, NODES_PREFIX, ROUTERS_PREFIX, parse_node
from fabric.cluster.meta import MetaStore
from fabric.settings import ClusterConfig

Reaches = Callable[[str, str], bool]  # (router endpoint, store name) -> the store answered through it


@dataclass(frozen=True)
class View:
    """What etcd says: registered stores and routers (name -> endpoint), the controller's name."""

    stores: Mapping[str, str] = field(default_factory=dict)
    routers: Mapping[str, str] = field(default_factory=dict)
    controller: str | None = None


@dataclass(frozen=True)
class Readiness:
    stores_missing: tuple[str, ...] = ()  # configured, not registered
    controller: str | None = None
    routers_missing: tuple[str, ...] = ()  # configured, not registered
    unreached: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # router -> stores it does not reach
    etcd_error: str = ""  # etcd did not answer: nothing else is known

    @property
    def ready(self) -> bool:
        return (
            not self.etcd_error
            and not self.stores_missing
            and self.controller is not None
            and not self.routers_missing
            and not any(self.unreached.values())
        )

    def missing(self) -> str:
        """What is not ready yet, in one line ("" when ready)."""
        if self.etcd_error:
            return f"etcd does not answer ({self.etcd_error})"
        parts = []
        if self.stores_missing:
            parts.append("stores not registered: " + ", ".join(self.stores_missing))
        if self.controller is None:
            parts.append("no controller elected")
        if self.routers_missing:
            parts.append("routers not registered: " + ", ".join(self.routers_missing))
        for router, stores in sorted(self.unreached.items()):
            if stores:
                parts.append(f"router {router} does not reach " + ", ".join(stores))
        return "; ".join(parts)


def read_view(meta: MetaStore) -> View:
    """Registered stores and routers and the controller, from one read of the cluster's keys."""
    kvs, _ = meta.get_prefix("/fabric/")
    stores: dict[str, str] = {}
    routers: dict[str, str] = {}
    controller = None
    for kv in kvs:
        if kv.key.startswith(NODES_PREFIX):
            info = parse_node(kv)
            if info is not None:
                stores[info.name] = info.endpoint
        elif kv.key.startswith(ROUTERS_PREFIX) or kv.key == CONTROLLER_KEY:
            try:
                value = json.loads(kv.value)
            except ValueError:
                continue
            if kv.key == CONTROLLER_KEY:
                controller = str(value.get("name")) if isinstance(value, dict) else None
            elif isinstance(value, dict) and "endpoint" in value:
                routers[kv.key[len(ROUTERS_PREFIX) :]] = str(value["endpoint"])
    return View(stores, routers, controller)


def judge(cluster: ClusterConfig, view: View, reaches: Reaches | None) -> Readiness:
    """How ready the cluster of ``cluster`` is, given ``view``. Each registered router is probed
    for each registered store (``reaches`` None: routers are judged by registration alone)."""
    stores = [n.node_id for n in cluster.nodes]
    routers = [r.router_id for r in cluster.routers]
    unreached: dict[str, tuple[str, ...]] = {}
    if reaches is not None:
        for r in routers:
            endpoint = view.routers.get(r)
            if endpoint is not None:
                unreached[r] = tuple(s for s in stores if s in view.stores and not reaches(endpoint, s))
    return Readiness(
        stores_missing=tuple(s for s in stores if s not in view.stores),
        controller=view.controller,
        routers_missing=tuple(r for r in routers if r not in view.routers),
        unreached=unreached,
    )
