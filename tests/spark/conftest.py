"""One local-mode SparkSession for every test in this directory, and the real
3-node cluster the audit tests read (tests/spark/scenario.py)."""
from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="package")
def spark() -> Iterator[object]:
    """The session, for this directory's tests only: once they are done the
    JVM goes too. Left running, a py4j object collected later (a garbage
    collection inside another test) sent its release to a JVM connection that
    had been reset; py4j logs that with a traceback, and Python 3.11 formats a
    traceback with `ast.parse`: inside the `ast.parse` of the test the
    collection interrupted, that raised "SystemError: AST constructor
    recursion depth mismatch" (CPython gh-106905) in tests/test_architecture.py."""
    pytest.importorskip("pyspark")
    from py4j.finalizer import ThreadSafeFinalizer
    from pyspark import SparkContext

    from spark.audit import build_session

    session = build_session("local[2]", app="quorumq-audit-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    gc.collect()  # what the tests dropped is released while the JVM still answers
    ThreadSafeFinalizer.clear_finalizers(clear_all=True)  # no release after this
    gateway = SparkContext._gateway
    if gateway is not None:
        proc = getattr(gateway, "proc", None)
        gateway.shutdown()
        SparkContext._gateway = SparkContext._jvm = None
        if proc is not None:  # pyspark's JVM exits when its stdin closes
            proc.stdin.close()
            proc.wait(timeout=60)
