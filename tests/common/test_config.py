"""Configuration: RabbitMQ-named keys, file + environment, errors naming the key."""
from __future__ import annotations

import pytest

from broker.common.config import SETTINGS, ConfigError, load_config


def test_defaults_follow_rabbitmq() -> None:
    cfg = load_config("")
    assert cfg["quorum_queue.initial_cluster_size"] == 3
    assert cfg["raft.wal_max_size_bytes"] == 512 * 1024 * 1024
    assert cfg["raft.segment_max_entries"] == 4096
    assert cfg["quorum_queue.commands_soft_limit"] == 32
    assert cfg["loopback_users"] == ("guest",)
    assert cfg["default_queue_type"] == "classic"


def test_file_values_and_numbered_lists() -> None:
    cfg = load_config(
        """
        # a comment
        quorum_queue.initial_cluster_size = 5
        raft.segment_max_entries = 1024
        cluster.seeds.2 = b:25672
        cluster.seeds.1 = a:25672
        quorum_queue.property_equivalence.relaxed_checks_on_redeclaration = true
        """
    )
    assert cfg["quorum_queue.initial_cluster_size"] == 5
    assert cfg["raft.segment_max_entries"] == 1024
    assert cfg["cluster.seeds"] == ("a:25672", "b:25672")
    assert cfg["quorum_queue.property_equivalence.relaxed_checks_on_redeclaration"] is True


def test_environment_overrides_file() -> None:
    cfg = load_config(
        "raft.segment_max_entries = 1024\n",
        {"QQ__RAFT__SEGMENT_MAX_ENTRIES": "2048", "PATH": "/bin"},
    )
    assert cfg["raft.segment_max_entries"] == 2048


@pytest.mark.parametrize(
    ("text", "env", "fragment"),
    [
        ("raft.segment_max_entries = 70000\n", {}, "raft.segment_max_entries: must be <= 65535"),
        ("raft.segment_max_entries = lots\n", {}, "raft.segment_max_entries: expected an integer"),
        ("quorum_queue.initial_cluster_size = 0\n", {}, "quorum_queue.initial_cluster_size: must be >= 1"),
        ("no_such.key = 1\n", {}, "config:1: no_such.key: unknown configuration key"),
        ("just words\n", {}, "config:1: expected 'key = value'"),
        ("heartbeat = 1\nheartbeat = 2\n", {}, "config:2: heartbeat: set twice"),
        ("", {"QQ__RAFT__NOPE": "1"}, "QQ__RAFT__NOPE: unknown configuration key"),
        ("queue_leader_locator = random\n", {}, "queue_leader_locator: must be one of"),
        ("quorum_queue.continuous_membership_reconciliation.enabled = maybe\n", {},
         "quorum_queue.continuous_membership_reconciliation.enabled: expected true or false"),
        ("disk_free_limit.absolute = lots\n", {}, "disk_free_limit.absolute: expected bytes"),
        ("disk_free_limit.absolute = 5 parsecs\n", {}, "disk_free_limit.absolute: expected bytes"),
        ("vm_memory_high_watermark.relative = 1.5\n", {},
         "vm_memory_high_watermark.relative: must be between 0.0 and 1.0"),
        ("", {"QQ__VM_MEMORY_HIGH_WATERMARK__RELATIVE": "x"},
         "vm_memory_high_watermark.relative: expected a number"),
    ],
)
def test_invalid_configuration_names_the_key(text: str, env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(text, env)
    assert fragment in str(err.value)


def test_every_setting_default_is_valid() -> None:
    # Round-trip each default through its own parser (lists joined with commas).
    for s in SETTINGS:
        raw = ",".join(s.default) if s.is_list else str(s.default).lower() if isinstance(s.default, bool) \
            else "infinity" if s.default is None else str(s.default)
        assert s.parse(s.key, raw) == s.default, s.key


@pytest.mark.parametrize(("raw", "expected"), [
    ("50000000", 50_000_000), ("50MB", 50_000_000), ("32GB", 32_000_000_000),
    ("1GiB", 1 << 30), ("512KiB", 512 << 10), ("2kB", 2000), ("1.5MiB", 3 << 19), ("0", 0),
])
def test_sizes_are_read_as_rabbitmq_writes_them(raw: str, expected: int) -> None:
    """RabbitMQ's information units: MB, GB are powers of 10, MiB, GiB of 2."""
    assert load_config(f"disk_free_limit.absolute = {raw}\n")["disk_free_limit.absolute"] == expected


@pytest.mark.parametrize(("raw", "expected"), [("infinity", None), ("0", 0), ("1_000", 1000)])
def test_connection_max_is_a_count_or_infinity(raw: str, expected: int | None) -> None:
    assert load_config("")["connection_max"] is None  # RabbitMQ's default: no limit
    assert load_config(f"connection_max = {raw}\n")["connection_max"] == expected


@pytest.mark.parametrize("raw", ["-1", "lots", "1e3"])
def test_a_bad_connection_max_names_the_key(raw: str) -> None:
    with pytest.raises(ConfigError, match="connection_max"):
        load_config(f"connection_max = {raw}\n")
