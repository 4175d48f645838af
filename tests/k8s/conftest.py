"""Fixtures of the Kubernetes tests.

No real API server can run on the development and CI machines (no kubelet, no etcd, no container
runtime), so these tests point the official `kubernetes` client at a local HTTP server (`fakekube.py`)
that serves Pod, Node, PodList, log and watch-event responses in the shapes the real API server sends —
the objects pass `kubernetes-validate --strict` (test_fakekube.py) — including watch streams with BOOKMARK
events, an ERROR event carrying a 410 Gone `Status`, HTTP error statuses and a connection cut mid-event.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.k8s.fakekube import FakeKubeAPI
from triage.k8s.client import KubeClient


@pytest.fixture
def fake_api() -> Iterator[FakeKubeAPI]:
    api = FakeKubeAPI().start()
    try:
        yield api
    finally:
        api.stop()


@pytest.fixture
def kube(fake_api: FakeKubeAPI) -> Iterator[KubeClient]:
    client = KubeClient.from_url(fake_api.url, request_timeout=5.0)
    try:
        yield client
    finally:
        client.close()
