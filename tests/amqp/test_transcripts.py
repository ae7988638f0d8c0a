"""Scenario transcripts (etcd-raft `testdata/*.txt` style) for ServerConnection.

Each file in testdata/ is a readable conversation; every client line is fed
one byte at a time. Line kinds:

    > [ch] Class.Method k=v ...   client sends a pamqp method (values are Python literals)
    > header                      client sends the protocol header
    > [ch] content-header SIZE    client sends a content header (no properties)
    > [ch] body LITERAL           client sends a body frame (bytes literal)
    > raw TYPE CH HEX             client sends a raw frame
    ! call k=v ...                the server calls ServerConnection.<call>(...)
    ! [ch] send Class.Method k=v  the server calls send_method(ch, Class.Method(...))
    ! [ch] send_deliver k=v ...   (also channel_error, send_ack) with the channel first
    < [ch] Class.Method k=v ...   the next frame the server wrote (fields checked)
    < nothing                     the server wrote nothing more
    = Event k=v ...               the next event (fields checked)
    = none                        no more events
    state STATE                   the connection state
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from pamqp import body as pbody
from pamqp import commands as C
from pamqp import header as pheader

from broker.amqp import CLOSED, NEED_DATA, PAUSED, ConnectionState, ServerConnection

from .helpers import HEADER, body_frame, content_header, feed, method, parse_frames, raw_frame

DATA = Path(__file__).parent / "testdata"


def _tokens(text: str) -> list[str]:
    """Split on spaces outside quotes and brackets (values are Python literals)."""
    out, cur, quote, depth = [], "", "", 0
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            cur += c
            if c == "\\":
                cur += text[i + 1]
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
            cur += c
        elif c in "([{":
            depth += 1
            cur += c
        elif c in ")]}":
            depth -= 1
            cur += c
        elif c.isspace() and depth == 0:
            if cur:
                out.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    if cur:
        out.append(cur)
    return out


def _literal(text: str) -> Any:
    """A Python literal, or `LITERAL*N` for repetition (b'x'*5000)."""
    lhs, star, count = text.rpartition("*")
    if star and count.isdigit():
        return ast.literal_eval(lhs) * int(count)
    return ast.literal_eval(text)


def _kv(args: list[str]) -> dict[str, Any]:
    out = {}
    for a in args:
        k, _, v = a.partition("=")
        out[k] = _literal(v)
    return out


def _split_channel(words: list[str]) -> tuple[int, list[str]]:
    if words and words[0].isdigit():
        return int(words[0]), words[1:]
    return 0, words


def _pamqp(name: str) -> type:
    if name == "ContentHeader":
        return pheader.ContentHeader
    if name == "ContentBody":
        return pbody.ContentBody
    cls_name, _, meth = name.partition(".")
    return getattr(getattr(C, cls_name), meth)  # type: ignore[no-any-return]


def drain(conn: ServerConnection) -> list[Any]:
    events = []
    while (ev := conn.next_event()) not in (NEED_DATA, PAUSED, CLOSED):
        events.append(ev)
    return events


def run_transcript(path: Path) -> None:
    conn = ServerConnection()
    out: list[tuple[int, Any]] = []
    events: list[Any] = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path.name}:{lineno}: {line}"
        kind, words = line[0], _tokens(line[1:]) if line[0] in "><=!" else line.split()
        if kind == ">":
            ch, words = _split_channel(words)
            if words == ["header"]:
                data = HEADER
            elif words[0] == "content-header":
                data = content_header(int(words[1]), channel=ch)
            elif words[0] == "body":
                data = body_frame(_literal(words[1]), ch)
            elif words[0] == "raw":
                data = raw_frame(int(words[1]), int(words[2]), bytes.fromhex(words[3]))
            else:
                data = method(_pamqp(words[0])(**_kv(words[1:])), ch)
            events += feed(conn, data, 1)
            out += parse_frames(conn.data_to_send())
        elif kind == "!":
            ch, words = _split_channel(words)
            if words[0] == "send":
                result = conn.send_method(ch, _pamqp(words[1])(**_kv(words[2:])))
            elif words[0] in ("send_deliver", "channel_error", "send_ack"):
                result = getattr(conn, words[0])(ch, **_kv(words[1:]))
            else:
                result = getattr(conn, words[0])(**_kv(words[1:]))
            out += parse_frames(result)
            events += drain(conn)  # a decision may release buffered input
            out += parse_frames(conn.data_to_send())
        elif kind == "<":
            if words == ["nothing"]:
                assert out == [], f"{where}: unexpected output {out}"
                continue
            ch, words = _split_channel(words)
            assert out, f"{where}: server wrote nothing"
            got_ch, frame = out.pop(0)
            assert (got_ch, type(frame)) == (ch, _pamqp(words[0])), f"{where}: got {got_ch} {frame.name}"
            for k, v in _kv(words[1:]).items():
                assert getattr(frame, k) == v, f"{where}: {k}={getattr(frame, k)!r}"
        elif kind == "=":
            if words == ["none"]:
                assert events == [], f"{where}: unexpected events {events}"
                continue
            assert events, f"{where}: no event"
            ev = events.pop(0)
            assert type(ev).__name__ == words[0], f"{where}: got {ev}"
            for k, v in _kv(words[1:]).items():
                assert getattr(ev, k) == v, f"{where}: {k}={getattr(ev, k)!r}"
        elif line.startswith("state"):
            assert conn.state is ConnectionState[words[1]], f"{where}: state {conn.state}"
        else:
            raise AssertionError(f"{where}: unknown line")
    assert out == [] and events == [], f"{path.name}: unchecked output {out} / events {events}"


@pytest.mark.parametrize("path", sorted(DATA.glob("*.txt")), ids=lambda p: p.stem)
def test_transcript(path: Path) -> None:
    run_transcript(path)


def test_runner_detects_a_wrong_expectation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("> header\n< Connection.Tune\n")
    with pytest.raises(AssertionError, match="got 0 Connection.Start"):
        run_transcript(bad)
