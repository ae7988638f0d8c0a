"""Replays the scenario transcripts in tests/raft/testdata/*.txt and compares
their output line by line. To regenerate after an intended behaviour change
(then review the diff like code):

    RAFT_TRANSCRIPT_REWRITE=1 .venv/bin/python -m pytest tests/raft/test_transcripts.py
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.raft.interaction import parse, replay

DATA = Path(__file__).parent / "testdata"
FILES = sorted(DATA.glob("*.txt"))


def test_there_are_transcripts() -> None:
    assert len(FILES) >= 4


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_transcript(path: Path) -> None:
    problems = replay(path, rewrite=os.environ.get("RAFT_TRANSCRIPT_REWRITE") == "1")
    assert not problems, "\n\n".join(problems)


def test_interpreter_detects_a_wrong_expectation(tmp_path: Path) -> None:
    p = tmp_path / "t.txt"
    p.write_text("cluster 1 2 3\n----\nok\n\nstatus 1\n----\n1: leader term=9\n")
    problems = replay(p)
    assert len(problems) == 1 and "status 1" in problems[0]
    assert parse(p.read_text())[0][1] == ["cluster 1 2 3"]
