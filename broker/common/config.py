"""Node configuration: a `rabbitmq.conf`-style file plus environment overrides.

Where it sits: the process entry point reads the file and the environment (the
I/O) and hands both texts to `load_config`, which is pure: it parses, validates
every key against the table below and returns an immutable `Config`. Invalid
configuration stops start-up with a `ConfigError` naming the key.

File format (RabbitMQ's new-style `rabbitmq.conf`, the sysctl-like format):

    # comment
    quorum_queue.initial_cluster_size = 3
    raft.wal_max_size_bytes = 536870912
    cluster.seeds.1 = node-0.qq-headless:25672

List settings are written with numbered suffixes (`cluster.seeds.1`,
`cluster.seeds.2`, ...) as RabbitMQ does for `cluster_formation.classic_config.nodes`,
or as one comma-separated value.

Environment overrides: `QQ__<KEY>` where the key's dots become double
underscores, case-insensitive: `QQ__RAFT__SEGMENT_MAX_ENTRIES=1024` sets
`raft.segment_max_entries`. The environment wins over the file.

Keys are named after RabbitMQ's where RabbitMQ has them.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "QQ__"


class ConfigError(ValueError):
    """Invalid configuration; the message names the offending key (or file line)."""


def _int_or_infinity(lo: int, hi: int) -> Callable[[str, str], int | None]:
    """An integer, or RabbitMQ's 'infinity' (None: no limit)."""
    whole = _int(lo, hi)

    def parse(key: str, raw: str) -> int | None:
        if raw.strip() == "infinity":
            return None
        return whole(key, raw)

    return parse


def _int(lo: int | None = None, hi: int | None = None) -> Callable[[str, str], int]:
    def parse(key: str, raw: str) -> int:
        try:
            value = int(raw.strip().replace("_", ""))
        except ValueError:
            raise ConfigError(f"{key}: expected an integer, got {raw!r}") from None
        if lo is not None and value < lo:
            raise ConfigError(f"{key}: must be >= {lo}, got {value}")
        if hi is not None and value > hi:
            raise ConfigError(f"{key}: must be <= {hi}, got {value}")
        return value

    return parse


_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "ki": 1024, "kib": 1024, "kb": 1000,
    "m": 1024**2, "mi": 1024**2, "mib": 1024**2, "mb": 1000**2,
    "g": 1024**3, "gi": 1024**3, "gib": 1024**3, "gb": 1000**3,
    "t": 1024**4, "ti": 1024**4, "tib": 1024**4, "tb": 1000**4,
}


def _size(key: str, raw: str) -> int:
    """An amount of bytes as RabbitMQ writes it: `50000000`, `50MB` (10^6),
    `1GiB` (2^30), `512KiB`..."""
    text = raw.strip().replace("_", "")
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ").strip()
    unit = text[len(digits):].strip().lower() if digits else ""
    try:
        number = float(digits)
    except ValueError:
        raise ConfigError(f"{key}: expected bytes such as 50000000, 50MB or 1GiB, got {raw!r}") from None
    value = number * _UNITS.get(unit, 1)
    # '1e400' (or 1e300 TiB) is infinity, which no int holds; 'nan' is no amount
    if unit not in _UNITS or not 0 <= value < float("inf"):
        raise ConfigError(f"{key}: expected bytes such as 50000000, 50MB or 1GiB, got {raw!r}")
    return int(value)


