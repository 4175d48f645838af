"""The triage service: FastAPI app, settings, dependencies, one router per domain (docs/service.md).

`create_app` and `Settings` are imported lazily, so that the analysis child process (which imports only
`triage.service.analysis`) does not load the web stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from triage.service.app import create_app
    from triage.service.settings import Settings

__all__ = ["Settings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from triage.service.app import create_app

        return create_app
    if name == "Settings":
        from triage.service.settings import Settings

        return Settings
    raise AttributeError(f"module 'triage.service' has no attribute {name!r}")
