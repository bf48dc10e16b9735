"""Queue settings and node configuration, validated with errors that name the key.

A queue's settings come from three places, later ones winning: the built-in
defaults below, the ``[queue_defaults]`` table of the node's TOML config, and
the ``settings`` of a CREATE_QUEUE request. The same validation serves all
three, so ``partitions = "3"`` in a config file and ``{"partitions": "3"}`` on
the wire both fail with a message naming ``partitions``.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fabric.errors import BadParameter, ConfigError, FabricError

FSYNC_POLICIES = ("always", "interval", "never")
EXPIRE_POLICIES = ("dead_letter", "drop")
OVERFLOW_POLICIES = ("reject", "dead_letter_oldest")
ORDERINGS = ("fifo", "strict")
TTL_MS_MAX = 0xFFFFFFFF  # a batch carries its TTL as u32 ms (about 49 days)
DEFAULT_LISTEN = "tcp://127.0.0.1:7420"
DEFAULT_DATA_DIR = "./fabric-data"
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class QueueSettings:
    partitions: int = 1
    max_message_bytes: int = 1 * MIB
    max_batch_bytes: int = 8 * MIB
    max_messages: int = 0  # queue size limit in messages, 0 = none
    max_bytes: int = 0  # queue size limit in bytes on disk, 0 = none
    retention_ms: int = 7 * 24 * 3600 * 1000  # 0 = keep forever
    retention_bytes: int = 0  # per partition, 0 = no byte limit
    fsync: str = "always"
    fsync_interval_ms: int = 100
    segment_bytes: int = 64 * MIB
    segment_ms: int = 24 * 3600 * 1000
    index_interval_bytes: int = 4096
    visibility_timeout_ms: int = 30_000  # queue subscriptions: how long a delivery is leased
    max_receive_count: int = 0  # deliveries before a message is dead-lettered (0 = never)
    dead_letter_queue: str = ""  # where dead letters go ("" = "<queue>.dlq", created when first needed)
    dedup_window_ms: int = 0  # drop a message whose dedup id was seen this recently (0 = off)
    default_ttl_ms: int = 0  # queue subscriptions: a message unsettled this long after it was sent expires (0 = never)
    on_expire: str = "dead_letter"  # what happens to an expired message: "dead_letter" (reason expired) or "drop"
    priority_levels: int = 1  # messages carry a priority 0..levels-1; higher levels are delivered first
    ordering: str = "fifo"  # "fifo": arrival order per partition; "strict": producers' clocks (HLC), late -> .late
    ordering_window_ms: int = 100  # strict: how long the leader waits for records with earlier clocks
    overflow: str = "reject"  # at max_messages: "reject" new messages, or "dead_letter_oldest" to make room
    replication_factor: int = 0  # cluster: replicas of each partition (0 = [cluster] replication_factor)
    unclean_leader_election: bool = False  # cluster: elect a replica outside the ISR rather than stay offline
    encrypt: bool = False  # records encrypted on disk (AES-GCM, [security] at_rest_key_file); set at create
    auto_partitions_max: int = 0  # auto-expand: add partitions (doubling) up to this many under load (0 = off)
    auto_partitions_bytes_per_s: int = 4 * MIB  # auto-expand: a partition writing more than this is loaded
    auto_partitions_after_ms: int = 60_000  # auto-expand: how long the load must last before partitions are added
    # federation moves (fabric queue move): a sealed queue refuses PRODUCE with QUEUE_MOVED unless
    # the request is the move's own copy ("import"); set and cleared by the cluster's controller
    sealed: bool = False
    auto_partitions_min: int = 0  # shrinking: never fewer partitions than this (0 = the count at create)
    auto_partitions_idle_ms: int = 600_000  # shrinking: halve after this long below a quarter of the load (0 = never)
    mode: str = (
        "log"  # "log": stored, replicated, acknowledged; "direct": brokerless, producers -> consumers, at most once
    )

    @classmethod
    def from_dict(
        cls,
        data: dict[str, Any],
        *,
        base: QueueSettings | None = None,
        where: str = "queue settings",
        error: type[FabricError] = BadParameter,
    ) -> QueueSettings:
        base = base or cls()
        known = {f.name: f for f in fields(cls)}
        values = {}
        for key, value in data.items():
            if key not in known:
                raise error(f"{where}: unknown key {key!r} (known: {', '.join(known)})")
            expected = type(getattr(base, key))
            if type(value) is not expected:
                raise error(f"{where}: {key!r} must be {expected.__name__}, got {type(value).__name__} {value!r}")
            values[key] = value
        settings = dataclasses.replace(base, **values)
        if settings.auto_partitions_max and not settings.auto_partitions_min:
            settings = dataclasses.replace(settings, auto_partitions_min=min(settings.partitions, 4096))
        problem = settings.problem()
        if problem:
            key, text = problem
            raise error(f"{where}: {key!r} {text}")
        return settings

    def problem(self) -> tuple[str, str] | None:
        checks: list[tuple[str, bool, str]] = [
            ("partitions", 1 <= self.partitions <= 4096, "must be 1..4096"),
            ("max_message_bytes", 1 <= self.max_message_bytes <= 64 * MIB, "must be 1..67108864"),
            ("max_batch_bytes", 1024 <= self.max_batch_bytes <= 64 * MIB, "must be 1024..67108864"),
            ("max_messages", self.max_messages >= 0, "must be >= 0 (0 = no limit)"),
            ("max_bytes", self.max_bytes >= 0, "must be >= 0 (0 = no limit)"),
            ("retention_ms", self.retention_ms >= 0, "must be >= 0 (0 = keep forever)"),
            ("retention_bytes", self.retention_bytes >= 0, "must be >= 0 (0 = no limit)"),
            ("fsync", self.fsync in FSYNC_POLICIES, f"must be one of {', '.join(FSYNC_POLICIES)}"),
            ("fsync_interval_ms", 1 <= self.fsync_interval_ms <= 60_000, "must be 1..60000"),
            ("segment_bytes", 64 * 1024 <= self.segment_bytes <= 1024 * MIB, "must be 65536..1073741824"),
            ("segment_ms", self.segment_ms >= 1000, "must be >= 1000"),
            ("index_interval_bytes", 512 <= self.index_interval_bytes <= MIB, "must be 512..1048576"),
            ("visibility_timeout_ms", 1 <= self.visibility_timeout_ms <= 12 * 3600 * 1000, "must be 1..43200000"),
            ("max_receive_count", 0 <= self.max_receive_count <= 1000, "must be 0..1000 (0 = never dead-letter)"),
            ("dead_letter_queue", _queue_name_or_empty(self.dead_letter_queue), "must be empty or a queue name"),
            ("dedup_window_ms", 0 <= self.dedup_window_ms <= 7 * 24 * 3600 * 1000, "must be 0..604800000"),
            ("default_ttl_ms", 0 <= self.default_ttl_ms <= TTL_MS_MAX, f"must be 0..{TTL_MS_MAX} (0 = never expire)"),
            ("on_expire", self.on_expire in EXPIRE_POLICIES, f"must be one of {', '.join(EXPIRE_POLICIES)}"),
            ("priority_levels", 1 <= self.priority_levels <= 10, "must be 1..10 (1 = no priorities)"),
            ("ordering", self.ordering in ORDERINGS, f"must be one of {', '.join(ORDERINGS)}"),
            ("ordering_window_ms", 1 <= self.ordering_window_ms <= 60_000, "must be 1..60000"),
            ("overflow", self.overflow in OVERFLOW_POLICIES, f"must be one of {', '.join(OVERFLOW_POLICIES)}"),
            ("replication_factor", 0 <= self.replication_factor <= 16, "must be 0..16 (0 = the cluster's default)"),
            ("partitions", self.partitions * self.priority_levels <= 4096, "times priority_levels must be <= 4096"),
            ("mode", self.mode in QUEUE_MODES, f"must be one of {', '.join(QUEUE_MODES)}"),
            ("auto_partitions_max", 0 <= self.auto_partitions_max <= 4096, "must be 0..4096 (0 = off)"),
            (
                "auto_partitions_max",
                self.auto_partitions_max == 0 or self.priority_levels == 1,
                "needs priority_levels = 1 (a priority queue's partitions cannot be added to)",
            ),
            ("auto_partitions_bytes_per_s", self.auto_partitions_bytes_per_s >= 1, "must be >= 1"),
            (
                "auto_partitions_after_ms",
                1000 <= self.auto_partitions_after_ms <= 24 * 3600 * 1000,
                "must be 1000..86400000",
            ),
            ("auto_partitions_min", 0 <= self.auto_partitions_min <= 4096, "must be 0..4096 (0 = the count at create)"),
            (
                "auto_partitions_min",
                self.auto_partitions_max == 0 or self.auto_partitions_min <= self.auto_partitions_max,
                f"must be <= auto_partitions_max ({self.auto_partitions_max})",
            ),
            (
                "auto_partitions_idle_ms",
                self.auto_partitions_idle_ms == 0 or 1000 <= self.auto_partitions_idle_ms <= 7 * 24 * 3600 * 1000,
                "must be 0 (never shrink) or 1000..604800000",
            ),
        ]
        for key, ok, text in checks:
            if not ok:
                return key, f"{text}, got {getattr(self, key)!r}"
        if self.mode == "direct":
            return self._direct_problem()
        return None

    def _direct_problem(self) -> tuple[str, str] | None:
        """A direct queue keeps nothing, so settings that need a log or a node in the path are refused."""
        stored = (
            ("partitions", 1),
            ("max_messages", 0),
            ("max_bytes", 0),
            ("max_receive_count", 0),
            ("dead_letter_queue", ""),
            ("dedup_window_ms", 0),
            ("default_ttl_ms", 0),
            ("priority_levels", 1),
            ("ordering", "fifo"),
            ("encrypt", False),
            ("auto_partitions_max", 0),
        )
        for key, off in stored:
            if getattr(self, key) != off:
                return key, (
                    f"does not apply to a direct queue (brokerless, at most once, nothing stored): "
                    f"leave it at {off!r}, got {getattr(self, key)!r}"
                )
        return None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def log_partitions(self) -> int:
        """Partition logs on disk: one set of ``partitions`` per priority level.

        Level ``l`` of partition ``p`` is log ``l * partitions + p``; a queue without
        priorities has exactly ``partitions`` logs."""
        return self.partitions * self.priority_levels


QUEUE_MODES = ("log", "direct")


def grow_problem(settings: QueueSettings, partitions: Any) -> str | None:
    """Why ``settings`` cannot grow to ``partitions`` partitions (``fabric queue alter
    --partitions``), or None. Partitions are only ever added: the existing ones keep their
    numbers and data, so keys that do not move keep their order."""
    if type(partitions) is not int or not 1 <= partitions <= 4096:
        return f"partitions must be an integer 1..4096, not {partitions!r}"
    if partitions < settings.partitions:
        return (
            f"partitions can only grow ({settings.partitions} -> {partitions} would drop data); "
            "to shrink, create a new queue and move the consumers"
        )
    if settings.mode == "direct":
        return "a direct queue has no partitions to add: producers send straight to its consumers"
    if settings.priority_levels > 1 and partitions != settings.partitions:
        return (
            f"the queue has {settings.priority_levels} priority levels, whose logs are numbered by "
            "partition count: their partitions cannot be added to (create a new queue)"
        )
    return None


def was_retired(settings: QueueSettings, p: int) -> bool:
    """Partition ``p`` is past the queue's count but within what auto-expand may reach: one that
    shrinking removed (a request naming it is answered as such, not as a bad partition)."""
    return bool(settings.auto_partitions_max) and settings.partitions <= p < settings.auto_partitions_max


# What `fabric queue alter --set` (ALTER_QUEUE "settings") may change on a live queue: each is read
# where it is used (a produce, a delivery, a retention pass, the next segment), so the change takes
# effect at once. The others are fixed at create, for the reason given.
FIXED_SETTINGS = {
    "partitions": 'partitions are added with `fabric queue alter --partitions N` (ALTER_QUEUE "partitions")',
    "priority_levels": "a priority queue's logs are numbered level * partitions + p: fixed at create",
    "encrypt": "records on disk stay as they were written: encryption at rest is chosen at create",
    "mode": "a log queue and a direct (brokerless) queue are different things: create a new queue",
    "ordering": "strict ordering changes how the leader sequences appends: chosen at create",
    "replication_factor": "replicas are placed at create (`fabric cluster rebalance` moves them)",
    "unclean_leader_election": "the controller reads it when the queue is created",
}


def alter_problem(settings: QueueSettings, changes: Any) -> str | None:
    """Why ``changes`` (key -> value) cannot be applied to a live queue with ``settings``, or None:
    a key fixed at create (:data:`FIXED_SETTINGS` says why), an unknown key, or a value that does
    not validate (named as ``QueueSettings.from_dict`` names it)."""
    if not isinstance(changes, dict) or not changes:
        return "settings must be a non-empty object of key: value"
    for key in changes:
        if key in FIXED_SETTINGS and changes[key] != getattr(settings, key):
            return f"{key!r} cannot change on a live queue: {FIXED_SETTINGS[key]}"
    try:
        QueueSettings.from_dict(changes, base=settings)
    except BadParameter as exc:
        return exc.message
    return None


def _queue_name_or_empty(name: str) -> bool:
    from fabric.protocol.ops import QUEUE_NAME

    return name == "" or bool(QUEUE_NAME.match(name))


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on what one client may send (TigerBeetle style: a limit on everything)."""

    max_request_bytes: int = 64 * MIB
    max_batches_per_request: int = 1024
    max_subscriptions_per_client: int = 256
    session_timeout_ms: int = 30_000  # clients that hold no subscription (a subscription brings its own)
    # the session timeouts a consumer may ask for (Kafka's group.min/max.session.timeout.ms)
    min_session_timeout_ms: int = 500
    max_session_timeout_ms: int = 300_000
    max_clients: int = 10_000
    tail_cache_bytes: int = 32 * MIB  # recent batches kept in memory per partition for consumers at the tail


