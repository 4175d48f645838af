"""The watcher against the fake API server: terminations → bundles, resume, 410, errors, dedupe."""

from __future__ import annotations

import gzip
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.fakekube import FakeKubeAPI, WatchScript, bookmark, event, expired
from tests.k8s.k8sobjects import (
    CUDA_OOM_LOG,
    NS,
    PLAIN_ERROR_LOG,
    SHM_LOG,
    container,
    container_status,
    node,
    pod,
    running,
    shm_volume,
    terminated,
    waiting,
    with_status,
)
from triage.k8s import termination_incident_id
from triage.k8s.client import KubeClient
from triage.k8s.watcher import IngestClient, Termination, WatchConfig, Watcher, WatchState, terminations
from triage.schemas import IncidentBundle

GiB = 1024**3


class Ingest:
    """The service's ingest contract in miniature: 202 for a new incident_id, 200 for a repeat; scripted
    failures first."""

    def __init__(self, failures: list[int | Exception] | None = None) -> None:
        self.failures = list(failures or [])
        self.bundles: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []

    def __call__(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
        self.requests.append((url, headers))
        if self.failures:
            failure = self.failures.pop(0)
            if isinstance(failure, Exception):
                raise failure
            return failure, b'{"detail": "scripted"}'
        bundle = json.loads(gzip.decompress(body))
        IncidentBundle.model_validate(bundle)
        iid = bundle["incident_id"]
        status = 200 if iid in self.bundles else 202
        self.bundles.setdefault(iid, bundle)
        return status, json.dumps({"incident_id": iid, "status": "queued"}).encode()


def _watcher(kube: KubeClient, ingest: Ingest, **config: Any) -> Watcher:
    client = IngestClient(
        "http://triage.test", "s3cret-token-0123456789", transport=ingest, sleep=lambda s: None
    )
    return Watcher(kube, client, WatchConfig(backoff_s=0.001, max_backoff_s=0.002, **config))


def _oom_killed(name: str = "oom-pod", **kw: Any) -> dict[str, Any]:
    return pod(
        name,
        phase="Failed",
        statuses=[container_status(state=terminated("OOMKilled", 137), restart_count=0)],
        **kw,
    )


def _cuda_crashed(name: str = "cuda-pod") -> dict[str, Any]:
    return pod(
        name,
        phase="Failed",
        statuses=[container_status(state=terminated("Error", 1, container_id="containerd://" + "d4" * 32))],
        owner=("batch/v1", "Job", "vit-finetune"),
    )


def test_oom_killed_pod_gives_one_host_oom_incident(fake_api: FakeKubeAPI, kube: KubeClient) -> None:
    p = fake_api.add_pod(_oom_killed())
    fake_api.add_node(node())
    fake_api.set_log(NS, "oom-pod", "trainer", "step 10 loss 2.1\nstep 11 loss 2.0\n")
    ingest = Ingest()
    w = _watcher(kube, ingest)
    w.run_once()
    (bundle,) = ingest.bundles.values()
    assert bundle["kind"] == "host_oom"
    assert bundle["incident_id"] == termination_incident_id(NS, p["metadata"]["uid"], "trainer", 0)
    assert bundle["error"]["exit_code"] == 137 and "OOMKilled" in bundle["error"]["message"]
    assert bundle["host"]["cgroup"] == {"memory_limit_bytes": 960 * GiB, "oom_kill_count": 1}
    assert bundle["host"]["shm_total_bytes"] == 64 * GiB
    assert bundle["k8s"]["shm_medium"] == "Memory" and bundle["k8s"]["memory_limit_bytes"] == 960 * GiB
    assert bundle["k8s"]["termination"]["reason"] == "OOMKilled"
    assert bundle["k8s"]["log_tail"].startswith("step 10")
    assert bundle["workload"]["restart_count"] == 0 and bundle["workload"]["job"] == "llm-pretrain"
    assert bundle["occurred_at"] == "2025-05-01T12:34:56Z"
    url, headers = ingest.requests[0]
    assert url == "http://triage.test/api/v1/incidents"
    assert (
        headers["Authorization"] == "Bearer s3cret-token-0123456789" and headers["Content-Encoding"] == "gzip"
    )
    # the same pod seen again (another list, a restarted watcher with no memory): no new incident
    w.run_once()
    _watcher(kube, ingest).run_once()
    assert len(ingest.bundles) == 1 and w.stats.posted == 1


def test_cuda_oom_in_the_log_gives_a_cuda_oom_incident(fake_api: FakeKubeAPI, kube: KubeClient) -> None:
    fake_api.add_pod(_cuda_crashed())
    fake_api.add_node(node())
    fake_api.set_log(NS, "cuda-pod", "trainer", CUDA_OOM_LOG)
    ingest = Ingest()
    _watcher(kube, ingest).run_once()
    (bundle,) = ingest.bundles.values()
    assert bundle["kind"] == "cuda_oom" and bundle["error"]["exit_code"] == 1
    assert bundle["error"]["type"] == "torch.OutOfMemoryError"
    assert bundle["error"]["message"].startswith("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert "[rank0]" in bundle["error"]["traceback"]
    assert bundle["workload"]["rank"] == 0 and bundle["workload"]["job"] == "vit-finetune"
    assert bundle["device"]["declared_total_bytes"] == 81920 * 1024**2
    (q,) = fake_api.calls("/log")
    assert "previous" not in q  # the terminated instance is the current one
    from triage.pipeline import diagnose_bundle

    _, ev = diagnose_bundle(bundle)
    assert ev.kind == "cuda_oom" and ev.request_bytes == 2 * GiB


def test_shm_error_plain_error_and_clean_exits(fake_api: FakeKubeAPI, kube: KubeClient) -> None:
    restarted = pod(
        "shm-pod",
        restart_policy="OnFailure",
        statuses=[container_status(state=running(), last_state=terminated("Error", 1), restart_count=3)],
    )
    fake_api.add_pod(restarted)
    fake_api.set_log(NS, "shm-pod", "trainer", SHM_LOG, previous=True)
    fake_api.add_pod(
        pod("import-error", phase="Failed", statuses=[container_status(state=terminated("Error", 1))])
    )
    fake_api.set_log(NS, "import-error", "trainer", PLAIN_ERROR_LOG)
    fake_api.add_pod(
        pod("done", phase="Succeeded", statuses=[container_status(state=terminated("Completed", 0))])
    )
    fake_api.add_pod(
        pod("deleted", deleting=True, statuses=[container_status(state=terminated("Error", 137))])
    )
    fake_api.add_pod(  # no GPU: not a training container
        pod(
            "web",
            containers=[container(gpus=None)],
            statuses=[container_status(state=terminated("OOMKilled", 137))],
        )
    )
    ingest = Ingest()
    w = _watcher(kube, ingest)
    w.run_once()
    (bundle,) = ingest.bundles.values()
    assert bundle["kind"] == "shm_exhausted" and bundle["workload"]["restart_count"] == 2
    assert bundle["workload"]["pod"] == "shm-pod"
    assert w.stats.not_oom == 1
    logs = {tuple(q["previous"]) if "previous" in q else () for q in fake_api.calls("/log")}
    assert logs == {("true",), ()}
    assert len(fake_api.calls("/log")) == 2  # no log read for the clean exit, the deletion or the web pod


def test_collector_incident_is_not_duplicated(fake_api: FakeKubeAPI, kube: KubeClient) -> None:
    fake_api.add_pod(_cuda_crashed())
    log = CUDA_OOM_LOG + (
        "oom-triage: incident 5b0f0c4e-1a2b-4c3d-8e9f-0a1b2c3d4e5f: verdict workload_too_large; "
        "ticket http://triage/tickets/7\n"
    )
    fake_api.set_log(NS, "cuda-pod", "trainer", log)
    ingest = Ingest()
    w = _watcher(kube, ingest)
    w.run_once()
    assert ingest.bundles == {} and w.stats.left_to_collector == 1
    # a collector that could not deliver leaves the crash to the watcher
    fake_api.set_log(
        NS,
        "cuda-pod",
        "trainer",
        CUDA_OOM_LOG + "oom-triage: incident 5b0f0c4e-1a2b-4c3d-8e9f-"
        "0a1b2c3d4e5f refused by the service (HTTP 401: bad token); kept in /spool/rejected/\n",
    )
    _watcher(kube, ingest).run_once()
    assert len(ingest.bundles) == 1


def test_restart_numbering_is_stable_across_state_and_last_state() -> None:
    """One termination keeps its id while it moves from state to lastState (CrashLoopBackOff, restart)."""
    base = pod("crash", restart_policy="OnFailure")
    term = terminated("OOMKilled", 137, container_id="containerd://" + "e5" * 32)
    seen_as = [
        with_status(base, phase="Running", statuses=[container_status(state=term, restart_count=1)], rv="2"),
        with_status(
            base,
            phase="Running",
            statuses=[container_status(state=waiting(), last_state=term, restart_count=1)],
            rv="3",
        ),
        with_status(
            base,
            phase="Running",
            statuses=[container_status(state=running(), last_state=term, restart_count=2)],
            rv="4",
        ),
    ]
    ids = set()
    for p in seen_as:
        (t,) = terminations(p, ["trainer"])
        ids.add((t.restart, t.incident_id, t.container_id))
    assert len(ids) == 1 and next(iter(ids))[0] == 1


def test_watch_resumes_from_bookmarks_and_relists_after_410(fake_api: FakeKubeAPI, kube: KubeClient) -> None:
    fake_api.add_node(node())
    fake_api.list_rv = "100"
    healthy = fake_api.add_pod(pod("llm-0", resource_version="90"))
    oom = with_status(
        healthy,
        phase="Failed",
        statuses=[container_status(state=terminated("OOMKilled", 137), restart_count=0)],
        rv="110",
    )
    cuda = _cuda_crashed("vit-0")
    cuda["metadata"]["resourceVersion"] = "260"
    fake_api.set_log(NS, "llm-0", "trainer", "loading shards\n")
    fake_api.set_log(NS, "vit-0", "trainer", CUDA_OOM_LOG)
    stop = threading.Event()

    def after_first_stream() -> None:
        # while the watcher was away, both crashes happened and the version was compacted: the relist
        # shows the OOMKilled pod again (already posted) and the new CUDA crash
        fake_api.add_pod(oom)
        fake_api.add_pod(cuda)
        fake_api.list_rv = "300"

    fake_api.script(
        WatchScript(events=[event("MODIFIED", oom), bookmark("120")]),  # ends: the server's timeout
        WatchScript(events=[event("MODIFIED", oom), expired("120")]),  # the same event again, then 410
        WatchScript(http_status=500),  # after the relist: the API server hiccups
        WatchScript(events=[bookmark("310"), event("MODIFIED", cuda)], cut=True),  # cut mid-event
        WatchScript(events=[bookmark("320")]),
    )
    fake_api.on_watches_exhausted = stop.set
    ingest = Ingest()
    w = _watcher(kube, ingest, watch_timeout_s=7)
    real_watch = w.watch_once

    def watch_once(s: threading.Event | None = None) -> int:
        if w.stats.watches == 1:  # before the second watch request
            after_first_stream()
        return real_watch(s)

    w.watch_once = watch_once  # type: ignore[method-assign]
    w.run(stop)
    kinds = sorted(b["kind"] for b in ingest.bundles.values())
    assert kinds == ["cuda_oom", "host_oom"]
    assert len(ingest.requests) == 2  # nothing posted twice, not even a repeat the service would ignore
    watch_rvs = [q["resourceVersion"][0] for q in fake_api.watch_calls()]
    assert watch_rvs == ["100", "120", "300", "300", "310", "320"]
    assert all(
        q["allowWatchBookmarks"] == ["true"] and q["timeoutSeconds"] == ["7"] for q in fake_api.watch_calls()
    )
    assert (
        len(fake_api.list_calls()) == 2
    )  # the first list and the relist after 410 (not after 500 or the cut)
    assert w.stats.expired == 1 and w.stats.errors == 2 and w.stats.bookmarks >= 3
    assert w.state.resource_version == "320"


def test_http_410_on_the_watch_request_relists(fake_api: FakeKubeAPI, kube: KubeClient) -> None:
    stop = threading.Event()
    fake_api.script(WatchScript(http_status=410))
    fake_api.on_watches_exhausted = stop.set
    w = _watcher(kube, Ingest())
    w.state.resource_version = "5"  # as if resumed from a state file
    w.run(stop)
    assert w.stats.expired == 1 and len(fake_api.list_calls()) == 1
    assert [q["resourceVersion"][0] for q in fake_api.watch_calls()] == ["5", "100"]


def test_state_file_resumes_and_keeps_undelivered_work(
    tmp_path: Path, fake_api: FakeKubeAPI, kube: KubeClient
) -> None:
    state_file = tmp_path / "state" / "watch.json"
    fake_api.add_pod(_oom_killed())
    fake_api.list_rv = "555"
    down = Ingest(failures=[503, 503, ConnectionRefusedError("refused"), 503, 503])
    w = _watcher(kube, down, state_file=state_file)
    w.run_once()
    assert down.bundles == {} and len(down.requests) == 5
    saved = json.loads(state_file.read_text())
    assert saved["resource_version"] == "555" and len(saved["pending"]) == 1
    # restarted watcher: undelivered work forces a relist; the service is back
    up = Ingest()
    stop = threading.Event()
    fake_api.on_watches_exhausted = stop.set
    w2 = _watcher(kube, up, state_file=state_file)
    w2.run(stop)
    assert len(up.bundles) == 1 and w2.stats.posted == 1
    assert len(fake_api.list_calls()) == 2
    saved = json.loads(state_file.read_text())
    assert saved["pending"] == {} and len(saved["seen"]) == 2  # key and containerID
    # a third start: resumes the watch from the saved version, no list, nothing posted again
    fake_api.requests.clear()
    stop3 = threading.Event()
    fake_api.on_watches_exhausted = stop3.set
    w3 = _watcher(kube, up, state_file=state_file)
    w3.run(stop3)
    assert fake_api.list_calls() == [] and [q["resourceVersion"][0] for q in fake_api.watch_calls()] == [
        "555"
    ]
    assert len(up.requests) == 1


def test_rejected_bundles_are_dropped_not_retried(fake_api: FakeKubeAPI, kube: KubeClient) -> None:
    fake_api.add_pod(_oom_killed())
    ingest = Ingest(failures=[401])
    w = _watcher(kube, ingest)
    w.run_once()
    assert w.stats.rejected == 1 and w.state.pending == {} and len(ingest.requests) == 1
    w.run_once()
    assert len(ingest.requests) == 1


def test_unreadable_log_is_retried(fake_api: FakeKubeAPI, kube: KubeClient) -> None:
    fake_api.add_pod(_cuda_crashed())
    fake_api.set_log(NS, "cuda-pod", "trainer", CUDA_OOM_LOG)
    fake_api.fail[f"/api/v1/namespaces/{NS}/pods/cuda-pod/log"] = 503
    ingest = Ingest()
    w = _watcher(kube, ingest)
    w.sync()
    assert ingest.bundles == {} and len(w.state.pending) == 1
    w.retry_pending()
    assert len(ingest.bundles) == 1 and w.state.pending == {}


def test_termination_message_stands_in_for_a_lost_log(fake_api: FakeKubeAPI, kube: KubeClient) -> None:
    tail = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which 3.06 MiB is free."
    p = pod(
        "gone-log",
        containers=[container(policy="FallbackToLogsOnError")],
        statuses=[container_status(state=terminated("Error", 1, message=tail))],
    )
    fake_api.add_pod(p)  # no log recorded: the kubelet answers 400
    ingest = Ingest()
    _watcher(kube, ingest).run_once()
    (bundle,) = ingest.bundles.values()
    assert bundle["kind"] == "cuda_oom" and bundle["k8s"]["termination"]["message"] == tail


def test_selector_namespace_and_container_names(fake_api: FakeKubeAPI, kube: KubeClient) -> None:
    cpu_only = pod(
        "cpu-train",
        containers=[container("worker", gpus=None), container("sidecar", gpus=None, shm_volume=None)],
        volumes=[shm_volume()],
        labels={"oom-triage.io/watch": "true"},
        statuses=[
            container_status("worker", state=terminated("OOMKilled", 137)),
            container_status(
                "sidecar", state=terminated("OOMKilled", 137), container_id="containerd://" + "f6" * 32
            ),
        ],
    )
    fake_api.add_pod(cpu_only)
    fake_api.add_pod(_oom_killed("unlabelled"))
    ingest = Ingest()
    _watcher(
        kube,
        ingest,
        label_selector="oom-triage.io/watch=true",
        namespace=NS,
        containers=frozenset({"worker"}),
    ).run_once()
    (bundle,) = ingest.bundles.values()
    assert bundle["workload"]["container"] == "worker" and bundle["workload"]["pod"] == "cpu-train"
    (q,) = fake_api.list_calls()
    assert q["labelSelector"] == ["oom-triage.io/watch=true"]
    assert fake_api.requests[0][0] == f"/api/v1/namespaces/{NS}/pods"


def test_state_roundtrip(tmp_path: Path) -> None:
    s = WatchState(resource_version="9")
    s.remember("a", None, "cid:x")
    s.pending["b"] = {"incident_id": "x"}
    path = tmp_path / "s.json"
    s.save(path)
    t = WatchState.load(path)
    assert (t.resource_version, list(t.seen), t.pending) == ("9", ["a", "cid:x"], {"b": {"incident_id": "x"}})
    path.write_text("{not json")
    assert WatchState.load(path).resource_version == ""


@pytest.mark.parametrize(
    ("reason", "code", "deleting", "expected"),
    [
        ("OOMKilled", 137, False, "host_oom"),
        ("Error", 137, False, "host_oom"),
        ("Error", 137, True, None),
        ("Error", 1, False, "log"),
        ("Error", 143, False, None),
        ("Completed", 0, False, None),
    ],
)
def test_classify(reason: str, code: int, deleting: bool, expected: str | None) -> None:
    from triage.k8s.watcher import classify

    t = Termination(NS, "p", "u", "c", 0, True, reason, code, None, None, None, None, None)
    assert classify(t, pod("p", deleting=deleting)) == expected


def test_long_lines_filling_the_byte_limit_reread_the_end(fake_api: FakeKubeAPI, kube: KubeClient) -> None:
    fake_api.add_pod(_cuda_crashed())
    progress = "".join(f"Epoch 1: {i:5d}/9999 " + "#" * 80 + "\n" for i in range(600))
    fake_api.set_log(NS, "cuda-pod", "trainer", progress + CUDA_OOM_LOG)
    ingest = Ingest()
    _watcher(kube, ingest, log_limit_bytes=8000).run_once()
    (bundle,) = ingest.bundles.values()
    assert bundle["kind"] == "cuda_oom"
    assert [q["tailLines"][0] for q in fake_api.calls("/log")] == ["500", "40"]


def test_a_pod_that_breaks_the_bundle_builder_does_not_stop_the_others(
    fake_api: FakeKubeAPI, kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    import triage.k8s.watcher as watcher

    fake_api.add_pod(_oom_killed("a-odd"))
    fake_api.add_pod(_oom_killed("b-fine"))
    real = watcher.build_bundle

    def fragile(pod: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        if pod["metadata"]["name"] == "a-odd":
            raise KeyError("something the code did not expect")
        return real(pod, *args, **kwargs)

    monkeypatch.setattr(watcher, "build_bundle", fragile)
    ingest = Ingest()
    w = _watcher(kube, ingest)
    w.run_once()
    assert [b["workload"]["pod"] for b in ingest.bundles.values()] == ["b-fine"] and w.stats.errors == 1
    w.run_once()  # not retried forever
    assert w.stats.errors == 1


def test_empty_watches_back_off_instead_of_spinning(fake_api: FakeKubeAPI, kube: KubeClient) -> None:
    stop = threading.Event()
    fake_api.script(WatchScript(events=[]), WatchScript(events=[]), WatchScript(events=[bookmark("101")]))
    fake_api.on_watches_exhausted = stop.set
    w = _watcher(kube, Ingest())
    w.run(stop)
    assert [q["resourceVersion"][0] for q in fake_api.watch_calls()] == ["100", "100", "100", "101"]
    assert w.failures >= 1  # the last, empty one (stop was set in it)


def test_health_endpoint(kube: KubeClient) -> None:
    import urllib.error
    import urllib.request

    from triage.k8s.watcher import serve_health

    w = _watcher(kube, Ingest())
    server = serve_health(w, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.server_address[1]}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = json.loads(resp.read())
        assert resp.status == 200 and body["status"] == "ok" and body["pending"] == 0
        w.last_progress -= 10_000  # no progress for hours: the liveness probe restarts the container
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(url, timeout=5)
        assert info.value.code == 503
        info.value.close()
    finally:
        server.shutdown()
        server.server_close()
