"""A StatefulSet player: what the StatefulSet controller, the kubelet and
kube-proxy would do for the broker pods, against the stand-in Kubernetes API.

Only Kubernetes is played; the pods are real. The player

- watches the StatefulSet in the API (it polls it: replicas, template);
- runs one real broker process per ordinal (`python -m broker`, the
  container's `args`) on its own loopback address `127.0.1.1{ordinal}`, with the container's environment resolved the way the
  kubelet resolves it (`value`, `fieldRef` metadata.name/namespace,
  `secretKeyRef` read from the Secret in the API) and the ConfigMap's
  `quorumq.conf` (read from the API) as its configuration file;
- keeps a Pod object per ordinal in the API (owner reference to the
  StatefulSet, the template's labels and spec, a new uid per incarnation) and
  its Ready condition from the broker's readiness endpoint (the chart's
  readinessProbe path), polled every `probe_interval` s;
- stops a pod as the kubelet does: deletionTimestamp set (the pod leaves the
  service's endpoints), the container's preStop hook run exactly as the
  template says (`qqctl drain --if-leaving --statefulset ... --wait N`) with
  the desired replicas passed in `QQ_DESIRED_REPLICAS` (read from the API at
  that moment: what the CLI reads through the API in a real pod), SIGTERM,
  SIGKILL when `terminationGracePeriodSeconds` is over, then the Pod object
  removed;
- scale-up: starts the missing ordinals together (`podManagementPolicy:
  Parallel`); scale-down: stops the highest ordinal first, one at a time,
  and deletes its volume (`persistentVolumeClaimRetentionPolicy.whenScaled:
  Delete`); a template change (a rolling update): once every pod is Ready,
  restarts pods one at a time, highest ordinal first, each only after the
  previous one is Ready again; writes the StatefulSet's status (replicas,
  readyReplicas, updatedReplicas, currentRevision, updateRevision);
- a container that exits on its own is restarted (restartCount) and recorded;
- plays the client Service for the management port: a TCP proxy on
  127.0.0.1 forwarding each connection to a Ready, not terminating pod
  (what kube-proxy does with the Service's endpoints).

What differs from a pod, on purpose (the same as tests/k8s/test_pods.py):
the node's host is its loopback address (QQ__CLUSTER__STATEFULSET__HOST_TEMPLATE)
instead of the headless service's DNS name, listeners bind that address,
and the mounted paths (the PVC, the ConfigMap, the Secret's cluster-secret,
the `localhost` of QQCTL_URL) are translated to the pod's directory and
address. Every record of what happened (preStop durations and exit codes,
crashes, starts) is kept in `records` for the test to assert on.
"""
from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import select
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .conftest import NS, KubeApi

ROOT = Path(__file__).resolve().parents[2]
QQCTL = str(ROOT / ".venv" / "bin" / "qqctl")


def addr(ordinal: int) -> str:
    return f"127.0.1.1{ordinal}"


HOST_TEMPLATE = "127.0.1.1{ordinal}"
NODE_NAME_TEMPLATE = "rabbit@127.0.1.1{ordinal}"  # the operator's annotation for these pods


def revision(sts: dict[str, Any]) -> str:
    text = json.dumps(sts["spec"]["template"], sort_keys=True)
    return f"{sts['metadata']['name']}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def _now_iso() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class PreStopRecord:
    pod: str
    ordinal: int
    desired: int
    command: list[str]
    started: float
    duration: float
    returncode: int | None  # None: killed at the end of the grace period
    output: str


@dataclass
class PodRun:
    """One pod (one incarnation of an ordinal) and its container process."""
    ordinal: int
    name: str
    revision: str
    uid: str
    proc: subprocess.Popen[bytes]
    env: dict[str, str]
    log_path: Path
    started: float
    ready: bool = False
    terminating: bool = False
    restarts: int = 0
    argv: list[str] = field(default_factory=list)


class ServiceProxy(socketserver.ThreadingTCPServer):
    """kube-proxy for one Service port: each connection goes to one Ready pod."""
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, backends: Any) -> None:
        self.backends = backends  # () -> list[(host, port)]
        self._next = 0
        super().__init__(("127.0.0.1", port), _ProxyHandler)

    def pick(self) -> tuple[str, int] | None:
        options = self.backends()
        if not options:
            return None
        self._next += 1
        return options[self._next % len(options)]