@dataclass(frozen=True, slots=True)
class EtcdMemberConfig:
    """One etcd member that ``fabric up --config`` starts and supervises (``[[cluster.etcd_members]]``)."""

    name: str
    client_url: str  # http://host:port clients (the nodes) use
    peer_url: str  # http://host:port the members use among themselves
    data_dir: str


@dataclass(frozen=True, slots=True)
class ClusterNodeConfig:
    """One storage node of the cluster (``[[cluster.nodes]]``)."""

    node_id: str
    listen: str
    data_dir: str
    zone: str | None = None
    metrics_listen: str = ""  # host:port of this node's Prometheus endpoint ("" = off)


@dataclass(frozen=True, slots=True)
class ClusterRouterConfig:
    """One router of the cluster (``[[cluster.routers]]``): a stateless front end clients connect to."""

    router_id: str
    listen: str
    metrics_listen: str = ""  # host:port of this router's Prometheus endpoint ("" = off)


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """``[cluster]``: where the metadata store is and how partitions are replicated. Its presence
    makes a config a cluster config; the embedded single node has none and needs no etcd."""

    etcd: tuple[str, ...]  # client URLs of the etcd members
    name: str = "default"  # the cluster's keys live under /clusters/<name> in etcd (one etcd, many clusters)
    nodes: tuple[ClusterNodeConfig, ...] = ()
    routers: tuple[ClusterRouterConfig, ...] = ()
    etcd_members: tuple[EtcdMemberConfig, ...] = ()
    replication_factor: int = 3
    min_insync_replicas: int = 2
    node_lease_ttl_s: int = 2  # a node silent this long is dead: its partitions fail over
    replica_lag_time_ms: int = 5000  # a follower behind this long leaves the ISR
    move_throttle_bytes_per_s: int = (
        64 * MIB
    )  # what a leader sends replicas outside the ISR (moves, catch-up); 0 = no limit
    data_dir: str = "./fabric-cluster"  # the supervisor's PID files and logs
    # in a federation (docs/federation.md): the controller writes the cluster's report to
    # /federation/clusters/<name> this often, each store its load, and every store stands for
    # federation manager (0 = off: not in a federation)
    federation_report_ms: int = 0

    def node(self, node_id: str) -> ClusterNodeConfig:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        known = ", ".join(n.node_id for n in self.nodes) or "none"
        raise ConfigError(f"no node {node_id!r} in [[cluster.nodes]] (known: {known})")

    def router(self, router_id: str) -> ClusterRouterConfig:
        for r in self.routers:
            if r.router_id == router_id:
                return r
        known = ", ".join(r.router_id for r in self.routers) or "none"
        raise ConfigError(f"no router {router_id!r} in [[cluster.routers]] (known: {known})")


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """``[security]``: CurveZMQ authentication and ACLs (issue 12). Off by default; required
    (the node refuses to start) when it listens on a non-loopback address, unless ``insecure``."""

    keys_dir: str = ""  # `fabric auth init DIR`: the server key pair and the allowed clients' keys ("" = off)
    insecure: bool = False  # allow a non-loopback listen without authentication, in so many words
    admins: tuple[str, ...] = ()  # principals allowed everything (ACL management included)
    # `fabric auth at-rest-key init FILE`: keys of queues with encrypt = true ("" = none: such queues refused)
    at_rest_key_file: str = ""


