"""Kubernetes: pod/node enrichment of incident bundles and the crash watcher (`triage watch`).

Nothing here imports the `kubernetes` client at module level: `triage.k8s.client` imports it when a client
is built (it is in the `k8s` extra). `enrich` and `watcher` work on the API's JSON objects as plain dicts,
exactly as the API server sends them (camelCase keys, quantities as strings).

- `triage.k8s.client`   config loading (in-cluster, kubeconfig, or a URL) and `KubeClient`, a thin wrapper of
                        the official client's `CoreV1Api` that returns raw JSON
- `triage.k8s.enrich`   `pod_facts(pod, node)` and `enrich_bundle(bundle, client)`: limits, MIG, /dev/shm,
                        GPU feature discovery labels, owner, team, in the bundle's vocabulary
- `triage.k8s.watcher`  `Watcher`: terminated training containers → incident bundles → the service
"""

from __future__ import annotations

import uuid

# The namespace of the deterministic incident ids (uuid5) of container terminations. Never change it:
# ids already stored would stop matching the ones computed again for the same termination.
TERMINATION_NAMESPACE = uuid.uuid5(
    uuid.NAMESPACE_URL, "https://oom-triage.io/incident/k8s-container-termination"
)


def termination_incident_id(namespace: str, pod_uid: str, container: str, restart_count: int) -> str:
    """The incident id of one container instance's termination: uuid5 of ``namespace/pod_uid/container/N``.

    ``restart_count`` is the kubelet's restartCount *of the instance that terminated*: the container status'
    ``restartCount`` while the termination is in ``state.terminated``, one less once it has moved to
    ``lastState.terminated`` after a restart. Every source that sees the same termination (a re-listed pod,
    a second watcher, the collector when it knows the pod uid and the restart) computes the same id, and the
    service answers a repeat with 200 and stores nothing.
    """
    name = f"{namespace}/{pod_uid}/{container}/{int(restart_count)}"
    return str(uuid.uuid5(TERMINATION_NAMESPACE, name))


__all__ = ["TERMINATION_NAMESPACE", "termination_incident_id"]
