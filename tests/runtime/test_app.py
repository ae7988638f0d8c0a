"""The process wiring (runtime/app.py): which configurations start the
management servers over the node. No process."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from broker.common.config import load_config
from broker.runtime.app import management_wanted, start_management

OFF = {"QQ__MANAGEMENT__TCP__PORT": "0", "QQ__PROMETHEUS__TCP__PORT": "0"}


@pytest.mark.parametrize("extra, wanted", [
    ({}, False),
    ({"QQ__MANAGEMENT__TCP__PORT": "15672"}, True),
    ({"QQ__PROMETHEUS__TCP__PORT": "15692"}, True),
    ({"QQ__MANAGEMENT__SSL__PORT": "15671"}, True),
    ({"QQ__PROMETHEUS__SSL__PORT": "15691"}, True),
    ({"QQ__QUORUM_QUEUE__CONTINUOUS_MEMBERSHIP_RECONCILIATION__ENABLED": "true"}, True),
])
def test_management_is_started_when_a_listener_or_the_reconciler_is_configured(
        extra: dict[str, str], wanted: bool) -> None:
    assert management_wanted(load_config("", {**OFF, **extra})) is wanted


def test_the_defaults_start_the_management_api_and_metrics() -> None:
    assert management_wanted(load_config("", {}))


def test_nothing_is_started_over_a_node_without_management() -> None:
    node: Any = SimpleNamespace(config=load_config("", OFF))
    assert asyncio.run(start_management(node)) is None
