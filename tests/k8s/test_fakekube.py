"""The recorded-shape objects are schema-valid, and the client reads them through the official client."""

from __future__ import annotations

import pytest

from tests.k8s.fakekube import FakeKubeAPI, WatchScript, bookmark, event, expired
from tests.k8s.k8sobjects import (
    MIG_LABELS,
    PLAIN_ERROR_LOG,
    container,
    container_status,
    node,
    pod,
    running,
    shm_volume,
    terminated,
    waiting,
)
from triage.k8s.client import KubeClient, KubeError, as_kube_client, load_client


def _all_objects() -> list[dict]:
    return [
        node(),
        node("gpu-mig-01", labels={**MIG_LABELS, "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}),
        pod("llm-pretrain-abcde"),
        pod(
            "oom-pod",
            statuses=[container_status(state=terminated("OOMKilled", 137), restart_count=0)],
            phase="Failed",
        ),
        pod(
            "crashloop",
            restart_policy="OnFailure",
            statuses=[
                container_status(
                    state=waiting(), last_state=terminated("Error", 1, message="boom"), restart_count=2
                )
            ],
        ),
        pod(
            "mig",
            containers=[container(gpus=None, mig="1g.10gb", memory="64Gi", cpu="4")],
            volumes=[shm_volume(size_limit=None)],
            owner=("kubeflow.org/v1", "PyTorchJob", "bert"),
        ),
        pod(
            "bare",
            containers=[container(shm_volume=None, memory=None)],
            volumes=[],
            owner=None,
            deleting=True,
        ),
        pod("running", statuses=[container_status(state=running())]),
    ]


@pytest.mark.parametrize("version", ["1.29.0", "1.33.0"])
def test_recorded_objects_are_schema_valid(version: str) -> None:
    import kubernetes_validate

    for obj in _all_objects():
        kubernetes_validate.validate(obj, version, strict=True)  # raises ValidationError with the path


def test_client_reads_pods_nodes_and_logs(fake_api: FakeKubeAPI, kube: KubeClient) -> None:
    p = fake_api.add_pod(pod("trainer-0"))
    fake_api.add_node(node())
    fake_api.set_log("ml-research", "trainer-0", "trainer", PLAIN_ERROR_LOG, previous=True)
    assert kube.get_pod("ml-research", "trainer-0") == p
    assert kube.get_pod("ml-research", "nope") is None
    n = kube.get_node("gpu-a100-07")
    assert n is not None and n["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert kube.get_node("gpu-a100-07") == n  # cached: one request
    assert len(fake_api.calls("/nodes/")) == 1
    assert kube.get_node("ghost") is None
    assert kube.pod_log("ml-research", "trainer-0", "trainer", previous=True, tail_lines=2) == "".join(
        PLAIN_ERROR_LOG.splitlines(keepends=True)[-2:]
    )
    (q,) = fake_api.calls("/log")
    assert q["container"] == ["trainer"] and q["previous"] == ["true"] and q["tailLines"] == ["2"]
    # the kubelet's 400 for a previous instance that does not exist
    assert kube.pod_log("ml-research", "trainer-0", "trainer", previous=False) is None


def test_forbidden_and_server_errors_become_kube_errors(fake_api: FakeKubeAPI, kube: KubeClient) -> None:
    fake_api.forbidden_nodes.add("locked")
    with pytest.raises(KubeError) as info:
        kube.get_node("locked")
    assert info.value.status == 403 and "forbidden" in info.value.reason
    fake_api.fail["/api/v1/namespaces/ml-research/pods/x"] = 500
    with pytest.raises(KubeError) as info:
        kube.get_pod("ml-research", "x")
    assert info.value.status == 500
    url = fake_api.url
    fake_api.stop()
    gone = KubeClient.from_url(url, request_timeout=2.0)
    with pytest.raises(KubeError) as info:  # nothing listens any more: no response at all
        gone.get_pod("ml-research", "x")
    assert info.value.status == 0


def test_list_pages_with_continue_tokens(fake_api: FakeKubeAPI, kube: KubeClient) -> None:
    for i in range(5):
        fake_api.add_pod(pod(f"p{i}", labels={"app": "train"}))
    fake_api.add_pod(pod("other", labels={"app": "web"}))
    fake_api.list_rv = "4242"
    items, rv = kube.list_pods(label_selector="app=train", page_size=2)
    assert [p["metadata"]["name"] for p in items] == [f"p{i}" for i in range(5)]
    assert rv == "4242"
    calls = fake_api.list_calls()
    assert len(calls) == 3 and calls[1]["continue"] == ["2"] and calls[0]["labelSelector"] == ["app=train"]
    items, _ = kube.list_pods(namespace="ml-research")
    assert len(items) == 6
    assert fake_api.requests[-1][0] == "/api/v1/namespaces/ml-research/pods"


def test_watch_stream_yields_events_and_reports_expiry(fake_api: FakeKubeAPI, kube: KubeClient) -> None:
    p = pod("w")
    fake_api.script(
        WatchScript(events=[event("ADDED", p), bookmark("120"), expired("120")]),
        WatchScript(http_status=410),
        WatchScript(events=[event("MODIFIED", p), event("MODIFIED", p)], cut=True),
    )
    events = list(kube.watch_pods(resource_version="100", label_selector="app=x", timeout_seconds=5))
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK", "ERROR"]
    assert events[0]["object"] == p and events[2]["object"]["code"] == 410
    (q,) = fake_api.watch_calls()
    assert q["resourceVersion"] == ["100"] and q["allowWatchBookmarks"] == ["true"]
    assert q["timeoutSeconds"] == ["5"] and q["labelSelector"] == ["app=x"]
    with pytest.raises(KubeError) as info:
        list(kube.watch_pods(resource_version="120"))
    assert info.value.gone
    got = []
    with pytest.raises(KubeError) as info:
        for e in kube.watch_pods(resource_version="120"):
            got.append(e)
    assert len(got) == 1 and info.value.status == 0


def test_client_construction(fake_api: FakeKubeAPI) -> None:
    from kubernetes.client import ApiClient, Configuration, CoreV1Api

    fake_api.add_pod(pod("a"))
    client = load_client(api_url=fake_api.url)
    assert client.get_pod("ml-research", "a") is not None
    cfg = Configuration()
    cfg.host = fake_api.url
    api = ApiClient(cfg)
    assert as_kube_client(CoreV1Api(api)).get_pod("ml-research", "a") is not None
    assert as_kube_client(api).get_pod("ml-research", "a") is not None
    assert as_kube_client(client) is client
    with pytest.raises(TypeError):
        as_kube_client(object())
