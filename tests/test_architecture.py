"""Layering contract (docs/ARCHITECTURE.md): the pure cores never touch
sockets, files, clocks, randomness, threads or asyncio, and never import the
I/O shell; nothing imports `broker.runtime`.

This is an AST walk over the source, so it also catches imports hidden inside
functions or `if TYPE_CHECKING:` blocks.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PURE = ["broker/raft", "broker/queue", "broker/amqp", "broker/metadata"]
FORBIDDEN_MODULES = {
    "asyncio", "socket", "ssl", "selectors", "select", "threading", "multiprocessing",
    "concurrent", "subprocess", "signal", "time", "datetime", "random", "secrets", "os",
    "pathlib", "shutil", "tempfile", "io", "mmap", "fcntl", "glob", "uvloop", "aiohttp",
    "aiofiles", "prometheus_client", "logging",
}
FORBIDDEN_PACKAGES = {"broker.runtime", "broker.mgmt", "broker.storage", "broker.cli"}
FORBIDDEN_CALLS = {"open", "input", "print", "exec", "eval", "__import__"}


def _imports(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # resolve relative imports against the module's package
                base = module.split(".")[: -node.level]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return found


def _py_files(rel: str) -> list[Path]:
    return sorted((ROOT / rel).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts)


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    module = _module_name(path)
    out = []
    for lineno, name in _imports(tree, module):
        top = name.split(".")[0]
        if top in FORBIDDEN_MODULES:
            out.append(f"{path.relative_to(ROOT)}:{lineno} imports {name}")
        if any(name == p or name.startswith(p + ".") for p in FORBIDDEN_PACKAGES):
            out.append(f"{path.relative_to(ROOT)}:{lineno} imports the I/O shell {name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in FORBIDDEN_CALLS:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} calls {node.func.id}()")
    return out


@pytest.mark.parametrize("package", PURE)
def test_pure_package_does_no_io(package: str) -> None:
    files = _py_files(package)
    assert files, f"{package} has no modules"
    problems = [v for f in files for v in _violations(f)]
    assert not problems, "pure core does I/O:\n" + "\n".join(problems)


def test_nothing_imports_the_runtime() -> None:
    offenders = []
    for path in _py_files("broker"):
        if path.is_relative_to(ROOT / "broker/runtime"):
            continue
        for lineno, name in _imports(ast.parse(path.read_text()), _module_name(path)):
            if name == "broker.runtime" or name.startswith("broker.runtime."):
                # The two process entry points may start the runtime.
                if _module_name(path) in {"broker.__main__", "broker.run_local"}:
                    continue
                offenders.append(f"{path.relative_to(ROOT)}:{lineno} imports {name}")
    assert not offenders, "\n".join(offenders)


def test_checker_catches_a_violation(tmp_path: Path) -> None:
    """The checker itself must be able to fail."""
    bad = ROOT / "broker" / "raft" / "_arch_probe_tmp.py"
    bad.write_text("import time\nfrom ..runtime import x\nopen('f')\n")
    try:
        problems = _violations(bad)
    finally:
        bad.unlink()
    assert any("imports time" in p for p in problems)
    assert any("I/O shell broker.runtime" in p for p in problems)
    assert any("calls open()" in p for p in problems)


def _lint_imports(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "lint-imports"
    return subprocess.run([str(exe), "--no-cache", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_import_contracts_hold() -> None:
    """import-linter's contracts in pyproject.toml (`make lint` runs them too)."""
    r = _lint_imports()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def test_import_linter_catches_a_broken_contract(tmp_path: Path) -> None:
    cfg = tmp_path / "contracts.toml"
    cfg.write_text(
        '[tool.importlinter]\nroot_package = "broker"\n\n'
        '[[tool.importlinter.contracts]]\nname = "the runtime does not use the queue machine"\n'
        'type = "forbidden"\nsource_modules = ["broker.runtime"]\n'
        'forbidden_modules = ["broker.queue"]\n')
    r = _lint_imports("--config", str(cfg))
    assert r.returncode != 0 and "BROKEN" in r.stdout.upper(), r.stdout + r.stderr
