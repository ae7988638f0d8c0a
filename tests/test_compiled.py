"""The compiled (mypyc) and pure Python paths of the broker (broker/compiled.py).

Which path a process takes is decided once, when `broker` is imported: the
extensions run only while they are a build of exactly the current sources,
and `QQ_PURE_PYTHON=1` always gives the pure path. These tests check the
decision on copies of the source tree (so nothing here depends on whether
`make native` ran) and, in fresh interpreters, which files the modules of
this checkout really load from.
"""
from __future__ import annotations

import ast
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import broker.compiled as compiled

ROOT = Path(__file__).resolve().parent.parent
EXT = importlib.machinery.EXTENSION_SUFFIXES[0]

_PROBE = (
    "import json, sys, broker, broker.compiled as c\n"
    "import broker.amqp.codec, broker.runtime.channel, broker.queue.machine\n"
    "print(json.dumps({'mode': c.mode, 'reason': c.reason, 'files': {m: sys.modules[m].__file__\n"
    "    for m in ('broker.amqp.codec', 'broker.runtime.channel', 'broker.queue.machine')}}))\n"
)


def _probe(cwd: Path, pure: bool | None = None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != compiled.PURE_ENV}
    if pure is not None:
        env[compiled.PURE_ENV] = "1" if pure else "0"
    env["PYTHONPATH"] = str(cwd)
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout)
    return result


