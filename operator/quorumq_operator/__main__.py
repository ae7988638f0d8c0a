"""`python -m quorumq_operator` / `qq-operator`: `kopf run` with flags from the environment.

Environment:
  QQ_OPERATOR_NAMESPACES          comma-separated namespaces to serve (default: all, -A)
  QQ_OPERATOR_PEERING             kopf peering object name (default "quorumq"); "" or
                                  "standalone" runs without peering (a single replica only)
  QQ_OPERATOR_PEERING_PRIORITY    this replica's peering priority (default 0)
  QQ_OPERATOR_LIVENESS_PORT       serve kopf's /healthz on this port (default 8081; 0 = off)
  QQ_OPERATOR_METRICS_PORT        Prometheus metrics port (default 0 = off; the chart sets 8080)
  QQ_OPERATOR_RESYNC_SECONDS      drift timer of QuorumQueue/Policy (default 10)
  QQ_OPERATOR_CLUSTER_INTERVAL_SECONDS  StatefulSet follow-up timer (default 5)
  QQ_OPERATOR_VERBOSE             "1": kopf --verbose

Extra command-line arguments are passed to `kopf run` unchanged.
"""
from __future__ import annotations

import os
import sys


def kopf_args(env: dict[str, str] | None = None, extra: list[str] | None = None) -> list[str]:
    """The `kopf run` command line for this environment (tested)."""
    env = dict(os.environ if env is None else env)
    args = ["run", "-m", "quorumq_operator.handlers"]
    namespaces = [n.strip() for n in env.get("QQ_OPERATOR_NAMESPACES", "").split(",") if n.strip()]
    if namespaces:
        for ns in namespaces:
            args += ["-n", ns]
    else:
        args.append("-A")
    peering = env.get("QQ_OPERATOR_PEERING", "quorumq")
    if peering in ("", "standalone"):
        args.append("--standalone")
    else:
        args += ["--peering", peering]
        if env.get("QQ_OPERATOR_PEERING_PRIORITY"):
            args += ["--priority", env["QQ_OPERATOR_PEERING_PRIORITY"]]
    liveness = env.get("QQ_OPERATOR_LIVENESS_PORT", "8081")
    if liveness and liveness != "0":
        args += ["--liveness", f"http://0.0.0.0:{liveness}/healthz"]
    if env.get("QQ_OPERATOR_VERBOSE") == "1":
        args.append("--verbose")
    return args + list(extra or [])


def main(argv: list[str] | None = None) -> None:
    from kopf import cli

    args = kopf_args(extra=list(sys.argv[1:] if argv is None else argv))
    cli.main(args=args, prog_name="qq-operator")


if __name__ == "__main__":
    main()