def _ratio(lo: float, hi: float) -> Callable[[str, str], float]:
    def parse(key: str, raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ConfigError(f"{key}: expected a number, got {raw!r}") from None
        if not lo <= value <= hi:
            raise ConfigError(f"{key}: must be between {lo} and {hi}, got {value}")
        return value

    return parse


def _bool(key: str, raw: str) -> bool:
    v = raw.strip().lower()
    if v in ("true", "yes", "on", "1"):
        return True
    if v in ("false", "no", "off", "0"):
        return False
    raise ConfigError(f"{key}: expected true or false, got {raw!r}")


def _str(key: str, raw: str) -> str:
    return raw.strip()


def _choice(*allowed: str) -> Callable[[str, str], str]:
    def parse(key: str, raw: str) -> str:
        v = raw.strip()
        if v not in allowed:
            raise ConfigError(f"{key}: must be one of {', '.join(allowed)}; got {v!r}")
        return v

    return parse


def _list(key: str, raw: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def _users(key: str, raw: str) -> tuple[str, ...]:
    """A list of user names; RabbitMQ's `none` (or an empty value) means no user."""
    names = _list(key, raw)
    return () if names == ("none",) else names


# `loopback_users.guest = false` (RabbitMQ's spelling) edits the default list
# by name: true adds the user, false removes it.
_NAMED_FLAG_LISTS = frozenset({"loopback_users"})


@dataclass(frozen=True, slots=True)
class Setting:
    key: str
    parse: Callable[[str, str], Any]
    default: Any
    doc: str
    is_list: bool = False


def _tls_settings(prefix: str, listener: str) -> tuple[Setting, ...]:
    """The TLS keys of one listener (RabbitMQ's names, broker/common/tls.py)."""
    return (
        Setting(f"{prefix}.certfile", _str, "", f"{listener}'s certificate (PEM)"),
        Setting(f"{prefix}.keyfile", _str, "", "its private key (PEM)"),
        Setting(f"{prefix}.cacertfile", _str, "", "CA bundle client certificates are verified against"),
        Setting(f"{prefix}.verify", _choice("verify_none", "verify_peer"), "verify_none",
                "verify_peer: ask clients for a certificate and verify it"),
        Setting(f"{prefix}.fail_if_no_peer_cert", _bool, False,
                "with verify_peer: refuse clients that present no certificate"),
    )


SETTINGS: tuple[Setting, ...] = (
    # node identity and listeners
    Setting("node.name", _str, "rabbit@localhost", "this node's name, stable across restarts"),
    Setting("node.data_dir", _str, "./data", "directory holding the WAL, segments, snapshots"),
    Setting("listeners.tcp.default", _int(1, 65535), 5672, "AMQP port"),
    Setting("listeners.tcp.bind", _str, "0.0.0.0", "AMQP bind address"),
    Setting("listeners.tcp", _choice("default", "none"), "default",
            "`none` turns the plain AMQP listener off (TLS only)"),
    Setting("listeners.ssl.default", _int(0, 65535), 0, "AMQP over TLS port (0: off; RabbitMQ uses 5671)"),
    Setting("listeners.ssl.bind", _str, "0.0.0.0", "AMQP over TLS bind address"),
    *_tls_settings("ssl_options", "the AMQP TLS listener"),
    Setting("management.tcp.port", _int(0, 65535), 15672, "management HTTP API port (0: off)"),
    Setting("management.tcp.bind", _str, "0.0.0.0", "management HTTP API bind address"),
    Setting("management.ssl.port", _int(0, 65535), 0, "management API over HTTPS port (0: off; RabbitMQ uses 15671)"),
    Setting("management.ssl.bind", _str, "0.0.0.0", "management HTTPS bind address"),
    *_tls_settings("management.ssl", "the management HTTPS listener"),
    Setting("prometheus.tcp.port", _int(0, 65535), 15692, "Prometheus metrics port (0: off)"),
    Setting("prometheus.tcp.bind", _str, "0.0.0.0", "Prometheus metrics bind address"),
    Setting("prometheus.ssl.port", _int(0, 65535), 0, "metrics over HTTPS port (0: off; RabbitMQ uses 15691)"),
    Setting("prometheus.ssl.bind", _str, "0.0.0.0", "metrics HTTPS bind address"),
    *_tls_settings("prometheus.ssl", "the metrics HTTPS listener"),
    Setting("cluster.port", _int(1, 65535), 25672, "peer transport port"),
    Setting("cluster.bind", _str, "0.0.0.0", "peer transport bind address"),
    Setting("cluster.seeds", _list, (), "cluster nodes as NODE_NAME:PORT (rabbit@host:25672)", True),
    Setting("cluster.initial_members", _list, (),
            "node names forming the cluster at creation (default: all of cluster.seeds); "
            "a node outside it joins a running cluster", True),
    Setting("cluster.discovery", _choice("static", "statefulset"), "static",
            "static: cluster.seeds as given; statefulset: node.name, cluster.seeds and "
            "cluster.initial_members from the pod's StatefulSet ordinal (broker/common/discovery.py)"),
    Setting("cluster.statefulset.service", _str, "", "the StatefulSet's headless service"),
    Setting("cluster.statefulset.namespace", _str, "", "its namespace (default: env POD_NAMESPACE)"),
    Setting("cluster.statefulset.domain", _str, "cluster.local", "the cluster's DNS domain"),
    Setting("cluster.statefulset.initial_replicas", _int(1), 3,
            "ordinals 0..N-1 form the cluster on first start; higher ordinals join it"),
    Setting("cluster.statefulset.pod_name", _str, "",
            "this pod's name NAME-ORDINAL (default: env POD_NAME, then HOSTNAME)"),
    Setting("cluster.statefulset.node_name_prefix", _str, "rabbit", "node names are PREFIX@HOST"),
    Setting("cluster.statefulset.host_template", _str, "",
            "host of a pod (default {pod}.{service}.{namespace}.svc.{domain}; also "
            "{statefulset}, {ordinal})"),
    Setting("cluster.formation_timeout_ms", _int(1000), 120000, "how long start-up waits for a quorum"),
    Setting("cluster.housekeeping_interval_ms", _int(10, 60000), 2000,
            "how often a node notes peers that are down and its queue leaders return the "
            "messages of consumers on dead channels"),
    Setting("cluster.secret_file", _str, "", "file holding the shared cluster secret"),
    Setting("cluster.tls.certfile", _str, "", "peer TLS certificate (optional)"),
    Setting("cluster.tls.keyfile", _str, "", "peer TLS key (optional)"),
    Setting("cluster.tls.cafile", _str, "", "peer TLS CA bundle (optional)"),
    # AMQP connection tuning (RabbitMQ names)
    Setting("heartbeat", _int(0, 65535), 60, "heartbeat timeout proposed to clients, seconds"),
    Setting("frame_max", _int(4096, 2**31 - 1), 131072, "largest frame proposed to clients"),
    Setting("channel_max", _int(0, 65535), 2047, "most channels per connection"),
    Setting("connection_max", _int_or_infinity(0, 2**31 - 1), None,
            "most client connections open on this node (RabbitMQ's name; 'infinity', the "
            "default, for no limit): connection.open beyond it is refused with 530"),
    Setting("max_message_size", _int(1, 512 * 1024 * 1024), 128 * 1024 * 1024,
            "largest message body accepted, bytes (RabbitMQ's default 128 MiB, its maximum "
            "512 MiB): a larger publish closes the channel with 406 PRECONDITION_FAILED"),
    Setting("consumer_timeout", _int(0, 2**31 - 1), 1800000,
            "delivery acknowledgement timeout, ms: a delivery not acknowledged in time closes "
            "its channel (406); the x-consumer-timeout queue or consume argument and the "
            "consumer-timeout policy key override it per queue/consumer"),
    # resource alarms (RabbitMQ names): publishers are blocked cluster-wide
    # while any node is above its memory watermark or below its free disk limit
    Setting("disk_free_limit.absolute", _size, 50_000_000,
            "free disk space (data directory's file system) below which the disk alarm "
            "is raised; bytes or 50MB/1GiB (0: no disk alarm)"),
    Setting("disk_free_limit.relative", _ratio(0.0, 100.0), 0.0,
            "if set (> 0): the limit is this multiple of the memory limit's total "
            "(RAM or the cgroup limit), instead of the absolute one"),
    Setting("vm_memory_high_watermark.relative", _ratio(0.0, 1.0), 0.6,
            "share of the memory available (RAM or the cgroup limit) above which the "
            "node's resident memory raises the memory alarm (0: no memory alarm)"),
    Setting("vm_memory_high_watermark.absolute", _size, 0,
            "if set (> 0): the memory alarm threshold in bytes, instead of the relative one"),
    Setting("alarms.check_interval_ms", _int(50, 60000), 1000,
            "how often free disk space and memory are checked"),
    # users and vhosts (RabbitMQ names)
    Setting("default_vhost", _str, "/", "vhost created on a fresh cluster"),
    Setting("default_user", _str, "guest", "user created on a fresh cluster"),
    Setting("default_pass", _str, "guest", "its password"),
    Setting("loopback_users", _users, ("guest",),
            "users that may only log in over loopback ('none' for nobody; also "
            "`loopback_users.NAME = true|false` as RabbitMQ writes it)", True),
    Setting("load_definitions", _str, "",
            "definitions JSON (RabbitMQ export format) applied when the cluster is created"),
    Setting("default_queue_type", _choice("classic", "quorum"), "classic", "default x-queue-type"),
    # quorum queues
    Setting("quorum_queue.initial_cluster_size", _int(1), 3, "members of a new quorum queue"),
    Setting("quorum_queue.commands_soft_limit", _int(1), 32, "in-flight commands per publisher before flow control"),
    Setting("quorum_queue.property_equivalence.relaxed_checks_on_redeclaration", _bool, False,
            "ignore x-queue-type mismatches on redeclaration"),
    Setting("quorum_queue.continuous_membership_reconciliation.enabled", _bool, False, "grow/shrink members automatically"),
    Setting("quorum_queue.continuous_membership_reconciliation.target_group_size", _int(1), 3, "target members"),
    Setting("quorum_queue.continuous_membership_reconciliation.auto_remove", _bool, False, "remove members on departed nodes"),
    Setting("quorum_queue.continuous_membership_reconciliation.interval", _int(1), 3600000, "ms between runs"),
    Setting("quorum_queue.continuous_membership_reconciliation.trigger_interval", _int(1), 10000, "ms delay after a trigger"),
    Setting("queue_leader_locator", _choice("client-local", "balanced"), "client-local", "where new leaders go"),
    # Raft and storage
    Setting("raft.wal_max_size_bytes", _int(4096), 512 * 1024 * 1024, "WAL roll-over size"),
    Setting("raft.segment_max_entries", _int(1, 65535), 4096, "entries per segment file (<= 65535)"),
    Setting("raft.election_timeout_ms", _int(100), 1000, "base election timeout"),
    Setting("raft.tick_ms", _int(10), 100, "Raft tick length"),
    Setting("raft.snapshot_interval", _int(1), 20000, "applied entries between two snapshots of a queue"),
    Setting("raft.snapshot_interval_bytes", _int(4096), 64 * 1024 * 1024,
            "bytes of applied entries after which a queue snapshots"),
)
_BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}


@dataclass(frozen=True, slots=True)
class Config:
    """Validated settings. Invariant: holds exactly one value for every key in SETTINGS."""

    values: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        if key not in _BY_KEY:
            raise KeyError(f"unknown configuration key {key!r}")
        return self.values[key]

    def with_overrides(self, **by_key: Any) -> Config:
        """A copy with some values replaced (keys given with dots as '__')."""
        merged = dict(self.values)
        for k, v in by_key.items():
            key = k.replace("__", ".")
            if key not in _BY_KEY:
                raise ConfigError(f"{key}: unknown configuration key")
            merged[key] = v
        return Config(merged)


def parse_conf(text: str, source: str = "config") -> dict[str, str]:
    """Parse the sysctl-like format into raw key -> value strings (lists joined by ',')."""
    raw: dict[str, str] = {}
    lists: dict[str, list[tuple[int, str]]] = {}
    flags: dict[str, list[tuple[str, bool]]] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if "=" not in stripped:
            raise ConfigError(f"{source}:{lineno}: expected 'key = value', got {stripped!r}")
        key, _, value = stripped.partition("=")
        key, value = key.strip(), value.strip()
        head, _, tail = key.rpartition(".")
        # isascii: str.isdigit() is also true for '²' and other digits int() refuses
        if tail.isascii() and tail.isdigit() and head in _BY_KEY and _BY_KEY[head].is_list:
            lists.setdefault(head, []).append((int(tail), value))
            continue
        if head in _NAMED_FLAG_LISTS and tail:
            flags.setdefault(head, []).append((tail, _bool(key, value)))
            continue
        if key not in _BY_KEY:
            raise ConfigError(f"{source}:{lineno}: {key}: unknown configuration key")
        if key in raw:
            raise ConfigError(f"{source}:{lineno}: {key}: set twice")
        raw[key] = value
    for key, items in lists.items():
        if key in raw:
            raise ConfigError(f"{source}: {key}: given both as a list and as a value")
        raw[key] = ",".join(v for _, v in sorted(items))
    for key, named in flags.items():
        if key in raw:
            raise ConfigError(f"{source}: {key}: given both by name and as a list")
        members = list(_BY_KEY[key].default)
        for name, on in named:
            if on and name not in members:
                members.append(name)
            elif not on and name in members:
                members.remove(name)
        raw[key] = ",".join(members)
    return raw


def env_overrides(environ: Mapping[str, str]) -> dict[str, str]:
    """Raw values from `QQ__SECTION__KEY` environment variables."""
    out: dict[str, str] = {}
    for name, value in environ.items():
        if not name.upper().startswith(ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX):].lower().replace("__", ".")
        if key not in _BY_KEY:
            raise ConfigError(f"{name}: unknown configuration key {key!r}")
        out[key] = value
    return out


def load_config(conf_text: str = "", environ: Mapping[str, str] | None = None,
                source: str = "config") -> Config:
    """Validate file text plus environment into a Config; raise ConfigError naming the key."""
    raw = parse_conf(conf_text, source)
    raw.update(env_overrides(environ or {}))
    values = {s.key: s.default for s in SETTINGS}
    for key, text in raw.items():
        values[key] = _BY_KEY[key].parse(key, text)
    if values["cluster.discovery"] != "static":
        from .discovery import resolve

        values = resolve(values, environ or {}, frozenset(raw))
    return Config(values)
