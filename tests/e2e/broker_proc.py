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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
