"""Fuzzing the configuration parser (issue 15): whatever text or environment
an operator gives, `load_config` either returns a Config or raises
ConfigError with a message, never another exception.

Time-bounded: derandomized hypothesis (the same examples on every run, so a
failure replays), a few hundred examples per test, no deadline per example.
What each input exercises: arbitrary text (every Unicode line break,
stray '=', '#', digits), mutations of a valid file (bytes flipped, text
inserted, lines dropped, duplicated or swapped), and every key with an
arbitrary value, in the file and in the environment."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.common.config import SETTINGS, Config, ConfigError, load_config

FUZZ = settings(derandomize=True, max_examples=400, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])

#: every kind of value the parser reads (ints, sizes, ratios, booleans,
#: choices, lists, numbered lists, named flags, TLS paths)
VALID = """\
# a comment
node.name = rabbit@host-1
listeners.tcp.default = 5672
frame_max = 131072
heartbeat = 60
channel_max = 2047
max_message_size = 134217728
raft.segment_max_entries = 4096
raft.wal_max_size_bytes = 536870912
disk_free_limit.absolute = 50MB
vm_memory_high_watermark.relative = 0.4
default_queue_type = quorum
queue_leader_locator = balanced
quorum_queue.property_equivalence.relaxed_checks_on_redeclaration = true
cluster.seeds.1 = rabbit@host-1:25672
cluster.seeds.2 = rabbit@host-2:25672
loopback_users.guest = false
loopback_users.admin = true
listeners.ssl.default = 5671
ssl_options.certfile = /etc/qq/cert.pem
ssl_options.verify = verify_peer
"""

KEYS = [s.key for s in SETTINGS]
ALPHABET = st.characters(codec="utf-8")  # any code point that can be in a file
SPECIAL = [
    "", "=", "==", "#", ".", ".1", ".²", ".0", ".-1", ".01", "\u2028", "\x85", "\r", "\n", "\x00",
    " = ", "inf", "-inf", "nan", "1e400", "-1e400 MB", "1e30 TiB", "1e300 TiB", "-1", "0x10", "1_000", "_",
    "9" * 5000, "١٢٣", "true", "none", "{", "}", "{pod", "verify_peer", "statefulset",
    "cluster.discovery = statefulset\n", "cluster.statefulset.host_template = {nope}\n",
    "MiB", "KB", "tb", "ssl_options.",
]
INTERESTING = st.sampled_from(SPECIAL)


def _outcome(text: str, env: dict[str, str] | None = None) -> None:
    try:
        cfg = load_config(text, env or {})
    except ConfigError as exc:
        assert str(exc), "a ConfigError without a message"
        return
    assert isinstance(cfg, Config)
    for key in KEYS:
        cfg[key]  # every key holds a value


def test_the_valid_file_parses() -> None:
    _outcome(VALID)
    assert load_config(VALID)["disk_free_limit.absolute"] == 50 * 1000**2


@FUZZ
@given(st.text(alphabet=ALPHABET, max_size=300))
def test_arbitrary_text(text: str) -> None:
    _outcome(text)


def test_every_key_with_every_special_value_and_suffix() -> None:
    """The grid hypothesis samples from, in full (about 5,000 files, < 2 s)."""
    for key in KEYS:
        for special in SPECIAL:
            _outcome(f"{key} = {special}\n")
            _outcome(f"{key}{special} = x\n")
            _outcome(f"{key}{special} = {special}\n")


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(KEYS), st.one_of(INTERESTING, st.text(ALPHABET, max_size=20))),
                max_size=6))
def test_every_key_with_arbitrary_values(pairs: list[tuple[str, str]]) -> None:
    _outcome("".join(f"{k} = {v}\n" for k, v in pairs))


_MUTATION = st.tuples(
    st.sampled_from(["insert", "delete", "replace", "dup_line", "drop_line", "swap_lines"]),
    st.integers(0, len(VALID)), st.integers(0, 40), st.one_of(INTERESTING, st.text(ALPHABET, max_size=12)))


def _mutate(text: str, ops: list[tuple[str, int, int, str]]) -> str:
    for op, pos, n, new in ops:
        pos = min(pos, len(text))
        lines = text.splitlines(keepends=True)
        i = pos % max(1, len(lines))
        if op == "insert":
            text = text[:pos] + new + text[pos:]
        elif op == "delete":
            text = text[:pos] + text[pos + n:]
        elif op == "replace":
            text = text[:pos] + new + text[pos + len(new):]
        elif op == "dup_line" and lines:
            text = "".join(lines[:i + 1] + lines[i:])
        elif op == "drop_line" and lines:
            text = "".join(lines[:i] + lines[i + 1:])
        elif op == "swap_lines" and len(lines) > 1:
            j = n % len(lines)
            lines[i], lines[j] = lines[j], lines[i]
            text = "".join(lines)
    return text


@FUZZ
@given(st.lists(_MUTATION, min_size=1, max_size=5))
def test_mutations_of_a_valid_file(ops: list[tuple[str, int, int, str]]) -> None:
    _outcome(_mutate(VALID, ops))


@FUZZ
@given(st.dictionaries(
    st.one_of(st.sampled_from(KEYS).map(lambda k: "QQ__" + k.upper().replace(".", "__")),
              st.text(ALPHABET, max_size=12).map(lambda s: "QQ__" + s)),
    st.one_of(INTERESTING, st.text(ALPHABET, max_size=20)), max_size=4))
def test_arbitrary_environment_overrides(env: dict[str, str]) -> None:
    _outcome(VALID, env)
