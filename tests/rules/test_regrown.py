"""One block concatenated onto itself from call to call (``self.bank = torch.cat([self.bank, emb])`` in a
service that embeds every request and never trims the bank): the trace holds one live block re-made a
little larger after every pass through the model, each freeing the one before. Without step samples it
is still a leak; the failing request is the next re-make, twice the memory for a moment, which reads as a
step too large if only the request is looked at.

Its neighbours stay as they were: a KV cache re-made inside the forward (``generate()``: the growth ends
with the call) and re-makes with no pass through the model between them (one loop building a tensor).
Traces are built as torch records them (tests/rules/test_kept_calls.py: module-call frames in the forward).
"""

from __future__ import annotations

from typing import Any

from tests.rules.rawsnap import MiB, Trace
from tests.rules.test_kept_calls import line, under, weights
from triage.evidence import regrown_across_calls
from triage.pipeline import diagnose_snapshot
from triage.snapshot.loader import normalise

GIB = 1024 * MiB
ENCODE = line(45, "embed_batch")  # `emb = self.model(**batch).last_hidden_state`
BANK = [line(48, "embed_batch"), line(63, "main")]  # `self.bank = torch.cat([self.bank, emb])`


def service(*, requests: int, inside: bool = False, passes: bool = True) -> dict[str, Any]:
    """``requests`` requests: a forward (activations made and freed), then the bank re-made 64 MiB larger
    and the old one freed. The OOM is the next re-make."""
    t = Trace(0)
    weights(t)
    frames = under(ENCODE, 447) if inside else BANK
    size = 4 * GIB
    bank = t.alloc(size, frames)
    for _ in range(requests):
        if passes:
            acts = [t.alloc(256 * MiB, under(ENCODE, 30)) for _ in range(6)]
            for a in reversed(acts):
                t.free(a)
        size += 64 * MiB
        new = t.alloc(size, frames)
        t.free(bank)
        bank = new
    t.entries.append(
        {"action": "oom", "addr": 0, "size": size + 64 * MiB, "stream": 0, "device_free": 0, "frames": frames}
    )
    return {"segments": t.segments(), "device_traces": [t.entries]}


def message(raw: dict[str, Any]) -> str:
    allocated = sum(seg["allocated_size"] for seg in raw["segments"])
    req = raw["device_traces"][0][-1]["size"]
    total = allocated + req // 2 + 300 * MiB
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req / MiB:.2f} MiB. GPU 0 has a total "
        f"capacity of {total / GIB:.2f} GiB of which {req / 2 / MiB:.2f} MiB is free. Including non-PyTorch "
        f"memory, this process has {(allocated + 300 * MiB) / GIB:.2f} GiB memory in use. Of the allocated "
        f"memory {allocated / GIB:.2f} GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but "
        "unallocated."
    )


def test_a_block_concatenated_onto_itself_between_calls_is_a_leak() -> None:
    raw = service(requests=5)
    d, ev = diagnose_snapshot(normalise(raw), message=message(raw))
    got = regrown_across_calls(ev)
    assert got is not None and got[1] == 6 and got[4] == 5
    assert d.verdict == "tensor_leak", d.headline
    assert d.leak_site is not None and d.leak_site["line"] == 48
    assert any("concatenated onto itself from call to call" in e.fact for e in d.evidence)


def test_a_cache_re_made_inside_the_forward_is_not_read_as_one() -> None:
    raw = service(requests=5, inside=True)
    d, ev = diagnose_snapshot(normalise(raw), message=message(raw))
    assert regrown_across_calls(ev) is None
    assert d.verdict != "tensor_leak", d.headline


def test_re_makes_with_no_pass_through_the_model_between_them_are_one_building_loop() -> None:
    raw = service(requests=5, passes=False)
    d, ev = diagnose_snapshot(normalise(raw), message=message(raw))
    assert regrown_across_calls(ev) is None
    assert d.verdict != "tensor_leak", d.headline


def test_too_few_re_makes_decide_nothing() -> None:
    raw = service(requests=2)
    d, ev = diagnose_snapshot(normalise(raw), message=message(raw))
    assert regrown_across_calls(ev) is None
    assert d.verdict != "tensor_leak", d.headline


LIB = "/usr/lib/python3.11/site-packages/transformers"
MAIN_LINE = line(63, "main")  # `trainer.evaluate()`: every allocation of the run is made under it
GATHER = [
    {"filename": f"{LIB}/trainer_pt_utils.py", "line": 98, "name": "torch_pad_and_concatenate"},
    {"filename": f"{LIB}/trainer.py", "line": 3851, "name": "evaluation_loop"},
    MAIN_LINE,
]
MODEL = [
    {"filename": f"{LIB}/models/llama/modeling_llama.py", "line": 300, "name": "forward"},
    *under(ENCODE, 30)[1:3],  # torch's module-call frames
    {"filename": f"{LIB}/trainer.py", "line": 4100, "name": "prediction_step"},
    MAIN_LINE,
]
LOAD = [{"filename": f"{LIB}/modeling_utils.py", "line": 900, "name": "from_pretrained"}, MAIN_LINE]


def gathered(*, batches: int, inside: bool = False) -> dict[str, Any]:
    """A library's evaluation loop run from one user line: the weights loaded under it, each batch a forward
    (made and freed), then the logits gathered so far re-made larger by the library's ``torch.cat`` and the
    old ones freed. The OOM is the next re-make."""
    t = Trace(0)
    for _ in range(3):
        t.alloc(2 * GIB, LOAD)
    frames = MODEL if inside else GATHER
    size = 1 * GIB
    held = t.alloc(size, frames)
    for _ in range(batches):
        acts = [t.alloc(256 * MiB, MODEL) for _ in range(6)]
        for a in reversed(acts):
            t.free(a)
        size += 512 * MiB
        new = t.alloc(size, frames)
        t.free(held)
        held = new
    t.entries.append(
        {
            "action": "oom",
            "addr": 0,
            "size": size + 512 * MiB,
            "stream": 0,
            "device_free": 0,
            "frames": frames,
        }
    )
    return {"segments": t.segments(), "device_traces": [t.entries]}


def test_a_librarys_gather_re_made_between_calls_is_a_leak_named_at_its_line() -> None:
    """The user's one frame started the whole run, so the gathered logits share their site with the
    weights: the failing request's own stack shows the re-makes, and the line named is the library's."""
    from triage.evidence import regrown_request

    raw = gathered(batches=10)
    d, ev = diagnose_snapshot(normalise(raw), message=message(raw))
    assert regrown_across_calls(ev) is None  # the site holds the weights too
    got = regrown_request(ev)
    assert got is not None and got[0] >= 8 and got[3] >= 8
    assert d.verdict == "tensor_leak", d.headline
    assert d.leak_site is not None and (d.leak_site["line"], d.leak_site["name"]) == (
        98,
        "torch_pad_and_concatenate",
    )
    assert any("eval_accumulation_steps" in a for a in d.actions)


def test_the_same_re_makes_inside_the_forward_are_a_cache_the_call_grows() -> None:
    from triage.evidence import regrown_request

    raw = gathered(batches=10, inside=True)
    d, ev = diagnose_snapshot(normalise(raw), message=message(raw))
    assert regrown_request(ev) is None
    assert d.verdict != "tensor_leak", d.headline
