"""`make run`: a local 3-node cluster on this machine.

Starts three `qq-broker` processes (AMQP 5672/5673/5674, peer transport
25672/25673/25674; the management API and metrics ports 15672-15674 and
15692-15694 are reserved for them) with data under `./data/` (kept between
runs: running again reuses it), prints how to connect, and stops all three
cleanly on Ctrl-C.
"""
from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

NODES = 3


def node_config(i: int, data: Path, secret_file: Path, host: str) -> str:
    seeds = "".join(f"cluster.seeds.{j + 1} = rabbit-{j + 1}@{host}:{25672 + j}\n" for j in range(NODES))
    return (
        f"node.name = rabbit-{i + 1}@{host}\n"
        f"node.data_dir = {data / f'rabbit-{i + 1}'}\n"
        f"listeners.tcp.default = {5672 + i}\n"
        f"management.tcp.port = {15672 + i}\n"
        f"prometheus.tcp.port = {15692 + i}\n"
        f"cluster.port = {25672 + i}\n"
        f"cluster.bind = {host}\n"
        f"cluster.secret_file = {secret_file}\n"
        + seeds
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="qq-run-local", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.environ.get("QQ_DATA", "data"), help="data directory (default ./data)")
    ap.add_argument("--host", default="127.0.0.1")
    args = ap.parse_args(argv)
    data = Path(args.data).resolve()
    data.mkdir(parents=True, exist_ok=True)
    secret_file = data / ".cluster-secret"
    if not secret_file.exists():
        secret_file.write_text(secrets.token_hex(32) + "\n")
        secret_file.chmod(0o600)
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    offsets = []
    for i in range(NODES):
        conf = data / f"rabbit-{i + 1}.conf"
        conf.write_text(node_config(i, data, secret_file, args.host))
        log = open(data / f"rabbit-{i + 1}.log", "ab")
        offsets.append(log.tell())  # only this run's "ready" line counts
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, "-m", "broker", "--config", str(conf)],
                                      stdout=log, stderr=subprocess.STDOUT))
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print(f"Starting a {NODES}-node cluster with data in {data} (logs: {data}/rabbit-N.log) ...", flush=True)
    ready = [False] * NODES
    deadline = time.monotonic() + 180
    while not stop and not all(ready):
        for i in range(NODES):
            if procs[i].poll() is not None:
                print(f"node rabbit-{i + 1} exited with {procs[i].returncode}; see {data}/rabbit-{i + 1}.log",
                      file=sys.stderr)
                stop = True
            elif not ready[i] and b"ready on port" in (data / f"rabbit-{i + 1}.log").read_bytes()[offsets[i]:]:
                ready[i] = True
        if time.monotonic() > deadline:
            print("the cluster did not come up within 180 s; see the logs", file=sys.stderr)
            stop = True
        time.sleep(0.1)
    if not stop:
        print(
            "\nCluster is up. Connect any AMQP 0-9-1 client to one of:\n"
            + "".join(f"  amqp://guest:guest@{args.host}:{5672 + i}/   (node rabbit-{i + 1})\n" for i in range(NODES))
            + "\nQuick start (pika):\n"
            "  import pika\n"
            f"  conn = pika.BlockingConnection(pika.ConnectionParameters('{args.host}', 5672))\n"
            "  ch = conn.channel(); ch.confirm_delivery()\n"
            "  ch.queue_declare('orders', durable=True, arguments={'x-queue-type': 'quorum'})\n"
            "  ch.basic_publish('', 'orders', b'hello')\n"
            + "\nManagement UI and API (guest/guest): "
            + ", ".join(f"http://{args.host}:{15672 + i}/" for i in range(NODES))
            + "\n\nPress Ctrl-C to stop all nodes.",
            flush=True,
        )
    while not stop:
        for i, p in enumerate(procs):
            if p.poll() is not None:
                print(f"node rabbit-{i + 1} exited with {p.returncode}", file=sys.stderr)
        time.sleep(0.5)
    print("\nStopping ...", flush=True)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
    for log in logs:
        log.close()
    print("Stopped. Data kept in", data, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
