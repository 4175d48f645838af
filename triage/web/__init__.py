"""The ticket pages: Jinja2 templates (autoescaped), one stylesheet, server-side SVG charts. No CDN, no
external fonts, no JavaScript: stacks expand with ``<details>``, filters are a plain GET form."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from triage.units import human

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"


def _pct(v: Any) -> str:
    return f"{float(v):.0%}" if isinstance(v, int | float) else "-"


def _bytes(v: Any) -> str:
    return human(v) if isinstance(v, int | float) and not isinstance(v, bool) else "-"


@functools.cache
def environment() -> Environment:
    """The one Jinja2 environment: autoescaping on for every template, undefined names are errors."""
    from triage.web.views import safe_url, when

    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["human"] = _bytes
    env.filters["pct"] = _pct
    env.filters["when"] = when
    env.filters["safe_url"] = safe_url
    return env


def render(name: str, **context: Any) -> str:
    return environment().get_template(name).render(**context)