@dataclass(frozen=True, slots=True)
class NodeConfig:
    node_id: str = "node-1"
    listen: str = DEFAULT_LISTEN
    stream_listen: str = ""  # fabric://host:port: the stream transport beside the ROUTER ("" = off)
    data_dir: str = DEFAULT_DATA_DIR
    log_level: str = "info"
    log_format: str = "text"  # "text" lines for people, "json" lines for log shippers
    # PRODUCE to a queue that does not exist creates it from [queue_defaults] (or its [queues.NAME])
    auto_create_queues: bool = True
    usage_interval_ms: int = 60_000  # usage records into __usage this often (0 = off; single node only for now)
    # out of work, the loop polls this long before it sleeps, while a steady stream of requests
    # makes that pay (fabric.node.idle_poll; 0 = off)
    idle_poll_us: int = 200
    limits: Limits = field(default_factory=Limits)
    queue_defaults: QueueSettings = field(default_factory=QueueSettings)
    queues: dict[str, QueueSettings] = field(default_factory=dict)
    cluster: ClusterConfig | None = None
    metrics_listen: str = ""  # [metrics] listen: host:port of the Prometheus endpoint ("" = off)
    security: SecurityConfig = field(default_factory=lambda: SecurityConfig())
    quotas: tuple[
        dict[str, Any], ...
    ] = ()  # [quotas] "queue:NAME" / "principal:NAME" = {messages_per_s, bytes_per_s, burst_ms}

    def replace(self, **changes: Any) -> NodeConfig:
        return dataclasses.replace(self, **changes)


