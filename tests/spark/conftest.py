"""One local-mode SparkSession for every test in this directory, and the real
3-node cluster the audit tests read (tests/spark/scenario.py)."""
from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    pytest.importorskip("pyspark")
    from spark.audit import build_session

    session = build_session("local[2]", app="quorumq-audit-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
