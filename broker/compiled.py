"""Which broker modules run compiled (mypyc), and the switch back to the pure
Python path.

The modules on a message's path (the AMQP codec and connection, the channel
and its publisher sessions, the queue runtime and machine, Raft, routing) are
compiled to C extensions by `scripts/build_native.py` (`make native`, which
`make run` and `make test` call). Each compiled module's `.py` source stays
where it is and stays the definition: an extension is only a faster build of
the same code, and the broker runs the same without any.

`activate()` (called by `broker/__init__.py` before any other broker module
is imported) decides which path this process takes:
  - compiled, when the build's manifest (`_build.json`, written by the build)
    holds the digest of this module list, every broker source (compiled code
    checks at run time the types of what it imports from interpreted
    modules, and inlines their constants) and the versions of the typed
    dependencies (pamqp), every extension is present and no other is, and
    the shared library loads (it is loaded there and then). A finder placed
    first on `sys.meta_path` then loads each listed module from its
    extension or not at all;
  - pure Python otherwise: nothing was built, a source changed since the
    build (a stale extension is never run), or `QQ_PURE_PYTHON=1` asks for
    it. The finder placed first then loads every broker module from its
    `.py` file, so extensions beside them are ignored.
The choice is all or nothing: compiled modules call each other directly
inside one shared library, so a mixture would hold two copies of a module.
The build (scripts/build_native.py) removes the manifest before it changes
any extension, replaces files (a running process keeps what it mapped)
and writes the manifest last.

This module is never compiled itself and imports nothing from the broker.
"""
from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

#: The compiled modules, by name. Not here: modules that subclass a class with
#: __slots__ from another library (`runtime/pamqp_ext.py`), dataclasses with
#: ClassVar fields (`runtime/peer_wire.py`), classes whose instances are built
#: around their slot descriptors (`raft/types.py`), error classes deriving from
#: OSError (mypyc cannot), and everything off the per-message path.
COMPILED: tuple[str, ...] = (
    "broker.amqp.codec",
    "broker.amqp.connection",
    "broker.amqp.events",
    "broker.amqp.tables",
    "broker.common.packing",
    "broker.metadata.routing",
    "broker.queue.commands",
    "broker.queue.config",
    "broker.queue.deadletter",
    "broker.queue.effects",
    "broker.queue.errors",
    "broker.queue.fifo",
    "broker.queue.machine",
    "broker.queue.snapshot",
    "broker.queue.types",
    "broker.raft.errors",
    "broker.raft.log",
    "broker.raft.node",
    "broker.raft.progress",
    "broker.raft.storage",
    "broker.runtime.amqp_server",
    "broker.runtime.backoff",
    "broker.runtime.channel",
    "broker.runtime.classic",
    "broker.runtime.commands",
    "broker.runtime.confirms",
    "broker.runtime.forwarding",
    "broker.runtime.machine",
    "broker.runtime.msg_stats",
    "broker.runtime.publish",
    "broker.runtime.queues",
    "broker.runtime.raft_group",
    "broker.runtime.raft_wire",
    "broker.runtime.wire",
)

#: mypyc's group: the one shared library holding every compiled module
#: (`broker/_mypyc__mypyc.<ext>`); each module's own extension is a stub
#: that loads its part of it.
GROUP = "broker._mypyc"
MANIFEST = "_build.json"
PURE_ENV = "QQ_PURE_PYTHON"
#: installed distributions whose annotations compiled code checks at run
#: time (pamqp's method fields): part of what a build is of
TYPED_DEPENDENCIES = ("pamqp",)

_ROOT = Path(__file__).resolve().parent.parent
_EXT = importlib.machinery.EXTENSION_SUFFIXES[0]
_ALL_EXT = tuple(importlib.machinery.EXTENSION_SUFFIXES)

#: "compiled" or "pure", and why (set by activate(); shown at start-up)
mode = "pure"
reason = "not activated"


def source_path(module: str) -> Path:
    return _ROOT.joinpath(*module.split(".")).with_suffix(".py")


def extension_path(module: str) -> Path:
    return _ROOT.joinpath(*module.split(".")).with_suffix(_EXT)


