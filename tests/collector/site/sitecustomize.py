"""Test scaffolding for the collector's subprocess tests (put first on PYTHONPATH by conftest.py).

1. With OOMT_FAKE_SCENARIO set, patch the CPU build of torch with the CUDA stand-in (fake_cuda.py).
2. Process the package's real auto-activation ``.pth`` file (copied to OOMT_PTH_DIR) with
   ``site.addsitedir``, exactly as Python does for site-packages at start-up, with TRIAGE_URL set to
   OOMT_TRIAGE_URL when the test gives one.

The stand-in must be in place before the collector looks at torch, hence this order; and TRIAGE_URL is
set only while the ``.pth`` runs, so that a copy of the ``.pth`` installed in the real site-packages (which
runs before any sitecustomize) sees no TRIAGE_URL and stays inert. Child processes (torchrun ranks,
spawned DataLoader workers) inherit the OOMT_* variables and go through the same steps.
"""

import os
import site

if os.environ.get("OOMT_FAKE_SCENARIO"):
    import fake_cuda

    fake_cuda.activate(
        os.environ["OOMT_FAKE_SCENARIO"], fraction=float(os.environ.get("OOMT_FAKE_FRACTION") or 1.0)
    )

_pth_dir = os.environ.get("OOMT_PTH_DIR")
if _pth_dir:
    _url = os.environ.get("OOMT_TRIAGE_URL")
    if _url is not None:
        os.environ["TRIAGE_URL"] = _url
    try:
        site.addsitedir(_pth_dir)
    finally:
        os.environ.pop("TRIAGE_URL", None)