def _source_tree(tmp: Path) -> Path:
    """A copy of broker/ (sources only) under tmp, as its own checkout."""
    shutil.copytree(ROOT / "broker", tmp / "broker",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__", compiled.MANIFEST, "ui"))
    return tmp


def _fake_build(tree: Path, digest: str) -> None:
    """Stand-ins for a build: a manifest with `digest` and a file at every
    extension's path (their content is never loaded by these tests)."""
    for m in (*compiled.COMPILED, compiled.GROUP + "__mypyc"):
        tree.joinpath(*m.split(".")).with_suffix(EXT).write_bytes(b"not an extension")
    (tree / "broker" / compiled.MANIFEST).write_text(json.dumps({"digest": digest}))


_DECIDE = (
    "import broker.compiled as c\n"
    "import json; print(json.dumps(c.build_is_current()))\n"
)


def _decide(tree: Path) -> tuple[bool, str]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", _DECIDE], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=120)
    # importing broker.compiled imports the package, whose activation must
    # survive the stand-in extensions (it loads nothing from them)
    assert out.returncode == 0, out.stderr
    ok, why = json.loads(out.stdout)
    return bool(ok), str(why)


def _digest_of(tree: Path) -> str:
    code = "import broker.compiled as c; print(c.digest())"
    env = dict(os.environ, PYTHONPATH=str(tree), **{compiled.PURE_ENV: "1"})
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_build_of_the_current_sources_is_used(tmp_path: Path) -> None:
    tree = _source_tree(tmp_path)
    _fake_build(tree, _digest_of(tree))
    assert _decide(tree) == (True, "")


def test_an_edited_source_makes_the_build_stale(tmp_path: Path) -> None:
    """A compiled module's source, and an interpreted one's too: compiled
    code checks the types of what it imports from the interpreted modules."""
    tree = _source_tree(tmp_path)
    digest = _digest_of(tree)
    for edited in ("queue/machine.py", "storage/group.py"):
        _fake_build(tree, digest)
        path = tree / "broker" / edited
        before = path.read_text()
        path.write_text(before + "\n# edited\n")
        ok, why = _decide(tree)
        assert not ok and "sources changed" in why, edited
        path.write_text(before)
    assert _decide(tree) == (True, "")


def test_a_missing_or_an_unlisted_extension_makes_the_build_unusable(tmp_path: Path) -> None:
    tree = _source_tree(tmp_path)
    _fake_build(tree, _digest_of(tree))
    extra = tree / "broker" / "runtime" / f"node{EXT}"
    extra.write_bytes(b"left over from another build")
    ok, why = _decide(tree)
    assert not ok and "unexpected extension broker/runtime/node" in why
    extra.unlink()
    other = tree / "broker" / "storage" / "wal.abi3.so"  # another suffix the interpreter loads
    other.write_bytes(b"left over")
    ok, why = _decide(tree)
    assert not ok and why == "unexpected extension broker/storage/wal.abi3.so (make native)"
    other.unlink()
    tree.joinpath("broker", "raft", f"node{EXT}").unlink()
    ok, why = _decide(tree)
    assert not ok and why == "extension missing: broker.raft.node"


def test_a_build_that_does_not_load_gives_the_pure_path(tmp_path: Path) -> None:
    """The manifest matches but the shared library is not one (here: garbage):
    the process says so and runs the sources."""
    tree = _source_tree(tmp_path)
    _fake_build(tree, _digest_of(tree))
    got = _probe(tree)
    assert got["mode"] == "pure" and str(got["reason"]).startswith("the build does not load")
    assert all(str(f).endswith(".py") for f in got["files"].values())  # type: ignore[attr-defined]


def test_without_a_build_every_module_loads_from_its_source(tmp_path: Path) -> None:
    tree = _source_tree(tmp_path)
    got = _probe(tree)
    assert got["mode"] == "pure" and got["reason"] == "not built (make native)"
    assert all(str(f).endswith(".py") for f in got["files"].values())  # type: ignore[attr-defined]


def test_the_pure_path_ignores_stale_extensions(tmp_path: Path) -> None:
    """Stand-in extensions (garbage) beside the sources with a stale manifest:
    importing them would fail, so the modules loading at all shows the pure
    path's finder took the .py files."""
    tree = _source_tree(tmp_path)
    _fake_build(tree, "0" * 64)
    got = _probe(tree)
    assert got["mode"] == "pure" and "sources changed" in str(got["reason"])
    assert all(str(f).endswith(".py") for f in got["files"].values())  # type: ignore[attr-defined]


def test_this_checkout_runs_its_build_and_the_pure_path_on_request() -> None:
    """`make test` builds first, so the compiled path is what the suite ran;
    QQ_PURE_PYTHON=1 gives the pure one from the same checkout."""
    current, why = compiled.build_is_current()
    got = _probe(ROOT)
    files = got["files"].values()  # type: ignore[attr-defined]
    if current:
        assert got["mode"] == "compiled"
        assert all(str(f).endswith(EXT) for f in files)
    else:
        assert got["mode"] == "pure" and got["reason"] == why
        assert all(str(f).endswith(".py") for f in files)
    pure = _probe(ROOT, pure=True)
    assert pure["mode"] == "pure" and pure["reason"] == f"{compiled.PURE_ENV} is set"
    assert all(str(f).endswith(".py") for f in pure["files"].values())  # type: ignore[attr-defined]


def test_the_mode_of_this_process_matches_its_modules() -> None:
    """The suite's own process: a compiled module is an extension exactly
    when the process took the compiled path."""
    import broker.queue.machine as machine

    assert compiled.mode in ("compiled", "pure")
    assert machine.__file__ is not None
    assert machine.__file__.endswith(EXT) == (compiled.mode == "compiled")
    if os.environ.get(compiled.PURE_ENV, "") not in ("", "0"):
        assert compiled.mode == "pure"


# ------------------------------------------------- what mypyc compiles differently
def _compiled_trees() -> list[tuple[str, ast.Module]]:
    return [(m, ast.parse(compiled.source_path(m).read_text())) for m in compiled.COMPILED]


def _is_module(name: str) -> bool:
    p = ROOT.joinpath(*name.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def _submodule_imports(module: str, tree: ast.Module) -> list[str]:
    """`from pkg import submodule` statements: a compiled module reads such a
    name through a module cache that only `import pkg.submodule` fills (mypyc
    of mypy 2.4: the name is None at first use), so they are written as
    `import pkg.submodule as name`."""
    bad = []
    package = module.rsplit(".", 1)[0].split(".")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            bad += [f"{module}:{node.lineno} from {base} import {a.name}"
                    for a in node.names if _is_module(f"{base}.{a.name}")]
    return bad


def _rebound_except_names(module: str, tree: ast.Module) -> list[str]:
    """One function binding the same name in except clauses of different
    types: mypyc types the variable by its first clause and a later clause's
    exception fails that check (a TypeError inside the handler)."""
    bad = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        types: dict[str, set[str]] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.ExceptHandler) and node.name:
                types.setdefault(node.name, set()).add(ast.unparse(node.type) if node.type else "")
        bad += [f"{module}:{fn.lineno} {fn.name}: {n} as {sorted(t)}" for n, t in types.items() if len(t) > 1]
    return bad


def _tuple_identity(module: str, tree: ast.Module) -> list[str]:
    """`x is CONST` where CONST is a module-level tuple: compiled code unboxes
    fixed-length tuples, so a tuple read back is a new object and `is` fails."""
    tuples = {t.id for node in tree.body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple)
              for t in node.targets if isinstance(t, ast.Name)}
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, (a, b) in zip(node.ops, zip(operands, operands[1:], strict=False), strict=False):
                if isinstance(op, (ast.Is, ast.IsNot)) and any(
                        isinstance(x, ast.Name) and x.id in tuples for x in (a, b)):
                    bad.append(f"{module}:{node.lineno} {ast.unparse(node)}")
    return bad


def test_compiled_modules_avoid_what_mypyc_compiles_differently() -> None:
    problems = [p for m, tree in _compiled_trees()
                for p in (*_submodule_imports(m, tree), *_rebound_except_names(m, tree),
                          *_tuple_identity(m, tree))]
    assert problems == []


def test_the_checks_find_each_pattern() -> None:
    tree = ast.parse(
        "from broker import queue\n"
        "from . import wire as w\n"
        "_NONE = (0, 0)\n"
        "def f(x):\n"
        "    try:\n"
        "        pass\n"
        "    except KeyError as exc:\n"
        "        pass\n"
        "    except Exception as exc:\n"
        "        pass\n"
        "    return x is _NONE\n")
    assert _submodule_imports("broker.runtime.channel", tree) == [
        "broker.runtime.channel:1 from broker import queue",
        "broker.runtime.channel:2 from broker.runtime import wire"]
    assert _rebound_except_names("m", tree) == ["m:4 f: exc as ['Exception', 'KeyError']"]
    assert _tuple_identity("m", tree) == ["m:11 x is _NONE"]
