"""Start and stop a throw-away RabbitMQ node (Debian's rabbitmq-server) on its
own ports, for side-by-side benchmarks and compatibility tests. It never takes
5672-5674 and keeps all its files in a directory the caller owns."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


def installed() -> bool:
    return shutil.which("rabbitmq-server") is not None and shutil.which("rabbitmqctl") is not None


@dataclass
class RabbitNode:
    name: str
    port: int
    base: Path

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            RABBITMQ_NODENAME=self.name,
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.port + 20000),
            RABBITMQ_MNESIA_BASE=str(self.base / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.base / "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.base / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(self.base / "pid"),
            RABBITMQ_CONFIG_FILE=str(self.base / "rabbitmq"),
        )
        return env

    def ctl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["rabbitmqctl", "-n", self.name, *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def start(self, config: str = "") -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        # Debian's rabbitmq-server and rabbitmqctl wrappers drop to the
        # `rabbitmq` user when started as root: it must own the node's directory.
        self.base.chmod(0o755)
        # ... and reach it: temporary parents (pytest's, tempfile's) are 0700.
        tmp = Path(tempfile.gettempdir()).resolve()
        for parent in self.base.resolve().parents:
            if parent == tmp or tmp not in parent.parents:
                break
            mode = parent.stat().st_mode
            if not mode & 0o001:
                parent.chmod(mode | 0o005)
        (self.base / "enabled_plugins").write_text("[].\n")
        (self.base / "rabbitmq.conf").write_text(config)
        if os.geteuid() == 0:
            for p in [self.base, *self.base.rglob("*")]:
                shutil.chown(p, "rabbitmq", "rabbitmq")
        subprocess.run(["rabbitmq-server", "-detached"], env=self.env, check=True,
                       capture_output=True, timeout=60)
        # `wait PIDFILE` waits for the node to write its pid file and finish
        # booting; `await_startup` fails at once if the node is not registered yet.
        r = self.ctl("wait", "--timeout", "120", str(self.base / "pid"), timeout=150)
        if r.returncode != 0:
            self.stop()
            logs = "\n".join(p.read_text()[-2000:] for p in (self.base / "log").glob("*.log"))
            raise RuntimeError(f"RabbitMQ node {self.name} did not start: {r.stderr or r.stdout}\n{logs}")

    def stop(self) -> None:
        # With the pid file, `stop` also waits for the OS process to exit.
        pid = self.base / "pid"
        self.ctl("stop", *([str(pid)] if pid.exists() else []), timeout=60)


def start_node(base: Path, port: int, name: str) -> RabbitNode:
    node = RabbitNode(name=name, port=port, base=base)
    node.start()
    return node
