"""The session's renders and their one batched validation run (deploykit.py)."""

from __future__ import annotations

import pytest

from tests.deploy.deploykit import Deploy, build


@pytest.fixture(scope="session")
def deploy(tmp_path_factory: pytest.TempPathFactory) -> Deploy:
    return build(tmp_path_factory.mktemp("deploy"))