def _dependency_versions() -> list[str]:
    out = []
    for name in TYPED_DEPENDENCIES:
        try:
            out.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{name} missing")
    return out


def digest(modules: Sequence[str] = COMPILED) -> str:
    """What a build is of: the module list, the source of every broker module
    (compiled code also checks, at run time, the types of what it imports
    from the interpreted ones, and inlines their Final constants) and the
    versions of `TYPED_DEPENDENCIES`."""
    h = hashlib.sha256()
    for m in modules:
        h.update(m.encode() + b"\0")
    for dep in _dependency_versions():
        h.update(dep.encode() + b"\0")
    broker_dir = _ROOT / "broker"
    for path in sorted(broker_dir.rglob("*.py")):
        h.update(str(path.relative_to(_ROOT)).encode() + b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def manifest_path() -> Path:
    return _ROOT / "broker" / MANIFEST


def extensions() -> list[Path]:
    """Every extension module file under broker/, whatever its suffix."""
    return sorted(p for p in (_ROOT / "broker").rglob("*.so") if p.name.endswith(_ALL_EXT))


def build_is_current() -> tuple[bool, str]:
    """(True, "") when the extensions are a build of exactly these sources;
    else (False, why not)."""
    try:
        built = json.loads(manifest_path().read_text())
    except FileNotFoundError:
        return False, "not built (make native)"
    except (OSError, ValueError) as exc:
        return False, f"unreadable build manifest: {exc}"
    if built.get("digest") != digest():
        return False, "sources changed since the build (make native)"
    expected = {*COMPILED, GROUP + "__mypyc"}
    missing = sorted(m for m in expected if not extension_path(m).exists())
    if missing:
        return False, f"extension missing: {missing[0]}"
    extra = [str(p.relative_to(_ROOT)) for p in extensions()
             if not p.name.endswith(_EXT) or _module_of(p) not in expected]
    if extra:
        return False, f"unexpected extension {extra[0]} (make native)"
    return True, ""


def _module_of(extension: Path) -> str:
    rel = extension.relative_to(_ROOT)
    return ".".join((*rel.parts[:-1], rel.name[: -len(_EXT)]))


class _SourceFinder(importlib.abc.MetaPathFinder):
    """The pure path: every broker module with a .py file is loaded from it
    (never from an extension beside it, listed or left over from any build)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("broker."):
            return None
        source = source_path(fullname)
        if not source.exists():
            return None  # a package (its __init__.py), or not ours
        return importlib.util.spec_from_file_location(fullname, source)


class _ExtensionFinder(importlib.abc.MetaPathFinder):
    """The compiled path: a listed module is loaded from its extension, or
    not at all (its .py never stands in: that would be a mixture)."""

    def __init__(self, modules: Sequence[str]) -> None:
        self.modules = frozenset(modules)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules:
            return None
        ext = extension_path(fullname)
        if not ext.exists():
            raise ImportError(f"{fullname}: the compiled build this process started with is gone "
                              f"({ext.name}); restart it", name=fullname)
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(ext))
        return importlib.util.spec_from_file_location(fullname, ext, loader=loader)


def activate() -> None:
    """Choose the compiled or the pure path for this process (see the module
    docstring). Idempotent; must run before any listed module is imported."""
    global mode, reason
    if any(isinstance(f, (_SourceFinder, _ExtensionFinder)) for f in sys.meta_path):
        return
    ok, why = build_is_current()
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        ok, why = False, f"{PURE_ENV} is set"
    if ok:
        try:
            # The shared library holds every compiled module's code: loaded
            # now, a rebuild later (which replaces files, never rewrites
            # them) cannot change what this process runs.
            importlib.import_module(GROUP + "__mypyc")
        except ImportError as exc:
            ok, why = False, f"the build does not load: {exc}"
    if ok:
        mode, reason = "compiled", f"mypyc, {len(COMPILED)} modules"
        sys.meta_path.insert(0, _ExtensionFinder(COMPILED))
        return
    mode, reason = "pure", why
    sys.meta_path.insert(0, _SourceFinder())


def describe() -> str:
    return f"{mode} ({reason})"
