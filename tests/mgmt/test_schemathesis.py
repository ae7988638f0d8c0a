"""Schemathesis over the served OpenAPI document, against a real 3-node cluster.

Every operation is fuzzed (schema-valid and schema-violating inputs, plus
stateful sequences) with a fixed seed; path parameters are drawn mostly from
real vhost and queue names so the requests reach the handlers' logic rather
than stopping at 404. Checks: no 5xx, every status and content type
documented, responses match their schemas, schema-violating requests are
refused with a 4xx.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from .conftest import MgmtCluster

CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_schema_conformance,negative_data_rejection")

CONFIG = """
[dictionaries.vhosts]
values = ["/", "/", "other-vhost"]

[dictionaries.queues]
values = ["st-q1", "st-q2", "st-classic"]

[parameters]
"path.vhost" = { dictionary = "vhosts", probability = 0.8 }
"path.name" = { dictionary = "queues", probability = 0.6 }
"""


def _schemathesis() -> str:
    exe = Path(sys.executable).parent / "schemathesis"
    found = str(exe) if exe.exists() else shutil.which("schemathesis")
    assert found, "schemathesis is not installed (pip install schemathesis==4.32.5)"
    return found


#: Operations that would lock the run out (deleting or re-tagging the user it
#: authenticates as, deleting the vhost the dictionary points at): fuzzed in a
#: second run with random names only.
DESTRUCTIVE = ("putUsersByUser", "deleteUsersByUser", "deleteVhostsByVhost",
               "putPermissionsByVhostByUser", "deletePermissionsByVhostByUser",
               "deleteNodesByNode",  # would remove a cluster node the run uses
               # a limit of 0 on '/' would refuse the other tests' connections and queues
               "putVhostLimitsByVhostByName", "putUserLimitsByUserByName")


def _run(args: list[str], cwd: Path) -> int:
    """Run schemathesis; fail on any failure; return how many test cases it ran."""
    proc = subprocess.run([_schemathesis(), *args, "--auth", "guest:guest", "--checks", CHECKS,
                           "--seed", "1", "--workers", "1", "--request-timeout", "60",
                           "--no-shrink"],
                          capture_output=True, text=True, timeout=300, cwd=cwd)
    report = proc.stdout[-8000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, report
    summary = proc.stdout.split("SUMMARY")[-1]
    assert "passed" in summary and "failed" not in summary, report
    found = re.search(r"(\d+) generated, (\d+) passed", summary)
    assert found and found.group(1) == found.group(2), report
    return int(found.group(1))


def test_api_conforms_to_its_openapi_document(mgmt_cluster: MgmtCluster, tmp_path: Path) -> None:
    api = mgmt_cluster.apis[0]
    for name, qtype in (("st-q1", "quorum"), ("st-q2", "quorum"), ("st-classic", "classic")):
        assert api.put(f"/api/queues/%2F/{name}", {"durable": True, "type": qtype})[0] == 201
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    url = f"{api.base}/api/openapi.json"
    exclude = [a for op in DESTRUCTIVE for a in ("--exclude-operation-id", op)]
    cases = _run(["--config-file", str(config), "run", url, "--max-examples", "4", *exclude],
                 tmp_path)
    assert cases >= 500
    include = [a for op in DESTRUCTIVE for a in ("--include-operation-id", op)]
    cases = _run(["run", url, "--max-examples", "5", "--phases", "coverage,fuzzing", *include],
                 tmp_path)
    assert cases >= 50
    # the run could not lock itself out: guest is still an administrator
    assert api.get("/api/users/guest")[1]["tags"] == ["administrator"]
