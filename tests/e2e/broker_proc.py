"""Run real broker node processes for end-to-end tests.

A `BrokerProcess` is `python -m broker --config FILE` in its own data
directory on a free port: the same entry point `make run` uses. Tests talk
to it over real sockets with real client libraries, and may stop it
cleanly (SIGTERM), kill it (SIGKILL) or freeze it (SIGSTOP).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def _port_range() -> tuple[int, int]:
    """Ports below the kernel's ephemeral range.

    A port the kernel handed out with `bind(0)` is in the ephemeral range, so
    between the test picking it and the broker binding it any outgoing
    connection (a peer dialling another node, a client) may take it as its
    source port: the broker then fails with EADDRINUSE. Nothing auto-binds
    below `net.ipv4.ip_local_port_range`, so only other tests compete there.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return max(1024, low - 12000), low


_PORT_LOCKS = Path("/tmp/qq-test-ports")
#: ports `make run` uses (its peer ports fall in the range above): never handed out
_RESERVED = frozenset({25672, 25673, 25674})
_held: list[int] = []  # lock fds, held for this process's life
_next_port: list[int] = []


def free_port() -> int:
    """A port no other test process has and nothing listens on.

    Ports are taken from below the ephemeral range (see `_port_range`). Each
    is reserved across concurrent test processes by an flock on
    /tmp/qq-test-ports/PORT, held until this process exits (the kernel drops
    it then, even on kill -9), so two pytest runs never pick the same port.
    """
    import fcntl

    lo, hi = _port_range()
    _PORT_LOCKS.mkdir(parents=True, exist_ok=True)
    if not _next_port:
        _next_port.append(lo + (os.getpid() * 7919) % (hi - lo))
    for _ in range(hi - lo):
        port = _next_port[0]
        _next_port[0] = lo + (port + 1 - lo) % (hi - lo)
        if port in _RESERVED:
            continue
        fd = os.open(_PORT_LOCKS / str(port), os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                os.close(fd)
                continue
        _held.append(fd)
        return port
    raise RuntimeError(f"no free port left in {lo}..{hi - 1}")


def rabbitmq_port_pair() -> int:
    """A free port p whose p + 20000 (RabbitMQ's Erlang distribution port) is free too."""
    for _ in range(200):
        p = free_port()
        if p + 20000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 20000))
            except OSError:
                continue
        return p
    raise RuntimeError("no free port pair for RabbitMQ")


class BrokerProcess:
    def __init__(self, data_dir: Path, port: int | None = None, name: str = "rabbit@localhost",
                 config: str = "", env: dict[str, str] | None = None,
                 wrap: list[str] | None = None, host: str = "127.0.0.1",
                 management_port: int = 0, metrics_port: int = 0) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.name = name
        self.extra_config = config
        self.env = env or {}
        self.wrap = wrap or []  # e.g. ["ip", "netns", "exec", NS]: run inside a namespace
        self.host = host  # where clients reach it
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        # 0 keeps the management API / metrics listener off (the default).
        self.management_port = management_port
        self.metrics_port = metrics_port

    @property
    def config_text(self) -> str:
        return (f"node.name = {self.name}\n"
                f"node.data_dir = {self.data_dir}\n"
                f"listeners.tcp.default = {self.port}\n"
                f"listeners.tcp.bind = {'0.0.0.0' if self.wrap else '127.0.0.1'}\n"
                f"management.tcp.port = {self.management_port}\n"
                f"prometheus.tcp.port = {self.metrics_port}\n"
                + "".join(f"{k}.tcp.bind = {'0.0.0.0' if self.wrap else '127.0.0.1'}\n"
                          for k, port in (("management", self.management_port),
                                          ("prometheus", self.metrics_port)) if port)
                + self.extra_config)

    def start(self, timeout: float = 60.0) -> BrokerProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir.parent / f"{self.data_dir.name}.conf"
        conf.write_text(self.config_text)
        env = dict(os.environ)
        env.update(self.env)
        env.setdefault("QQ_LOG_LEVEL", "INFO")
        log = open(self.log_path, "ab")
        offset = log.tell()
        self.proc = subprocess.Popen([*self.wrap, sys.executable, "-m", "broker", "--config", str(conf)],
                                     cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log()}")
            if b"ready on port" in self.log_path.read_bytes()[offset:]:
                return self
            time.sleep(0.05)
        raise RuntimeError(f"broker did not start within {timeout}s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def freeze(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


def in_parallel(fn: Callable[[T], object], items: Iterable[T]) -> None:
    """fn(item) for every item, each on a thread of its own; the first error is
    raised once all have finished."""
    import threading

    errors: list[BaseException] = []

    def run(item: T) -> None:
        try:
            fn(item)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(item,)) for item in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def start_all(nodes: list[BrokerProcess], timeout: float = 120.0) -> None:
    """Start brokers in parallel (a cluster forms only once a quorum of its
    seeds is up)."""
    in_parallel(lambda node: node.start(timeout=timeout), nodes)
