"""The kustomize base and overlays, and the example training jobs: schema-valid for Kubernetes 1.29 and
1.33 (`kubernetes-validate --strict`), least-privilege RBAC, hardened pods, settings the service accepts."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.deploy.deploykit import VERSIONS, Deploy

SERVER = ("Deployment", "oom-triage")
WATCHER = ("Deployment", "oom-triage-watch")
ALLOWED = {
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "pods/log", "get"),
    ("", "nodes", "get"),
}
_PASSED = re.compile(r"^INFO (\S+) passed for resource (\S+) against version (\d+\.\d+)$")


def _validated(deploy: Deploy, name: str, docs: list[dict[str, Any]]) -> None:
    lines = deploy.validation.for_file(name)
    bad = [line for line in lines if not line.startswith("INFO ")]
    assert not bad, "\n".join(bad)
    passed = {(m.group(2), m.group(3)) for m in map(_PASSED.match, lines) if m}
    wanted = {
        (f"{d['kind'].lower()}/{d['metadata']['name']}", v.rsplit(".", 1)[0]) for d in docs for v in VERSIONS
    }
    assert passed == wanted


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc["spec"]["template"]["spec"]["containers"])


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env") or []}


@pytest.mark.parametrize("target", ["base", "single", "ha"])
def test_render_is_schema_valid(deploy: Deploy, target: str) -> None:
    _validated(deploy, target, deploy.renders[target])


def test_the_validator_is_not_vacuous(deploy: Deploy) -> None:
    lines = deploy.validation.for_file("negative-control")
    assert len(lines) == 2 and all(line.startswith("ERROR ") and "replica" in line for line in lines)
    assert deploy.validation.returncode != 0


def test_examples_are_schema_valid(deploy: Deploy) -> None:
    job = deploy.examples["training-job"]
    _validated(deploy, "training-job", job)
    from tests.deploy.deploykit import pytorchjob_pods

    (ptj,) = deploy.examples["pytorchjob"]
    pods = pytorchjob_pods(ptj)
    assert [p["metadata"]["name"] for p in pods] == ["bert-large-master-0", "bert-large-worker-0"]
    _validated(deploy, "pytorchjob", pods)


@pytest.mark.parametrize("target", ["base", "single", "ha"])
def test_rbac_grants_nothing_beyond_pods_logs_and_nodes(deploy: Deploy, target: str) -> None:
    docs = deploy.renders[target]
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"Role", "RoleBinding"}
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert "aggregationRule" not in role
    granted = set()
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}  # no resourceNames games, no nonResourceURLs
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb)
                    granted.add((group, resource, verb))
    assert granted == ALLOWED
    (binding,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "oom-triage", "namespace": "oom-triage"}
    ]
    accounts = {
        d["spec"]["template"]["spec"]["serviceAccountName"] for d in docs if d["kind"] == "Deployment"
    }
    assert accounts == {"oom-triage"}
    assert all(
        d["metadata"].get("namespace") == "oom-triage"
        for d in docs
        if d["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding")
    )


@pytest.mark.parametrize("target", ["base", "single", "ha"])
def test_pods_are_hardened(deploy: Deploy, target: str) -> None:
    ns = deploy.one(target, "Namespace", "oom-triage")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for name in (SERVER[1], WATCHER[1]):
        dep = deploy.one(target, "Deployment", name)
        pod = dep["spec"]["template"]["spec"]
        sc = pod["securityContext"]
        assert (
            sc["runAsNonRoot"] is True
            and sc["runAsUser"] >= 1000
            and sc["seccompProfile"]["type"] == "RuntimeDefault"
        )
        for c in pod["containers"]:
            csc = c["securityContext"]
            assert csc["readOnlyRootFilesystem"] is True and csc["allowPrivilegeEscalation"] is False
            assert csc["capabilities"]["drop"] == ["ALL"]
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][kind])
            assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert c["readinessProbe"]["httpGet"]["path"] in ("/readyz", "/healthz")
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            assert "/tmp" in mounts  # writable scratch with a read-only root filesystem
        assert (
            dep["spec"]["selector"]["matchLabels"].items()
            <= dep["spec"]["template"]["metadata"]["labels"].items()
        )
    server = deploy.one(target, *SERVER)
    (c,) = _containers(server)
    assert c["args"] == ["serve"] and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert "/data" in {m["mountPath"] for m in c["volumeMounts"]}  # the blob volume
    svc = deploy.one(target, "Service", "oom-triage")
    assert svc["spec"]["selector"].items() <= server["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["ports"][0]["targetPort"] == "http"


def test_single_overlay_runs_sqlite_on_a_volume(deploy: Deploy) -> None:
    server = deploy.one("single", *SERVER)
    assert server["spec"]["replicas"] == 1 and server["spec"]["strategy"] == {"type": "Recreate"}
    volumes = {v["name"]: v for v in server["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"] == {"name": "data", "persistentVolumeClaim": {"claimName": "oom-triage-data"}}
    pvc = deploy.one("single", "PersistentVolumeClaim", "oom-triage-data")
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "TRIAGE_DATABASE_URL" not in _env(_containers(server)[0])
    assert not [d for d in deploy.renders["single"] if d["kind"] == "PodDisruptionBudget"]


def test_ha_overlay_runs_three_replicas_on_postgresql(deploy: Deploy) -> None:
    server = deploy.one("ha", *SERVER)
    assert server["spec"]["replicas"] == 3
    (c,) = _containers(server)
    url = _env(c)["TRIAGE_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    secret = deploy.one("ha", "Secret", url["name"])
    assert secret["stringData"][url["key"]].startswith("postgresql+psycopg://")
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    config = deploy.one("ha", "ConfigMap", "oom-triage-config")["data"]
    assert mounts["blobs"] == config["TRIAGE_BLOB_DIR"]  # every replica sees every bundle
    volumes = {v["name"]: v for v in server["spec"]["template"]["spec"]["volumes"]}
    claim = deploy.one("ha", "PersistentVolumeClaim", volumes["blobs"]["persistentVolumeClaim"]["claimName"])
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    pdb = deploy.one("ha", "PodDisruptionBudget", "oom-triage")
    assert pdb["spec"]["minAvailable"] == 2
    assert (
        pdb["spec"]["selector"]["matchLabels"].items()
        <= server["spec"]["template"]["metadata"]["labels"].items()
    )
    watcher = deploy.one("ha", *WATCHER)
    assert (
        not pdb["spec"]["selector"]["matchLabels"].items()
        <= watcher["spec"]["template"]["metadata"]["labels"].items()
    )


def _settings_env(deploy: Deploy, target: str) -> dict[str, str]:
    config = deploy.one(target, "ConfigMap", "oom-triage-config")["data"]
    return {k: v for k, v in config.items() if k != "TRIAGE_DISABLE"}


@pytest.mark.parametrize("target", ["single", "ha"])
def test_config_is_what_the_service_reads(
    deploy: Deploy, target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydantic import ValidationError

    from triage.service.settings import Settings

    env = _settings_env(deploy, target)
    fields = {f"TRIAGE_{name.upper()}" for name in Settings.model_fields}
    assert set(env) <= fields, set(env) - fields
    (c,) = _containers(deploy.one(target, *SERVER))
    assert set(_env(c)) <= fields
    for key in [k for k in __import__("os").environ if k.startswith("TRIAGE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    tokens = deploy.one(target, "Secret", "oom-triage-tokens")["stringData"]
    # the shipped placeholders are refused in production: an unedited deployment cannot come up open
    monkeypatch.setenv("TRIAGE_INGEST_TOKENS", tokens["ingest-tokens"])
    monkeypatch.setenv("TRIAGE_READ_TOKEN", tokens["read-token"])
    with pytest.raises(ValidationError):
        Settings()
    monkeypatch.setenv("TRIAGE_INGEST_TOKENS", "gpu-east=3f9a1c7e5b2d4f60a8c1e3b5")
    monkeypatch.setenv("TRIAGE_READ_TOKEN", "9c1e3b5a7f2d4e6081a3c5e7")
    s = Settings()
    assert s.env == "production" and s.host == "0.0.0.0" and s.port == 8080
    assert str(s.blobs) == env["TRIAGE_BLOB_DIR"]


def test_watcher_runs_triage_watch_with_its_settings(deploy: Deploy) -> None:
    from triage.cli import build_parser

    watcher = deploy.one("single", *WATCHER)
    assert watcher["spec"]["replicas"] == 1 and watcher["spec"]["strategy"] == {"type": "Recreate"}
    (c,) = _containers(watcher)
    args = build_parser().parse_args(c["args"])
    assert args.command == "watch" and args.url == "http://oom-triage:8080"
    assert _env(c)["TRIAGE_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "oom-triage-tokens",
        "key": "watcher-token",
    }
    assert "TRIAGE_URL" not in _env(c)  # would wake the collector inside the watcher's own process
    config = deploy.one("single", "ConfigMap", "oom-triage-watch")["data"]
    source = (
        __import__("pathlib").Path(__file__).resolve().parents[2] / "triage/commands/watch.py"
    ).read_text()
    for key in config:
        assert key in ("TRIAGE_LOG_LEVEL", "TRIAGE_DISABLE") or f'"{key}"' in source, key
    state_dir = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["state"]
    assert config["TRIAGE_WATCH_STATE_FILE"].startswith(state_dir + "/")
    assert c["livenessProbe"]["httpGet"]["port"] == "health"
    assert {p["name"]: p["containerPort"] for p in c["ports"]}["health"] == int(
        config["TRIAGE_WATCH_HEALTH_PORT"]
    )
    server_args = build_parser().parse_args(_containers(deploy.one("single", *SERVER))[0]["args"])
    assert server_args.command == "serve"


def _pod_specs(deploy: Deploy) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    out = []
    (job,) = deploy.examples["training-job"]
    out.append(("Job", job["spec"]["template"]["metadata"], job["spec"]["template"]["spec"]))
    (ptj,) = deploy.examples["pytorchjob"]
    for role, spec in ptj["spec"]["pytorchReplicaSpecs"].items():
        out.append((f"PyTorchJob/{role}", spec["template"]["metadata"], spec["template"]["spec"]))
    return out


def test_examples_enable_the_collector_by_environment(deploy: Deploy) -> None:
    for where, meta, spec in _pod_specs(deploy):
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert meta["labels"]["oom-triage.io/watch"] == "true" and meta["annotations"]["oom-triage.io/team"]
        (c,) = spec["containers"]
        env = _env(c)
        assert env["TRIAGE_URL"]["value"] == "http://oom-triage.oom-triage.svc:8080", where
        assert env["TRIAGE_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
        for name, path in (
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"),
            ("NODE_NAME", "spec.nodeName"),
        ):
            assert env[name]["valueFrom"]["fieldRef"]["fieldPath"] == path, (where, name)
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
        assert (
            "emptyDir" in volumes[mounts[env["TRIAGE_SPOOL"]["value"]]]
        )  # the spool survives a container restart
        assert "downwardAPI" in volumes[mounts["/etc/podinfo"]]
        assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_examples_pass_the_resource_contract(deploy: Deploy) -> None:
    from triage.contract.load import load_contract_file
    from triage.contract.manifest import audit_documents

    for name, docs in deploy.examples.items():
        report = audit_documents(docs, load_contract_file(), target=name)
        assert {c.status for c in report.checks} == {"pass"}, [
            c.sentence for c in report.checks if c.status != "pass"
        ]


def test_pytorchjob_shape(deploy: Deploy) -> None:
    (ptj,) = deploy.examples["pytorchjob"]
    assert ptj["apiVersion"] == "kubeflow.org/v1" and ptj["kind"] == "PyTorchJob"
    spec = ptj["spec"]
    assert set(spec) <= {"runPolicy", "pytorchReplicaSpecs", "elasticPolicy", "nprocPerNode"}
    assert set(spec["runPolicy"]) <= {
        "cleanPodPolicy",
        "backoffLimit",
        "activeDeadlineSeconds",
        "ttlSecondsAfterFinished",
        "schedulingPolicy",
        "suspend",
        "managedBy",
    }
    assert spec["runPolicy"]["cleanPodPolicy"] in ("None", "Running", "All")
    assert set(spec["pytorchReplicaSpecs"]) == {"Master", "Worker"}
    for role, replica in spec["pytorchReplicaSpecs"].items():
        assert set(replica) <= {"replicas", "restartPolicy", "template"}, role
        assert replica["restartPolicy"] in ("Always", "OnFailure", "Never", "ExitCode")
        assert isinstance(replica["replicas"], int) and replica["replicas"] >= 1
        assert [c["name"] for c in replica["template"]["spec"]["containers"]] == ["pytorch"]
    assert spec["pytorchReplicaSpecs"]["Master"]["replicas"] == 1