IDLE_POLL_US_MAX = 10_000  # [node] idle_poll_us: at most 10 ms of polling per idle spell

_NODE_KEYS = {
    "id": "node_id",
    "listen": "listen",
    "stream_listen": "stream_listen",
    "data_dir": "data_dir",
    "log_level": "log_level",
    "log_format": "log_format",
}
_TOP_TABLES = {"node", "limits", "queue_defaults", "queues", "cluster", "metrics", "security", "quotas"}


def _table(raw: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: [{key}] must be a table")
    return value


def parse_config(raw: dict[str, Any], *, source: str = "config") -> NodeConfig:
    """Build a NodeConfig from a parsed TOML document, rejecting unknown keys."""
    for key in raw:
        if key not in _TOP_TABLES:
            raise ConfigError(f"{source}: unknown table or key {key!r} (known: {', '.join(sorted(_TOP_TABLES))})")
    node: dict[str, Any] = {}
    for key, value in _table(raw, "node", source).items():
        if key == "auto_create_queues":
            if type(value) is not bool:
                raise ConfigError(f"{source}: 'node.auto_create_queues' must be true or false, got {value!r}")
            node[key] = value
            continue
        if key == "usage_interval_ms":
            if type(value) is not int or not 0 <= value <= 86_400_000:
                raise ConfigError(f"{source}: 'node.usage_interval_ms' must be 0 (off) or 1..86400000, got {value!r}")
            node[key] = value
            continue
        if key == "idle_poll_us":
            if type(value) is not int or not 0 <= value <= IDLE_POLL_US_MAX:
                raise ConfigError(
                    f"{source}: 'node.idle_poll_us' must be 0 (off) or 1..{IDLE_POLL_US_MAX}, got {value!r}"
                )
            node[key] = value
            continue
        if key not in _NODE_KEYS:
            names = ", ".join([*_NODE_KEYS, "auto_create_queues", "usage_interval_ms", "idle_poll_us"])
            raise ConfigError(f"{source}: unknown key 'node.{key}' (known: {names})")
        if not isinstance(value, str) or not (value or key == "stream_listen"):
            raise ConfigError(f"{source}: 'node.{key}' must be a non-empty string")
        node[_NODE_KEYS[key]] = value
    if node.get("log_level", "info") not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"{source}: 'node.log_level' must be debug, info, warning or error")
    if node.get("log_format", "text") not in ("text", "json"):
        raise ConfigError(f"{source}: 'node.log_format' must be text or json, got {node['log_format']!r}")
    if "listen" in node and not node["listen"].startswith(("tcp://", "ipc://")):
        raise ConfigError(f"{source}: 'node.listen' must be a tcp:// or ipc:// endpoint, got {node['listen']!r}")
    if node.get("stream_listen") and not node["stream_listen"].startswith("fabric://"):
        raise ConfigError(
            f"{source}: 'node.stream_listen' must be a fabric://host:port endpoint or empty, got {node['stream_listen']!r}"
        )
    limits = Limits()
    for key, value in _table(raw, "limits", source).items():
        known = {f.name for f in fields(Limits)}
        if key not in known:
            raise ConfigError(f"{source}: unknown key 'limits.{key}' (known: {', '.join(sorted(known))})")
        if type(value) is not int or value < 1:
            raise ConfigError(f"{source}: 'limits.{key}' must be a positive integer, got {value!r}")
        limits = dataclasses.replace(limits, **{key: value})
    if limits.min_session_timeout_ms > limits.max_session_timeout_ms:
        raise ConfigError(
            f"{source}: 'limits.min_session_timeout_ms' ({limits.min_session_timeout_ms}) is above "
            f"'limits.max_session_timeout_ms' ({limits.max_session_timeout_ms})"
        )
    defaults = QueueSettings.from_dict(
        _table(raw, "queue_defaults", source), where=f"{source} [queue_defaults]", error=ConfigError
    )
    queues = {}
    from fabric.protocol.ops import QUEUE_NAME

    for name, table in _table(raw, "queues", source).items():
        if not QUEUE_NAME.match(name):
            raise ConfigError(f"{source}: [queues.{name}] is not a valid queue name")
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [queues.{name}] must be a table")
        queues[name] = QueueSettings.from_dict(
            table, base=defaults, where=f"{source} [queues.{name}]", error=ConfigError
        )
    metrics = _table(raw, "metrics", source)
    for key in metrics:
        if key != "listen":
            raise ConfigError(f"{source}: unknown key 'metrics.{key}' (known: listen)")
    if metrics.get("listen", "") != "":
        node["metrics_listen"] = check_metrics_listen(metrics["listen"], f"{source}: 'metrics.listen'")
    sec = _table(raw, "security", source)
    for key in sec:
        if key not in ("keys_dir", "insecure", "admins", "at_rest_key_file"):
            raise ConfigError(
                f"{source}: unknown key 'security.{key}' (known: admins, at_rest_key_file, insecure, keys_dir)"
            )
    if not isinstance(sec.get("keys_dir", ""), str) or not isinstance(sec.get("insecure", False), bool):
        raise ConfigError(f"{source}: 'security.keys_dir' must be a path string and 'security.insecure' true or false")
    admins = sec.get("admins", [])
    if not isinstance(admins, list) or not all(isinstance(a, str) and a for a in admins):
        raise ConfigError(f"{source}: 'security.admins' must be a list of client names")
    at_rest_key_file = sec.get("at_rest_key_file", "")
    if not isinstance(at_rest_key_file, str):
        raise ConfigError(f"{source}: 'security.at_rest_key_file' must be a path string")
    encrypted = [f"[queues.{n}]" for n, q in queues.items() if q.encrypt]
    if (defaults.encrypt or encrypted) and not at_rest_key_file:
        where = "[queue_defaults]" if defaults.encrypt else encrypted[0]
        raise ConfigError(
            f"{source}: {where} encrypt = true needs [security] at_rest_key_file "
            "(`fabric auth at-rest-key init FILE` makes one)"
        )
    node["security"] = SecurityConfig(
        sec.get("keys_dir", ""), sec.get("insecure", False), tuple(admins), at_rest_key_file
    )
    quotas = []
    for target, q in _table(raw, "quotas", source).items():
        where = f"{source}: [quotas] {target!r}"
        kind, _, name = target.partition(":")
        if kind not in ("queue", "principal") or not name or not isinstance(q, dict):
            raise ConfigError(
                f'{where}: a quota is "queue:NAME" or "principal:NAME" = {{ messages_per_s = N, bytes_per_s = N }}'
            )
        _keys(q, where, {"messages_per_s", "bytes_per_s", "burst_ms"})
        for key in q:
            if type(q[key]) is not int or q[key] < (1 if key == "burst_ms" else 0):
                raise ConfigError(f"{where}: {key!r} must be a non-negative integer, got {q[key]!r}")
        quotas.append({"target": target, **q})
    node["quotas"] = tuple(quotas)
    cluster = _cluster(raw["cluster"], source) if "cluster" in raw else None
    if cluster is not None and "auto_create_queues" not in node:
        node["auto_create_queues"] = False  # a cluster creates queues on purpose (issue 15 item 9)
    return NodeConfig(limits=limits, queue_defaults=defaults, queues=queues, cluster=cluster, **node)


