"""Shared helpers for the metadata tests: a tiny driver over `apply`."""
from __future__ import annotations

from typing import Any

from broker.metadata import (
    CommandMeta,
    MetadataError,
    MetadataState,
    apply,
    hash_password,
    initial_state,
)

SALT = b"\x01\x02\x03\x04"


class Driver:
    """Applies commands with increasing log indexes and timestamps."""

    def __init__(self, state: MetadataState | None = None) -> None:
        self.state = state if state is not None else initial_state(hash_password("guest", SALT))
        self.index = 0
        self.effects: list[Any] = []

    def __call__(self, command: Any) -> Any:
        self.index += 1
        self.state, reply, effects = apply(
            CommandMeta(self.index, 1_000 * self.index), command, self.state
        )
        self.effects = effects
        self.state.check_invariants()
        return reply

    def ok(self, command: Any) -> Any:
        reply = self(command)
        assert not isinstance(reply, MetadataError), reply.reply_text
        return reply

    def err(self, command: Any) -> MetadataError:
        reply = self(command)
        assert isinstance(reply, MetadataError), f"expected a refusal, got {reply}"
        return reply
