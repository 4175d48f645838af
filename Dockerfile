# syntax=docker/dockerfile:1
# oom-triage: the triage service (`triage serve`) and the crash watcher (`triage watch`) in one slim,
# non-root image. Build stage: a virtual environment with the server and k8s extras. Final stage: that
# environment on a plain python:slim base, without pip, setuptools or any compiler.
#   docker build -t oom-triage:0.1.0 .
#   docker run -p 8080:8080 -v triage-data:/data oom-triage:0.1.0            # triage serve
#   docker run oom-triage:0.1.0 watch --url http://triage:8080               # triage watch

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml ./
COPY collector ./collector
COPY rules ./rules
COPY triage ./triage
# The versions come from pyproject.toml's constraints; the venv's own pip goes once it has done its job.
RUN python -m venv /opt/oom-triage \
    && /opt/oom-triage/bin/pip install --no-cache-dir ".[server,k8s]" \
    && /opt/oom-triage/bin/pip uninstall --yes pip setuptools wheel

FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="oom-triage" \
      org.opencontainers.image.description="OOM triage service for GPU training clusters" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/oom-triage/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TRIAGE_HOST=0.0.0.0 \
    TRIAGE_PORT=8080 \
    TRIAGE_DATA_DIR=/data \
    TRIAGE_DISABLE=1
# A fixed numeric user (Kubernetes' runAsNonRoot checks the number); no build tooling in the final image.
RUN groupadd --system --gid 10001 triage \
    && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin triage \
    && mkdir -p /data \
    && chown 10001:10001 /data \
    && python -m pip uninstall --yes pip setuptools wheel
COPY --from=build /opt/oom-triage /opt/oom-triage
USER 10001:10001
WORKDIR /data
EXPOSE 8080
# `triage watch` serves its health on another port: set TRIAGE_HEALTHCHECK_URL for it.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ.get('TRIAGE_HEALTHCHECK_URL', 'http://127.0.0.1:8080/healthz'), timeout=4)"]
ENTRYPOINT ["triage"]
CMD ["serve"]
