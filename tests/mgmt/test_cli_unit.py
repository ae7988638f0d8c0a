"""qqctl's output and exit-code logic over a scripted client (no broker)."""
from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest

from broker import cli


class Scripted:
    """Stands in for cli.Client: `stream` replays NDJSON lines."""

    def __init__(self, lines: list[dict[str, Any]]) -> None:
        self.lines = lines
        self.calls: list[tuple[str, Any]] = []

    def stream(self, path: str, body: Any) -> Iterator[dict[str, Any]]:
        self.calls.append((path, body))
        yield from self.lines


def outputs(as_json: bool = False) -> tuple[cli.Output, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    return cli.Output(as_json, out, err), out, err


def progress(name: str, done: int, total: int, result: str = "ok", **kw: Any) -> dict[str, Any]:
    return {"progress": {"vhost": "/", "name": name, "done": done, "total": total,
                         "result": result, **kw}}


def test_long_operation_prints_progress_and_a_table() -> None:
    rows = [{"vhost": "/", "name": "a", "result": "ok"}, {"vhost": "/", "name": "b", "result": "ok"}]
    client = Scripted([progress("a", 1, 2), progress("b", 2, 2), {"result": rows}])
    o, out, err = outputs()
    assert cli._long(client, o, "/api/quorum-queues/grow", {"node": "n"}, "grow") == 0  # type: ignore[arg-type]
    assert err.getvalue().splitlines() == ["[1/2] queue 'a' in vhost '/': ok",
                                           "[2/2] queue 'b' in vhost '/': ok"]
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["vhost", "name", "result", "reason"]
    assert [ln.split()[1] for ln in lines[1:]] == ["a", "b"]


def test_long_operation_with_a_failed_queue_exits_1() -> None:
    rows = [{"vhost": "/", "name": "a", "result": "error", "reason": "no quorum"}]
    client = Scripted([progress("a", 1, 1, "error", reason="no quorum"), {"result": rows}])
    o, out, err = outputs(as_json=True)
    assert cli._long(client, o, "/x", {"node": "n", "errors_only": True}, "shrink") == 1  # type: ignore[arg-type]
    assert "[1/1] queue 'a' in vhost '/': error: no quorum" in err.getvalue()
    assert "shrink: 1 queue(s) failed" in err.getvalue()
    assert json.loads(out.getvalue()) == rows


def test_long_operation_error_line_and_truncated_stream() -> None:
    o, _, _ = outputs()
    with pytest.raises(cli.CliError) as exc:
        cli._long(Scripted([{"error": "x", "reason": "node down", "status": 503}]), o, "/x", {},  # type: ignore[arg-type]
                  "drain")
    assert "node down (HTTP 503)" in str(exc.value) and exc.value.code == cli.EXIT_REFUSED
    with pytest.raises(cli.CliError) as exc:
        cli._long(Scripted([progress("a", 1, 2)]), o, "/x", {}, "drain")  # type: ignore[arg-type]
    assert "without a result" in str(exc.value) and exc.value.code == cli.EXIT_UNAVAILABLE


@pytest.mark.parametrize(("status", "raw", "code", "text"), [
    (404, b'{"error": "not_found", "reason": "no queue \'q\'"}', 1, "no queue 'q' (HTTP 404)"),
    (401, b'{"error": "not_authorized", "reason": "Login failed"}', 1, "check --user/--password"),
    (403, b'{"error": "access_refused", "reason": "nope"}', 1, "lacks the needed tag"),
    (503, b"not json", 69, "not json (HTTP 503)"),
    (500, b"", 1, "no reason given (HTTP 500)"),
])
def test_http_errors_become_clear_messages(status: int, raw: bytes, code: int, text: str) -> None:
    err = cli._http_error(status, raw)
    assert err.code == code and text in str(err)


def test_table_aligns_columns_and_joins_lists() -> None:
    out = io.StringIO()
    cli.table([{"name": "q", "members": ["a", "b"], "n": None}, {"name": "longer", "members": []}],
              ["name", "members", "n"], out)
    assert out.getvalue().splitlines() == ["name    members  n", "q       a,b", "longer"]


def test_usage_errors_exit_2() -> None:
    err = io.StringIO()
    assert cli.main(["grow", "n1", "most"], out=io.StringIO(), err=err) == 2
    assert cli.main(["set_policy", "p", ".*", "[1]"], out=io.StringIO(), err=err) == 2
    assert "must be a JSON object" in err.getvalue()


class LeavingClient:
    """A broker refusing `desired_replicas` (no StatefulSet discovery), then
    draining plainly; the node is already out of the cluster afterwards."""

    url, auth, timeout = "http://127.0.0.1:15672", "Basic x", 1.0

    def __init__(self, refuse_with: int) -> None:
        self.refuse_with = refuse_with
        self.drains: list[Any] = []

    def stream(self, path: str, body: Any) -> Iterator[dict[str, Any]]:
        self.drains.append(body)
        if "desired_replicas" in body:
            raise cli.CliError(f"refused (HTTP {self.refuse_with})", http_status=self.refuse_with)
        yield {"result": []}

    def call(self, method: str, path: str, body: Any = None) -> Any:
        assert (method, path) == ("GET", "/api/nodes")
        return [{"name": "other@h", "metadata_leader": True}]


@pytest.mark.parametrize("status, drains", [(400, [{"desired_replicas": 3}, {}]),
                                            (503, [{"desired_replicas": 3}])])
def test_a_leaving_pod_falls_back_to_a_plain_drain_only_when_the_option_is_refused(
        status: int, drains: list[Any]) -> None:
    """The fallback goes by the HTTP status of the refusal (400: the option,
    checked before the drain starts), not by the refusal's wording."""
    import time

    client = LeavingClient(status)
    o, _out, _err = outputs()
    logged: list[str] = []
    code = cli._leave(client, o, None, "me@h", time.monotonic() + 5, logged.append,  # type: ignore[arg-type]
                      lambda: 5.0, 3)
    assert code == 0 and client.drains == drains
    assert any("has left the cluster" in line for line in logged)
    assert any("without excluding" in line for line in logged) == (status == 400)


def test_http_errors_carry_their_status_and_body() -> None:
    err = cli._http_error(400, b'{"error": "bad_request", "reason": "no"}')
    assert (err.http_status, err.body) == (400, {"error": "bad_request", "reason": "no"})