_CLUSTER_INTS = {
    "replication_factor": (1, 16),
    "min_insync_replicas": (1, 16),
    "node_lease_ttl_s": (1, 600),
    "replica_lag_time_ms": (100, 600_000),
    "move_throttle_bytes_per_s": (0, 1 << 40),
    "federation_report_ms": (0, 600_000),
}


def is_loopback(endpoint: str) -> bool:
    """True for an endpoint only this machine can reach (127.0.0.0/8, ::1, localhost, ipc, inproc)."""
    scheme, _, rest = endpoint.partition("://")
    if scheme in ("ipc", "inproc"):
        return True
    host = rest.rpartition(":")[0].strip("[]") if ":" in rest else rest
    return host == "localhost" or host == "::1" or host.startswith("127.")


def check_exposure(config: NodeConfig, what: str, listens: list[str]) -> None:
    """A process listening beyond loopback must authenticate its clients, or say it will not."""
    sec = config.security
    if sec.insecure:
        return
    for e in listens:
        if e and not is_loopback(e) and not sec.keys_dir:  # keys_dir: CurveZMQ, and TLS on fabric://
            how = "run `fabric auth init DIR`, set [security] keys_dir = DIR and give clients their keys"
            raise ConfigError(
                f"{what} listens on {e}, beyond this machine, without authentication: {how}; "
                "or set [security] insecure = true to allow it in so many words"
            )


