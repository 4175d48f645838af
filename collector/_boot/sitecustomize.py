"""Put first on PYTHONPATH by ``triage-run``: activate the collector in every Python process the wrapped
command starts, even where the package (and so its ``.pth``) is not installed, then run the
``sitecustomize`` this one hides, if there is one."""

import os
import sys


def _activate() -> None:
    if not os.environ.get("TRIAGE_URL", "").strip():
        return
    import importlib

    try:  # the installed package
        importlib.import_module("collector._autoload")
        return
    except ImportError:
        pass
    src = os.environ.get("TRIAGE_COLLECTOR_SRC", "")  # else the copy triage-run itself came from
    if not src:
        return
    import importlib.util

    init = os.path.join(src, "collector", "__init__.py")
    spec = importlib.util.spec_from_file_location(
        "collector", init, submodule_search_locations=[os.path.dirname(init)]
    )
    if spec is None or spec.loader is None:
        return
    mod = importlib.util.module_from_spec(spec)
    sys.modules["collector"] = mod  # only this package becomes importable, not its neighbours
    spec.loader.exec_module(mod)
    importlib.import_module("collector._autoload")


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = mod
    spec.loader.exec_module(mod)


try:
    _activate()
except Exception:
    pass
_chain()