class _ProxyHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: ServiceProxy = self.server  # type: ignore[assignment]
        backend = server.pick()
        if backend is None:
            return  # no endpoints: the connection is closed, as a Service without endpoints
        try:
            upstream = socket.create_connection(backend, timeout=5)
        except OSError:
            return
        client = self.request
        try:
            upstream.settimeout(None)
            socks = [client, upstream]
            while True:
                readable, _, _ = select.select(socks, [], [], 1.0)
                for s in readable:
                    data = s.recv(65536)
                    if not data:
                        return
                    (upstream if s is client else client).sendall(data)
        except OSError:
            return
        finally:
            upstream.close()


class _TimedApi:
    """The API client, noting calls slower than a second (the player must not lag)."""

    def __init__(self, kube: KubeApi, slow: list[Any]) -> None:
        self._kube, self._slow = kube, slow

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._kube, name)
        if not callable(attr) or name == "path":
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.monotonic()
            try:
                return attr(*args, **kwargs)
            finally:
                if time.monotonic() - t0 > 1.0:
                    self._slow.append((round(t0, 3), name, str(args[:3])[:120],
                                       round(time.monotonic() - t0, 3)))
        return timed


class StatefulSetPlayer:
    def __init__(self, kube: KubeApi, sts_name: str, root: Path, probe_interval: float = 0.5,
                 tick: float = 0.5, parallel_scale_down: bool = False) -> None:
        self.sts_name = sts_name
        # False: the highest ordinal first, one at a time (OrderedReady, and what the
        # issue asks); True: every pod above the replicas at once, as a real StatefulSet
        # with podManagementPolicy: Parallel (the chart's) does
        self.parallel_scale_down = parallel_scale_down
        self.root = root
        self.probe_interval = probe_interval
        self.tick = tick
        self.pods: dict[int, PodRun] = {}
        self.records: dict[str, list[Any]] = {"prestop": [], "crashes": [], "starts": [],
                                              "stops": [], "ready": [], "slow_api": []}
        self.kube = _TimedApi(kube, self.records["slow_api"])
        self.errors: list[str] = []
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.proxy: ServiceProxy | None = None
        self.current_revision: str | None = None
        self._hooks: set[subprocess.Popen[str]] = set()

    # ------------------------------------------------------------ API reads
    def sts(self) -> dict[str, Any]:
        obj = self.kube.get("apps/v1", "statefulsets", self.sts_name)
        assert obj is not None, f"StatefulSet {self.sts_name} not in the API"
        return obj

    def container(self, sts: dict[str, Any]) -> dict[str, Any]:
        return dict(sts["spec"]["template"]["spec"]["containers"][0])

    def ports(self, sts: dict[str, Any]) -> dict[str, int]:
        return {p["name"]: int(p["containerPort"]) for p in self.container(sts)["ports"]}

    def _object(self, plural: str, name: str, cache: dict[tuple[str, str], Any]) -> Any:
        """A Secret or ConfigMap, read once per pod start (as the kubelet does)."""
        if (plural, name) not in cache:
            obj = self.kube.get("v1", plural, name)
            assert obj is not None, f"{plural}/{name} missing: the pod cannot start"
            cache[plural, name] = obj
        return cache[plural, name]

    def _secret_data(self, name: str, cache: dict[tuple[str, str], Any]) -> dict[str, str]:
        secret = self._object("secrets", name, cache)
        out = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
        return {**out, **{k: str(v) for k, v in (secret.get("stringData") or {}).items()}}

    # ------------------------------------------------------------ a pod's container
    def _materialize(self, sts: dict[str, Any], pod_dir: Path, pvc_dir: Path,
                     cache: dict[tuple[str, str], Any]) -> dict[str, str]:
        """Write the pod's volumes; return mountPath -> local path."""
        spec = sts["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        claim_names = {c["metadata"]["name"] for c in sts["spec"].get("volumeClaimTemplates") or []}
        mounts: dict[str, str] = {}
        for vm in self.container(sts).get("volumeMounts") or []:
            vname, mpath = vm["name"], vm["mountPath"]
            local = pod_dir / "mounts" / vname
            if vname in claim_names:
                pvc_dir.mkdir(parents=True, exist_ok=True)
                mounts[mpath] = str(pvc_dir)
                continue
            vol = volumes[vname]
            if "configMap" in vol or "secret" in vol:
                local.mkdir(parents=True, exist_ok=True)
                if "configMap" in vol:
                    cm = self._object("configmaps", vol["configMap"]["name"], cache)
                    items = {k: str(v) for k, v in (cm.get("data") or {}).items()}
                else:
                    items = self._secret_data(vol["secret"]["secretName"], cache)
                    if vol["secret"].get("items"):
                        items = {i["path"]: items[i["key"]] for i in vol["secret"]["items"]}
                for k, v in items.items():
                    path = local / k
                    path.write_text(v)
                    if "secret" in vol:
                        path.chmod(0o400)
                mounts[mpath] = str(local / vm["subPath"]) if vm.get("subPath") else str(local)
            else:  # emptyDir
                local.mkdir(parents=True, exist_ok=True)
                mounts[mpath] = str(local)
        return mounts

    @staticmethod
    def _translate(value: str, mounts: dict[str, str]) -> str:
        for mpath in sorted(mounts, key=len, reverse=True):
            if value == mpath or value.startswith(mpath.rstrip("/") + "/"):
                return mounts[mpath] + value[len(mpath):]
        return value

    def _env(self, sts: dict[str, Any], ordinal: int, pod_name: str, mounts: dict[str, str],
             conf_text: str, cache: dict[tuple[str, str], Any]) -> dict[str, str]:
        env: dict[str, str] = {}
        meta = {"metadata.name": pod_name, "metadata.namespace": NS}
        for e in self.container(sts).get("env") or []:
            if "value" in e:
                env[e["name"]] = str(e["value"])
            elif "fieldRef" in e.get("valueFrom", {}):
                env[e["name"]] = meta[e["valueFrom"]["fieldRef"]["fieldPath"]]
            elif "secretKeyRef" in e.get("valueFrom", {}):
                ref = e["valueFrom"]["secretKeyRef"]
                env[e["name"]] = self._secret_data(ref["name"], cache)[ref["key"]]
            else:
                raise AssertionError(f"env source not played: {e}")
        a = addr(ordinal)
        # The pod's `localhost` is its own address here.
        if "QQCTL_URL" in env:
            env["QQCTL_URL"] = env["QQCTL_URL"].replace("127.0.0.1", a).replace("localhost", a)
        conf = dict(line.split(" = ", 1) for line in conf_text.splitlines()
                    if " = " in line and not line.lstrip().startswith("#"))
        env.update({
            "HOSTNAME": pod_name,
            "QQ__CLUSTER__STATEFULSET__HOST_TEMPLATE": HOST_TEMPLATE,
            "QQ__LISTENERS__TCP__BIND": a, "QQ__MANAGEMENT__TCP__BIND": a,
            "QQ__PROMETHEUS__TCP__BIND": a, "QQ__CLUSTER__BIND": a,
            # mounted paths named by the configuration file
            "QQ__NODE__DATA_DIR": self._translate(conf["node.data_dir"].strip(), mounts),
            "QQ__CLUSTER__SECRET_FILE": self._translate(conf["cluster.secret_file"].strip(),
                                                        mounts),
        })
        return {**{k: v for k, v in os.environ.items() if not k.startswith("QQ")}, **env}

    def _start(self, sts: dict[str, Any], ordinal: int, restarts: int = 0,
               uid: str | None = None) -> PodRun:
        name = f"{self.sts_name}-{ordinal}"
        pod_dir = self.root / name
        pvc_dir = self.root / f"data-{name}"  # the PVC: outlives the pod
        cache: dict[tuple[str, str], Any] = {}
        mounts = self._materialize(sts, pod_dir, pvc_dir, cache)
        c = self.container(sts)
        args = [self._translate(x, mounts) for x in c.get("args") or []]
        conf_path = args[args.index("--config") + 1]
        env = self._env(sts, ordinal, name, mounts, Path(conf_path).read_text(), cache)
        log_path = self.root / f"{name}.log"
        log = open(log_path, "ab")
        argv = [sys.executable, "-m", "broker", *args]
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        run = PodRun(ordinal, name, revision(sts), uid or "", proc, env, log_path,
                     time.monotonic(), restarts=restarts, argv=argv)
        if uid is None:  # a new pod object (a container restart keeps the pod)
            created = self.kube.create(self._pod_object(sts, name))
            run.uid = created["metadata"]["uid"]
        self.records["starts"].append((round(time.monotonic(), 3), name, run.revision))
        return run

    def _pod_object(self, sts: dict[str, Any], name: str) -> dict[str, Any]:
        tmpl = sts["spec"]["template"]
        labels = {**(tmpl["metadata"].get("labels") or {}),
                  "statefulset.kubernetes.io/pod-name": name,
                  "controller-revision-hash": revision(sts)}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": NS, "labels": labels,
                             "annotations": dict(tmpl["metadata"].get("annotations") or {}),
                             "ownerReferences": [{
                                 "apiVersion": "apps/v1", "kind": "StatefulSet",
                                 "name": self.sts_name, "uid": sts["metadata"]["uid"],
                                 "controller": True, "blockOwnerDeletion": True}]},
                "spec": {**tmpl["spec"], "hostname": name},
                "status": self._pod_status(False, 0)}

    @staticmethod
    def _pod_status(ready: bool, restarts: int) -> dict[str, Any]:
        flag = "True" if ready else "False"
        return {"phase": "Running", "conditions": [
            {"type": "Ready", "status": flag}, {"type": "ContainersReady", "status": flag}],
            "containerStatuses": [{"name": "broker", "ready": ready, "restartCount": restarts}]}

    def _probe(self, run: PodRun) -> bool:
        port = self.ports(self._sts_cache)["management"]
        path = self.container(self._sts_cache)["readinessProbe"]["httpGet"]["path"]
        try:
            with urllib.request.urlopen(f"http://{addr(run.ordinal)}:{port}{path}",
                                        timeout=2) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def _set_ready(self, run: PodRun, ready: bool) -> None:
        if run.ready != ready:
            if ready and not any(r[1] == run.name and r[2] == run.started
                                 for r in self.records["ready"]):
                self.records["ready"].append((round(time.monotonic(), 3), run.name, run.started,
                                              round(time.monotonic() - run.started, 3)))
            run.ready = ready
            self.kube.patch("v1", "pods", run.name,
                            {"status": self._pod_status(ready, run.restarts)})

    def _stop_pod(self, run: PodRun, desired: int, scaled_away: bool) -> None:
        """The kubelet's termination of a pod: preStop, SIGTERM, SIGKILL at the grace end."""
        sts = self._sts_cache
        grace = float(sts["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30))
        run.terminating = True
        self.kube.patch("v1", "pods", run.name, {"metadata": {
            "deletionTimestamp": _now_iso(), "deletionGracePeriodSeconds": int(grace)}})
        t0 = time.monotonic()
        hook = (self.container(sts).get("lifecycle") or {}).get("preStop", {}).get("exec")
        if hook:
            cmd = list(hook["command"])
            assert cmd[0] == "qqctl", cmd
            env = {**run.env, "QQ_DESIRED_REPLICAS": str(desired)}
            proc = subprocess.Popen([QQCTL, *cmd[1:]], env=env, cwd=ROOT, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            self._hooks.add(proc)
            try:
                out, _ = proc.communicate(timeout=grace)
                rc: int | None = proc.returncode
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
                rc = None
            self._hooks.discard(proc)
            self.records["prestop"].append(PreStopRecord(
                run.name, run.ordinal, desired, cmd, round(t0, 3),
                round(time.monotonic() - t0, 3), rc, out))
        left = max(2.0, grace - (time.monotonic() - t0))
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGTERM)
            try:
                run.proc.wait(left)
            except subprocess.TimeoutExpired:
                run.proc.kill()
                run.proc.wait(10)
        self.records["stops"].append((round(time.monotonic(), 3), run.name, run.proc.returncode,
                                      round(time.monotonic() - t0, 3)))
        self.kube.call("DELETE", self.kube.path("v1", "pods", run.name))
        with self._lock:
            self.pods.pop(run.ordinal, None)
        if scaled_away and (sts["spec"].get("persistentVolumeClaimRetentionPolicy") or {}).get(
                "whenScaled") == "Delete":
            shutil.rmtree(self.root / f"data-{run.name}", ignore_errors=True)

    # ------------------------------------------------------------ the controllers
    def start(self) -> StatefulSetPlayer:
        self._sts_cache = self.sts()
        port = self.ports(self._sts_cache)["management"]
        self.proxy = ServiceProxy(port, lambda: self.endpoints("management"))
        for target, name in ((self.proxy.serve_forever, "svc-proxy"),
                             (self._control_loop, "sts-controller"),
                             (self._kubelet_loop, "kubelet")):
            t = threading.Thread(target=self._guard(target), name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _guard(self, fn: Any) -> Any:
        def run(*args: Any) -> None:
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - surfaced by check()
                self.errors.append(f"{threading.current_thread().name}: {exc!r}")
        return run

    def endpoints(self, port_name: str) -> list[tuple[str, int]]:
        port = self.ports(self._sts_cache)[port_name]
        with self._lock:
            return [(addr(r.ordinal), port) for r in sorted(self.pods.values(),
                                                           key=lambda r: r.ordinal)
                    if r.ready and not r.terminating]

    def _kubelet_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                runs = [r for r in self.pods.values() if not r.terminating]
            for run in runs:
                if run.proc.poll() is not None and not run.terminating:
                    # the container died on its own: restartPolicy Always
                    self.records["crashes"].append((round(time.monotonic(), 3), run.name,
                                                    run.proc.returncode))
                    self._set_ready(run, False)
                    new = self._start(self._sts_cache, run.ordinal, run.restarts + 1, run.uid)
                    with self._lock:
                        if self.pods.get(run.ordinal) is run:
                            self.pods[run.ordinal] = new
                    continue
                self._set_ready(run, self._probe(run))
            self._stop.wait(self.probe_interval)

    def _write_status(self, sts: dict[str, Any], update_rev: str) -> None:
        with self._lock:
            runs = list(self.pods.values())
        ready = sum(1 for r in runs if r.ready and not r.terminating)
        updated = sum(1 for r in runs if r.revision == update_rev)
        if self.current_revision is None or (
                updated == len(runs) == int(sts["spec"]["replicas"]) and ready == len(runs)):
            self.current_revision = update_rev
        status = {"replicas": len(runs), "readyReplicas": ready, "availableReplicas": ready,
                  "updatedReplicas": updated, "currentRevision": self.current_revision,
                  "updateRevision": update_rev, "observedGeneration":
                      sts["metadata"].get("generation", 1)}
        if (sts.get("status") or {}) != status:
            self.kube.patch("apps/v1", "statefulsets", self.sts_name, {"status": status})

    def _control_loop(self) -> None:
        while not self._stop.is_set():
            sts = self.sts()
            self._sts_cache = sts
            replicas = int(sts["spec"]["replicas"])
            rev = revision(sts)
            with self._lock:
                runs = dict(self.pods)
            # scale-down: the highest ordinal first, one at a time
            extra = sorted((o for o in runs if o >= replicas), reverse=True)
            if extra and self.parallel_scale_down:
                stoppers = [threading.Thread(target=self._guard(self._stop_pod),
                                             args=(runs[o], replicas, True),
                                             name=f"stop-{o}") for o in extra]
                for t in stoppers:
                    t.start()
                for t in stoppers:
                    t.join()
                self._write_status(sts, rev)
                continue
            if extra:
                self._stop_pod(runs[extra[0]], replicas, scaled_away=True)
                self._write_status(sts, rev)
                continue
            # create missing ordinals (Parallel)
            missing = [o for o in range(replicas) if o not in runs]
            for o in missing:
                run = self._start(sts, o)
                with self._lock:
                    self.pods[o] = run
            if missing:
                self._write_status(sts, rev)
                self._stop.wait(self.tick)
                continue
            # rolling update: every pod Ready first, then the highest outdated ordinal
            all_ready = all(r.ready for r in runs.values())
            outdated = sorted((o for o, r in runs.items() if r.revision != rev), reverse=True)
            if outdated and all_ready:
                self._stop_pod(runs[outdated[0]], replicas, scaled_away=False)
                # the controller recreates it at once (next pass), then waits for Ready
            self._write_status(sts, rev)
            self._stop.wait(self.tick)

    # ------------------------------------------------------------ for tests
    def check(self) -> None:
        assert not self.errors, self.errors

    def rolled_out(self) -> bool:
        """What `kubectl rollout status` waits for."""
        self.check()
        sts = self.sts()
        st = sts.get("status") or {}
        want = int(sts["spec"]["replicas"])
        with self._lock:
            runs = list(self.pods.values())
        return (len(runs) == want and all(r.ready and not r.terminating for r in runs)
                and all(r.revision == revision(sts) for r in runs)
                and st.get("readyReplicas") == want and st.get("updatedReplicas") == want
                and st.get("currentRevision") == st.get("updateRevision"))

    def log(self, ordinal: int) -> str:
        path = self.root / f"{self.sts_name}-{ordinal}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def close(self) -> None:
        """Stop everything, without hooks (the test is over): SIGTERM, then SIGKILL."""
        self._stop.set()
        for hook in list(self._hooks):
            hook.kill()
        for t in self._threads[1:]:
            t.join(60)
        if self.proxy is not None:
            self.proxy.shutdown()
            self.proxy.server_close()
        with self._lock:
            runs = list(self.pods.values())
        for r in runs:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
        for r in runs:
            try:
                r.proc.wait(20)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait(10)