def check_metrics_listen(value: Any, where: str) -> str:
    """``host:port`` for the Prometheus endpoint (port 0 picks one); raises ConfigError."""
    host, sep, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{where} must be host:port (for example 127.0.0.1:9420), got {value!r}")
    return str(value)


def _url(value: Any, where: str, schemes: tuple[str, ...]) -> str:
    if not isinstance(value, str) or not value.startswith(schemes) or ":" not in value.split("://", 1)[-1]:
        raise ConfigError(f"{where} must be a {' or '.join(schemes)}host:port URL, got {value!r}")
    return value


def _cluster(table: Any, source: str) -> ClusterConfig:
    """``[cluster]`` with its ``[[cluster.nodes]]`` and optional ``[[cluster.etcd_members]]``."""
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [cluster] must be a table")
    known = {"name", "etcd", "nodes", "routers", "etcd_members", "data_dir", *_CLUSTER_INTS}
    for key in table:
        if key not in known:
            raise ConfigError(f"{source}: unknown key 'cluster.{key}' (known: {', '.join(sorted(known))})")
    ints: dict[str, Any] = {}
    for key, (low, high) in _CLUSTER_INTS.items():
        if key in table:
            v = table[key]
            if type(v) is not int or not low <= v <= high:
                raise ConfigError(f"{source}: 'cluster.{key}' must be an integer in {low}..{high}, got {v!r}")
            ints[key] = v
    members = []
    for i, m in enumerate(_array(table, "etcd_members", source)):
        where = f"{source}: [[cluster.etcd_members]] #{i + 1}"
        _keys(m, where, {"name", "client_url", "peer_url", "data_dir"})
        members.append(
            EtcdMemberConfig(
                name=_str(m, "name", where),
                client_url=_url(m.get("client_url"), f"{where} 'client_url'", ("http://",)),
                peer_url=_url(m.get("peer_url"), f"{where} 'peer_url'", ("http://",)),
                data_dir=_str(m, "data_dir", where),
            )
        )
    etcd = table.get("etcd", [m.client_url for m in members])
    if not isinstance(etcd, list) or not etcd:
        raise ConfigError(f"{source}: 'cluster.etcd' must be a non-empty list of etcd client URLs")
    etcd = [_url(u, f"{source}: 'cluster.etcd' entry", ("http://",)) for u in etcd]
    nodes = []
    for i, n in enumerate(_array(table, "nodes", source)):
        where = f"{source}: [[cluster.nodes]] #{i + 1}"
        _keys(n, where, {"id", "listen", "data_dir", "zone", "metrics_listen"})
        listen = _fixed_tcp(n, where)
        zone = n.get("zone")
        if zone is not None and not isinstance(zone, str):
            raise ConfigError(f"{where} 'zone' must be a string")
        metrics = n.get("metrics_listen", "")
        if metrics != "":
            metrics = check_metrics_listen(metrics, f"{where} 'metrics_listen'")
        nodes.append(ClusterNodeConfig(_str(n, "id", where), listen, _str(n, "data_dir", where), zone, metrics))
    if not nodes:
        raise ConfigError(f"{source}: a [cluster] needs at least one [[cluster.nodes]] entry")
    routers = []
    for i, r in enumerate(_array(table, "routers", source)):
        where = f"{source}: [[cluster.routers]] #{i + 1}"
        _keys(r, where, {"id", "listen", "metrics_listen"})
        rmetrics = r.get("metrics_listen", "")
        if rmetrics != "":
            rmetrics = check_metrics_listen(rmetrics, f"{where} 'metrics_listen'")
        routers.append(ClusterRouterConfig(_str(r, "id", where), _fixed_tcp(r, where), rmetrics))
    for what, values in (
        ("node or router id", [n.node_id for n in nodes] + [r.router_id for r in routers]),
        ("listen", [n.listen for n in nodes] + [r.listen for r in routers]),
    ):
        dup = {v for v in values if values.count(v) > 1}
        if dup:
            raise ConfigError(
                f"{source}: [[cluster.nodes]] and [[cluster.routers]] repeat the {what} {sorted(dup)[0]!r}"
            )
    cfg = ClusterConfig(
        etcd=tuple(etcd),
        nodes=tuple(nodes),
        routers=tuple(routers),
        etcd_members=tuple(members),
        **ints,
    )
    if "data_dir" in table:
        cfg = dataclasses.replace(cfg, data_dir=_str(table, "data_dir", f"{source}: [cluster]"))
    if "name" in table:
        from fabric.protocol.ops import QUEUE_NAME

        name = _str(table, "name", f"{source}: [cluster]")
        if not QUEUE_NAME.match(name):
            raise ConfigError(f"{source}: 'cluster.name' {name!r} may hold only letters, digits, '.', '_' and '-'")
        cfg = dataclasses.replace(cfg, name=name)
    if cfg.min_insync_replicas > cfg.replication_factor:
        raise ConfigError(
            f"{source}: 'cluster.min_insync_replicas' ({cfg.min_insync_replicas}) is above "
            f"'cluster.replication_factor' ({cfg.replication_factor})"
        )
    if cfg.replication_factor > len(nodes):
        raise ConfigError(
            f"{source}: 'cluster.replication_factor' ({cfg.replication_factor}) is above the number of "
            f"[[cluster.nodes]] ({len(nodes)})"
        )
    return cfg


