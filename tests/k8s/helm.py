"""The real helm binary (installed by scripts/ensure-helm) and chart rendering."""
from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "quorumq"
PRODUCTION_VALUES = CHART / "ci" / "production-values.yaml"


@cache
def helm() -> str:
    """Path of helm, installed into the venv on first use (idempotent script)."""
    subprocess.run([str(ROOT / "scripts" / "ensure-helm")], check=True, capture_output=True)
    return str(ROOT / ".venv" / "bin" / "helm")


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=120)


def render(*args: str, namespace: str = "messaging", release: str = "qq") -> list[dict[str, Any]]:
    """`helm template` (CRDs included) as a list of manifests."""
    proc = run_helm("template", release, str(CHART), "--namespace", namespace,
                    "--include-crds", *args)
    if proc.returncode != 0:
        raise AssertionError(f"helm template failed:\n{proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"{kind} *{name_suffix}: {[d['metadata']['name'] for d in found]}"
    return found[0]
