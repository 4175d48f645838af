"""Which frames are the job's own code (triage/snapshot/frames.py): packages, the standard library and C++
are not; neither is a console-script wrapper pip wrote into a ``bin`` folder (it only calls a package's entry
point, so every block a server or launcher made would otherwise be named at its one line)."""

from __future__ import annotations

import pytest

from triage.snapshot.frames import FrameClassifier


@pytest.mark.parametrize(
    ("filename", "line", "python", "user"),
    [
        ("/workspace/train.py", 57, True, True),
        ("/home/ana/bin/train.py", 12, True, True),  # the user's own script in a bin folder
        ("/usr/local/lib/python3.12/dist-packages/vllm/worker/worker.py", 266, True, False),
        ("/usr/lib/python3.11/threading.py", 975, True, False),
        ("/usr/local/bin/vllm", 8, True, False),  # console scripts: vllm serve, torchrun, accelerate launch
        ("/opt/conda/bin/torchrun", 33, True, False),
        ("??", 0, False, False),
        ("/pytorch/c10/cuda/CUDACachingAllocator.cpp", 1123, False, False),
    ],
)
def test_default_classification(filename: str, line: int, python: bool, user: bool) -> None:
    assert FrameClassifier().classify({"filename": filename, "line": line, "name": "f"}) == (python, user)


def test_a_user_pattern_claims_a_console_script() -> None:
    c = FrameClassifier(user=["*/bin/my-trainer"])
    assert c.classify({"filename": "/usr/local/bin/my-trainer", "line": 8, "name": "<module>"}) == (
        True,
        True,
    )
    site = FrameClassifier().site(
        [
            {
                "filename": "/usr/local/lib/python3.12/dist-packages/vllm/worker/cache_engine.py",
                "line": 84,
                "name": "f",
            },
            {"filename": "/usr/local/bin/vllm", "line": 8, "name": "<module>"},
        ]
    )
    assert site.kind == "library" and site.filename.endswith("cache_engine.py")