def _fixed_tcp(table: dict[str, Any], where: str) -> str:
    listen = _str(table, "listen", where)
    if not listen.startswith("tcp://") or listen.endswith((":0", ":*")):
        raise ConfigError(f"{where} 'listen' must be a tcp://host:port endpoint with a fixed port, got {listen!r}")
    return listen


def _array(table: dict[str, Any], key: str, source: str) -> list[dict[str, Any]]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(f"{source}: 'cluster.{key}' must be an array of tables ([[cluster.{key}]])")
    return value


def _keys(table: dict[str, Any], where: str, known: set[str]) -> None:
    for key in table:
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(known))})")


def _str(table: dict[str, Any], key: str, where: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: {key!r} must be a non-empty string")
    return value


def load_federation_config(path: str | Path) -> list[tuple[Path, NodeConfig]] | None:
    """A federation config (``[federation] clusters = ["east.toml", ...]``, paths relative to
    the file, nothing else in it): each cluster config's path and contents, in order. None for
    any other config. Raises ConfigError naming the key: no cluster, a config without
    ``[cluster]`` or without ``federation_report_ms``, two clusters of one name, clusters that
    share no etcd URL."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except (FileNotFoundError, tomllib.TOMLDecodeError):
        return None  # load_config says what is wrong with it
    if "federation" not in raw:
        return None
    table = raw["federation"]
    others = sorted(k for k in raw if k != "federation")
    if others:
        raise ConfigError(f"{p}: a [federation] config holds nothing else (found {others[0]!r})")
    if not isinstance(table, dict):
        raise ConfigError(f"{p}: [federation] must be a table")
    _keys(table, f"{p}: [federation]", {"clusters"})
    files = table.get("clusters")
    if not isinstance(files, list) or not files or not all(isinstance(f, str) and f for f in files):
        raise ConfigError(f"{p}: 'federation.clusters' must be a non-empty list of cluster config paths")
    out: list[tuple[Path, NodeConfig]] = []
    for f in files:
        cp = p.parent / f
        config = load_config(cp)
        cl = config.cluster
        if cl is None or not cl.federation_report_ms:
            raise ConfigError(f"{p}: 'federation.clusters' entry {f!r} needs [cluster] with federation_report_ms > 0")
        if any(c.cluster is not None and c.cluster.name == cl.name for _, c in out):
            raise ConfigError(f"{p}: 'federation.clusters' names two clusters called {cl.name!r}")
        first = out[0][1].cluster if out else None
        if first is not None and not set(first.etcd) & set(cl.etcd):
            raise ConfigError(f"{p}: 'federation.clusters' entry {f!r} shares no etcd URL with the first cluster")
        out.append((cp, config))
    return out


def load_config(path: str | Path | None) -> NodeConfig:
    """Read a TOML config file (or the embedded default when ``path`` is None)."""
    if path is None:
        return NodeConfig()
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    return parse_config(raw, source=str(p))
