#!/usr/bin/env python3
"""Compile the broker's hot modules with mypyc (`make native`).

    .venv/bin/python scripts/build_native.py          # build unless current
    .venv/bin/python scripts/build_native.py --force  # build anyway
    .venv/bin/python scripts/build_native.py --clean  # remove every extension

The module list is `broker.compiled.COMPILED`. The extensions are written
beside their sources (`broker/amqp/codec.cpython-311-*.so`, ...), with one
shared library for the group (`broker/_mypyc__mypyc.*.so`) and a manifest
(`broker/_build.json`) holding the digest of the list and the sources: the
broker runs the extensions only while that digest matches (see
broker/compiled.py), so an edited source is never shadowed by an old build.

Everything it needs comes from PyPI with the dev extra (mypy, which ships
mypyc, and setuptools) plus the machine's C compiler. The C files are
compiled in parallel, one per module (mypyc's multi-file mode), in a
temporary directory; mypy reads the project's own configuration.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _compiled_module() -> Any:
    """broker/compiled.py on its own (importing the package would activate it)."""
    spec = importlib.util.spec_from_file_location("_qq_compiled", ROOT / "broker" / "compiled.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def clean(compiled: Any) -> int:
    """Remove the manifest (first: from then on no process takes the
    compiled path), then every extension under broker/."""
    compiled.manifest_path().unlink(missing_ok=True)
    n = 0
    for p in compiled.extensions():
        p.unlink()
        n += 1
    return n


def _replace(src: Path, dest: Path) -> None:
    """Copy to a temporary name beside `dest`, then rename over it: a
    process that mapped the old file keeps it whole (rewriting it in place
    could crash that process)."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.copy2(src, tmp)
    os.replace(tmp, dest)


def build(compiled: Any, jobs: int) -> None:
    from mypyc.build import mypycify
    from setuptools import setup
    from setuptools.command.build_ext import build_ext

    class ParallelBuildExt(build_ext):  # type: ignore[misc]
        """Compiles an extension's C files in parallel (one per module)."""

        def build_extension(self, ext: Any) -> None:
            cc = self.compiler
            one_by_one = cc.compile

            def compile_all(sources: list[str], *a: Any, **kw: Any) -> list[str]:
                with ThreadPoolExecutor(jobs) as pool:
                    return [o for objs in pool.map(lambda s: one_by_one([s], *a, **kw), sources)
                            for o in objs]

            cc.compile = compile_all
            try:
                super().build_extension(ext)
            finally:
                cc.compile = one_by_one

    digest = compiled.digest()
    sources = [str(compiled.source_path(m)) for m in compiled.COMPILED]
    with tempfile.TemporaryDirectory(prefix="qq-native-") as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)  # setuptools must not read the project's pyproject.toml as a project
        try:
            exts = mypycify(["--config-file", str(ROOT / "pyproject.toml"), *sources],
                            multi_file=True, opt_level="3", debug_level="0",
                            group_name=compiled.GROUP)
            for e in exts:
                # mypyc writes the group's headers under the group's package
                # directory but includes them by bare name from every module's file
                e.include_dirs.append(str(Path(tmp) / "build" / compiled.GROUP.split(".")[0]))
            out = Path(tmp) / "lib"
            setup(name="quorumq-native", packages=[], ext_modules=exts,
                  cmdclass={"build_ext": ParallelBuildExt},
                  script_args=["-q", "build_ext", "--build-lib", str(out),
                               "--build-temp", str(Path(tmp) / "obj")])
        finally:
            os.chdir(cwd)
        compiled.manifest_path().unlink(missing_ok=True)  # before any extension changes
        built = {ROOT / so.relative_to(out) for so in out.rglob(f"*{compiled._EXT}")}
        for so in out.rglob(f"*{compiled._EXT}"):
            _replace(so, ROOT / so.relative_to(out))
        for old in compiled.extensions():
            if old not in built:
                old.unlink()
    import mypy.version

    manifest = compiled.manifest_path()
    tmp = manifest.with_name(f".{manifest.name}.tmp")
    tmp.write_text(json.dumps({
        "digest": digest, "modules": list(compiled.COMPILED),
        "dependencies": compiled._dependency_versions(), "mypy": mypy.version.__version__,
        "python": sys.version.split()[0], "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }, indent=1) + "\n")
    os.replace(tmp, manifest)  # last: the build is usable from here on


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="build even if the build is current")
    ap.add_argument("--clean", action="store_true", help="remove the extensions (pure Python from now on)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    compiled = _compiled_module()
    if args.clean:
        print(f"build_native: removed {clean(compiled)} extensions")
        return 0
    current, why = compiled.build_is_current()
    if current and not args.force:
        print(f"build_native: {len(compiled.COMPILED)} modules, build is current")
        return 0
    print(f"build_native: compiling {len(compiled.COMPILED)} modules with mypyc ({why or 'forced'})",
          flush=True)
    t0 = time.monotonic()
    build(compiled, args.jobs)
    current, why = compiled.build_is_current()
    if not current:
        print(f"build_native: the build is not usable: {why}", file=sys.stderr)
        return 1
    print(f"build_native: done in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
