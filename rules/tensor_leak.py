"""tensor_leak: live memory that outlives the training steps that made it.

Allocator behaviour relied on: in a healthy loop, everything a step allocates for its forward and
backward pass (activations, temporaries, the loss) is freed by the time the next step reaches the
same point; what stays is fixed (weights, gradients, optimizer state), so live memory after every step
returns to the same floor. A reference kept across steps — a loss appended to a list without
``.item()``, outputs collected for metrics, a cache that never evicts — keeps its blocks
``active_allocated``; the floor rises step after step until a request no longer fits.

Two independent signals, either of which can carry the verdict:
1. The allocator trace (``device_traces``): a site whose *surviving* blocks were allocated in different
   steps. Between two survivors, live memory fell below its level from before the first one and far
   more was allocated and freed than was kept (a whole forward/backward came and went). Surviving
   blocks of one forward pass (activations saved for backward, layer after layer from the same line)
   do not pass this test, because their net growth is a large part of what was allocated. A site whose
   allocations in the trace were mostly freed again is a bounded cache or a rolling buffer, not a leak.
2. The per-step timeline (the collector samples live memory after every optimizer step): a floor that
   rises in most steps and keeps rising to the end. A floor that rose and then flattened is a bounded
   cache or warm-up; it clears the leak.
3. Forward passes kept alive (``triage.evidence.kept_graphs``): a call of the model saves its activations
   for the backward; if its output is kept (a validation loop without ``torch.no_grad()`` appending its
   outputs, a buffer of policy outputs), every saved activation stays alive with it, and no optimizer
   step passes between the calls. When several earlier calls of one line are still held, the same line
   held less than half as many at once in the steps the trace shows (or had not run in them), and the
   earlier steps needed less than this moment by no more than what those calls hold, the line that
   calls the model is the leak. A step that runs the model on several views or micro-batches before one
   backward holds its calls too, at every step; when the trace begins with the kept calls and cannot
   tell, the leak stays a lead. When calls are most of what survives across steps, they name the site.
   Calls held after an optimizer step that came after them (torch/optim's frames on an allocation) are
   kept whatever the line did before: their step's backward and update were over (a recurrent hidden
   state carried into the next step without ``.detach()``). And when the call under way is larger than
   any training step, kept calls that are most of this moment's memory, without which it fitted, convict.
   A model call is the user line just outside torch's module-call frames, or outside a user ``forward``
   (a model's forward called directly).

The leak site is the innermost user-code frame of the surviving blocks' stacks (library and C++ frames
skipped; see ``triage.snapshot.frames``). Without stacks the verdict can stand on the timeline, with
``leak_site`` null. A message alone cannot tell a leak from a too-large batch: candidate only.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from typing import TYPE_CHECKING

from rules.base import CANDIDATE, LEAD, LIKELY, STRONG, Finding
from triage.evidence import (
    LATE_RISES,
    RELEASED_CALLS,
    accumulating_site,
    aligned_step,
    allocs_by_site,
    filling_site,
    kept_graphs,
    large_late_rise,
    live_under_calls,
    live_under_calls_before_trace,
    older_block_frees,
    per_step_blocks,
    regrown_across_calls,
    regrown_blocks,
    regrown_request,
    released_after_calls,
    store_turnover,
    stored_since_steps,
    trace_cycles,
    turned_over,
    turning_window,
)
from triage.snapshot.frames import Site
from triage.units import GiB, MiB, human

if TYPE_CHECKING:
    from triage.evidence import Evidence, KeptCalls, StepSample, StepTrend, Survivors
    from triage.snapshot.sites import SiteStats
    from triage.snapshot.timeline import DeviceTimeline

ID = "tensor_leak"
VERDICT = "tensor_leak"
OWNER = "algorithm"

MIN_CYCLES = 3  # survivors from at least four different steps
MIN_CYCLE_FRACTION = 0.2  # several survivors per step are fine (three metrics kept per step)
SITE_IS_CALLS = 1.1  # kept calls holding at most this times one inner site's blocks hold only its
PASS_BLOCKS_MAX = 1024  # blocks one line makes in a forward pass at most (one per layer, a few per block)
HUGE_REQUEST_SHARE = 0.25  # of what the job could hold: one request this large is a new demand of its own
MINOR_SHARE = 0.05  # survivors below this share of the job's memory, and not decisive, did not cause the OOM
MANY_CYCLES = 5  # survivors from six different steps are a leak however many each step kept
RELEASED_MIN = 4  # kept-then-freed blocks that show a site letting go of what it keeps ...
RELEASED_SHARE = 0.25  # ... and at least this share of the blocks it holds now
STOPPED_STEPS = 4  # steps without a new survivor (and 3x the site's own pace) before it counts as stopped
MAX_FREED_FRACTION = 0.25  # more of the site's trace allocations freed than this: a bounded cache
MIN_RISING_FRACTION = 0.7
MIN_GROWTH_FRACTION = 0.05  # of the device limit
EARLY_STEP = 1  # a job at this step or before has had no time to leak across steps
BOUNDED = 0.4  # survivors that behave like a bounded cache (flat steps, filled and stopped, turning over)
GIVEN_BACK = 0.5  # of the per-step rises, given back by falls: memory that is cleared now and then


def late_leak(trend: StepTrend, growth_floor: int, limit: int | None = None) -> bool:
    """Live memory rose at each of the last LATE_RISES or more steps, right up to the OOM, never fell in
    the run, and the rise is more than noise: a leak that began late. A cache that filled and stopped has
    a flat tail; a batch-size change is not counted as a rise. Fewer rises that together took a large share
    of what the job could hold are one too, whatever fell before them (``large_late_rise``)."""
    if trend.rising_fraction >= MIN_RISING_FRACTION:
        return False
    if large_late_rise(trend, limit):
        return True
    if trend.tail_rises < LATE_RISES or trend.falling_fraction > 0.05:
        return False
    return trend.end_bytes - trend.start_bytes >= growth_floor


def _small_growth_undecisive(ev: Evidence, growth: int) -> bool:
    """A growth of ``growth`` bytes did not decide the OOM: the step was short by more than everything that
    grew (without it, the step, set beside the one before it, still would not have fitted). Holes in the
    reservation do not clear a small growth: each block it kept pins the segment it sits in."""
    needed, usable = ev.needed_bytes, ev.usable_bytes
    if needed is None or usable is None:
        return False
    beside = aligned_step(ev)
    peak = max(needed, beside.predicted) if beside is not None else needed
    return peak - usable > growth


def _elsewhere(ev: Evidence, st: SiteStats) -> bool:
    """The site's blocks are on another device than the one that ran out: each GPU is its own memory,
    so what they hold could not have made room for this request."""
    tl = ev.oom_timeline
    return tl is not None and ev.oom_entry is not None and tl.device not in st.devices


def _leaky_site(ev: Evidence, min_cycles: int = MIN_CYCLES) -> Survivors | None:
    best = None
    for s in ev.survivors:
        if _elsewhere(ev, s.stats):
            continue
        if s.cycles < min_cycles or (s.cycle_fraction < MIN_CYCLE_FRACTION and s.cycles < MANY_CYCLES):
            continue
        if s.evicted_like_a_cache:
            continue
        if best is None or s.stats.bytes > best.stats.bytes:
            best = s
    return best


def _kept_across_steps(ev: Evidence) -> int:
    """Bytes of every site's blocks that outlived the step that made them (a kept loss also keeps its
    graph: the activations show up as survivors of their own sites)."""
    return sum(
        s.stats.bytes
        for s in ev.survivors
        if s.cycles >= 1 and not s.evicted_like_a_cache and not _elsewhere(ev, s.stats)
    )


def _huge_request(ev: Evidence) -> bool:
    """The failing request alone is a large share of what the job could hold: one allocation of a new size
    (a long input's attention scores or logits), which nothing kept in small pieces made room for."""
    usable = ev.usable_bytes
    return bool(ev.request_bytes and usable and ev.request_bytes >= HUGE_REQUEST_SHARE * usable)


def _minor(ev: Evidence, kept: int) -> bool:
    """``kept`` (what outlived its step) is a small share of the job's memory and could not have served
    the request."""
    if ev.request_bytes is None or not ev.allocated_bytes:
        return False
    return kept < MINOR_SHARE * ev.allocated_bytes and kept + (ev.device_free_bytes or 0) < ev.request_bytes


def _lead(ev: Evidence, f: Finding) -> None:
    """When the timeline proves a leak but the trace is too short to prove a site: the site whose every
    traced block survived every step the trace covers is the lead."""
    lead = _leaky_site(ev, min_cycles=1)
    if lead is None or lead.freed_at_site or lead.cycles != lead.gaps:
        return
    f.leak_site = lead.site.to_dict()
    f.facts.append(
        f"The trace covers {lead.cycles + 1} steps; every block allocated at {lead.site.label} in them "
        f"is still alive ({lead.stats.count} blocks, {human(lead.stats.bytes)})."
    )


# a function named for evaluation, validation, testing or prediction (Lightning's validation_step, HF's
# prediction_step and evaluation_loop, a script's evaluate): it runs the model and no backward
_RE_EVAL_NAME = re.compile(
    r"(?:^|_)(?:eval|evaluate|evaluation|validate|validation|val|test|predict|prediction|inference|infer)(?:_|$)",
    re.IGNORECASE,
)


def _keeping_frame(ev: Evidence) -> Site | None:
    """The line that re-made the failing request's tensor: the innermost frame of its stack outside torch
    itself (a library's gather, when the user's own frame only started the loop), else None."""
    oom = ev.oom_entry
    for fr in oom.frames if oom is not None else ():
        if not isinstance(fr, dict):
            continue
        filename = str(fr.get("filename") or "")
        if not filename.endswith(".py") or "/torch/" in filename:
            continue
        line = fr.get("line")
        return Site(filename, line if isinstance(line, int) else 0, str(fr.get("name") or ""))
    return None


def _steps_since_last(ev: Evidence, leak: Survivors) -> int:
    """Steps the trace shows after the site's last survivor, when they are far more than the steps
    between its survivors (0 otherwise): the site filled and stopped, like a cache of one entry per
    shape or optimizer state created when a parameter first gets a gradient. A leak keeps adding at its
    own pace until the OOM."""
    tl = ev.oom_timeline
    idx = leak.stats.alloc_indices
    if tl is None or len(idx) < 2 or tl.device not in leak.stats.devices:
        return 0
    end = ev.oom_entry.index if ev.oom_entry is not None else len(tl.levels) - 1
    first, last = idx[0], idx[-1]
    if last >= end:
        return 0
    if leak.cycles and end - last < 3 * (last - first) / leak.cycles:
        # fewer entries since the last survivor than three of the site's own gaps take: the cycles the
        # window shows are the ups and downs of the step under way (its layers), not steps without one
        return 0
    after = len(trace_cycles(tl.levels[last : end + 1], min_cycles=1))
    span = len(trace_cycles(tl.levels[first : last + 1], min_cycles=1))
    pace = max(1.0, span / max(1, leak.cycles))  # steps between two survivors
    return after if after >= max(STOPPED_STEPS, 3 * pace) else 0


def _after_the_steps(ev: Evidence, leak: Survivors) -> StepSample | None:
    """The last step the collector sampled, when every one of the site's surviving blocks was made after
    it: they piled up in a loop that ran no optimizer step (an evaluation or inference loop), so the flat
    steps before it say nothing about them. Read off the trace's clock (epoch µs, as the samples'), only
    when the sample falls inside the trace's span: a clock that does not match decides nothing."""
    if not ev.steps or leak.stats.first_time_us is None:
        return None
    last = ev.steps[-1]
    tl = ev.oom_timeline
    if last.time_us is None or tl is None or not tl.raw:
        return None
    start, end = tl.raw[0].get("time_us"), tl.raw[-1].get("time_us")
    if not isinstance(start, int) or not isinstance(end, int) or not start <= last.time_us <= end:
        return None
    return last if leak.stats.first_time_us > last.time_us else None


PILE_MIN = 1000  # blocks of one size at one user line, none made in the trace, before they are a pile
PILE_SIZE_SHARE = 0.9  # of the site's live blocks: all of one size
PILE_SHARE = 0.1  # of live memory: a pile this large is worth naming (as a lead only)


def _piled_site(ev: Evidence) -> tuple[SiteStats, int, int] | None:
    """(site, block size, blocks) of the user line holding ``PILE_MIN`` or more live blocks, nearly all of one
    size and none made in the trace, that are ``PILE_SHARE`` of live memory or more: the same small
    tensor kept over and over, read off a snapshot that shows neither steps nor the site's blocks being made."""
    best: tuple[SiteStats, int, int] | None = None
    for st in ev.sites:
        if st.site.kind != "user" or st.traced or st.count < PILE_MIN or _loads_weights(st):
            continue
        size, n = max(st.sizes.items(), key=lambda kv: kv[1], default=(0, 0))
        if (
            n >= PILE_SIZE_SHARE * st.count
            and n * size >= PILE_SHARE * (ev.allocated_bytes or 0) > 0
            and (best is None or n * size > best[1] * best[2])
        ):
            best = (st, size, n)
    return best


PER_STEP_SPAN = (0.8, 1.25)  # a site's blocks per step times their size, against the growth per step
PER_STEP_CHANGES = 16  # sampled steps before a count of one size can follow them


def _kept_per_step(ev: Evidence, per_step: float, changes: int) -> tuple[SiteStats, int, int, int] | None:
    """(site, blocks per step, block size, blocks) of the one user site holding ``k`` (1-4) live blocks of
    one size for every sampled step or more, whose ``k`` blocks come to what live memory grew by per step:
    a tensor kept every step, when the run went on longer than the samples reach back (the site holds one
    per step since the start; the samples show the last few thousand)."""
    if changes < PER_STEP_CHANGES:
        return None  # a few steps: a layer's activations of one size come in as many
    found: list[tuple[SiteStats, int, int, int]] = []
    for st in ev.sites:
        if st.site.kind != "user" or _elsewhere(ev, st) or _loads_weights(st):
            continue
        for size, n in st.sizes.items():
            k = max(1, round(per_step / size)) if size else 0
            if (
                1 <= k <= 4
                and n >= 0.8 * k * changes
                and PER_STEP_SPAN[0] <= k * size / per_step <= PER_STEP_SPAN[1]
                and _made_in_trace(ev, st, size) <= 0.5 * n  # most kept from earlier steps, not this one's
            ):
                found.append((st, k, size, n))
    return found[0] if len(found) == 1 else None


def _made_in_trace(ev: Evidence, st: SiteStats, size: int) -> int:
    """How many allocations of ``size`` bytes the site made in the trace."""
    traced = allocs_by_site(ev)
    return sum(
        1
        for tl in ev.timelines
        if tl.device in st.devices
        for i in traced.get((tl.device, st.site), [])
        if tl.raw[i].get("size") == size
    )


def _lead_by_growth(ev: Evidence, f: Finding) -> None:
    """When the steps prove a leak and the trace reaches back too little to show a site's blocks crossing
    steps: the one user site whose live blocks add up to what live memory grew by over the sampled steps
    (0.8-1.5x: the leak also kept what it made before the first sample and in the failing step), most of
    them older than the trace. The current step's activations are in the trace; weights and optimizer
    state were there before the first sample, so they are not part of the growth."""
    trend = ev.trend
    if trend is None or trend.steps < 4:
        return
    grown = trend.end_bytes - trend.start_bytes
    if grown <= 0:
        return
    matches = [
        st
        for st in ev.sites
        if st.site.kind == "user"
        and not _elsewhere(ev, st)
        and st.count >= 3
        and 0.8 * grown <= st.bytes <= 1.5 * grown
        and (not ev.has_trace or st.traced <= 0.5 * st.count)
        and not _loads_weights(st)
    ]
    older = " (most of them from before the trace began)" if ev.has_trace else ""
    if not matches:
        per_step = _kept_per_step(ev, grown / (trend.steps - 1), trend.steps - 1)
        if per_step is not None:
            st, k, size, n = per_step
            f.leak_site = st.site.to_dict()
            longer = (
                " (the job ran more steps than the samples reach back to)"
                if n > PER_STEP_SPAN[1] * k * (trend.steps - 1)
                else ""
            )
            f.facts.append(
                f"{n} blocks of {human(size)} allocated at {st.site.label} are alive{older}: {k} for each step, "
                f"as live memory grew by about {human(k * size)} at each of the {trend.steps} sampled steps{longer}."
            )
            return
    if len(matches) == 1:
        st = matches[0]
        f.leak_site = st.site.to_dict()
        f.facts.append(
            f"{st.count} blocks, {human(st.bytes)}, allocated at {st.site.label} are alive{older}: as much as "
            f"live memory grew over the {trend.steps} sampled steps ({human(grown)})."
        )
        return
    if matches:
        return
    # several tensors kept at every step from one function (a loss's intermediates held by the graph of a
    # running total): no one line holds the growth, the lines one caller runs do together
    groups: dict[Site, list[SiteStats]] = {}
    for st in ev.sites:
        if (
            st.site.kind == "user"
            and not _elsewhere(ev, st)
            and (not ev.has_trace or st.traced <= 0.5 * st.count)
            and not _loads_weights(st)
            and (caller := _caller(ev, st)) is not None
        ):
            groups.setdefault(caller, []).append(st)
    fits = [
        (caller, sts)
        for caller, sts in groups.items()
        if len(sts) >= 2
        and sum(st.count for st in sts) >= 3
        and 0.8 * grown <= sum(st.bytes for st in sts) <= 1.5 * grown
    ]
    if len(fits) != 1:
        return
    caller, sts = fits[0]
    f.leak_site = caller.to_dict()
    lines = ", ".join(st.site.label for st in sorted(sts, key=lambda st: -st.bytes))
    f.facts.append(
        f"{sum(st.count for st in sts)} blocks, {human(sum(st.bytes for st in sts))}, allocated at {lines}, all "
        f"called from {caller.label}, are alive{older}: together as much as live memory grew over the "
        f"{trend.steps} sampled steps ({human(grown)})."
    )


def _caller(ev: Evidence, st: SiteStats) -> Site | None:
    """The user line that called the function the site's line is in: the next user frame out."""
    frames = [fr for fr in st.stack if isinstance(fr, dict)]
    seen = False
    for fr in frames:
        if not ev.classifier.classify(fr)[1]:
            continue
        if not seen:
            seen = True  # the site's own frame
            continue
        line = fr.get("line")
        return Site(
            str(fr.get("filename") or ""), line if isinstance(line, int) else 0, str(fr.get("name") or "")
        )
    return None


# frames of loading a model's weights onto the device: what they allocate was there before any step
_LOADING = frozenset(
    {
        "from_pretrained",
        "load_state_dict",
        "_load_state_dict_into_meta_model",
        "set_module_tensor_to_device",
        "_apply",
    }
)


def _loads_weights(st: SiteStats) -> bool:
    """Whether the site's blocks were made loading the model (``from_pretrained``, ``load_state_dict``,
    ``model.to(device)``): weights, in place before the first step, so never a leak's growth."""
    return any(isinstance(fr, dict) and fr.get("name") in _LOADING for fr in st.stack)


def _lead_by_regrowth(ev: Evidence, f: Finding) -> None:
    """When the steps prove a leak and no site keeps many blocks: the user line whose one live block is the
    latest of a run of re-makes that only grew, each freeing the one before (``buf = torch.cat([buf, new])``
    and never trimmed), and that holds half of what live memory grew by over the steps or more."""
    trend, tl = ev.trend, ev.oom_timeline
    if trend is None or tl is None or trend.growth_bytes <= 0:
        return
    best: tuple[SiteStats, list[int]] | None = None
    for st, idx in regrown_blocks(ev):
        if st.bytes >= 0.5 * trend.growth_bytes and (best is None or st.bytes > best[0].bytes):
            best = (st, idx)
    if best is None:
        # a trace too short for a run of re-makes: the site's one block made in it, and at once an older,
        # smaller block freed (the tensor it was concatenated from, made before the trace)
        once = [
            (st, old)
            for st in ev.sites
            if st.site.kind == "user"
            and st.count == 1
            and st.traced == 1
            and st.bytes >= 0.5 * trend.growth_bytes
            and (old := _replaced_older(ev, tl, st)) is not None
        ]
        if once:
            st, old = max(once, key=lambda x: x[0].bytes)
            f.leak_site = st.site.to_dict()
            f.facts.append(
                f"Its one block at {st.site.label}, {human(st.bytes)}, was made in the trace and at once a "
                f"{human(old)} block older than the trace was freed: a tensor concatenated onto itself "
                "(`buf = torch.cat([buf, new])`) at every step and never trimmed."
            )
        return
    st, idx = best
    f.leak_site = st.site.to_dict()
    f.facts.append(
        f"One block at {st.site.label} was re-made larger {len(idx)} times in the trace "
        f"({human(tl.raw[idx[0]]['size'])} → {human(tl.raw[idx[-1]]['size'])}), each freeing the one before: "
        "a tensor concatenated onto itself (`buf = torch.cat([buf, new])`) and never trimmed."
    )


REPLACED_WITHIN = 8  # trace entries after a block is made within which the tensor it replaced is freed


def _replaced_older(ev: Evidence, tl: DeviceTimeline, st: SiteStats) -> int | None:
    """The size of a block older than the trace freed within ``REPLACED_WITHIN`` entries after the site's
    one traced block was made, and at least half its size but smaller: the tensor it was concatenated from."""
    if not st.alloc_indices:
        return None
    i = st.alloc_indices[-1]
    raw = tl.raw
    size = raw[i].get("size")
    if not isinstance(size, int):
        return None
    frees = older_block_frees(ev, tl)
    for j in range(bisect_right(frees, i), len(frees)):
        k = frees[j]
        if k > i + REPLACED_WITHIN:
            break
        if isinstance(z := raw[k].get("size"), int) and 0.5 * size <= z < size:
            return z
    return None


def _lead_by_calls(ev: Evidence, f: Finding) -> None:
    """When the steps prove a leak and no one line's blocks account for it: the line that calls the model,
    when the trace shows its earlier calls still held and the live blocks made inside its calls (the
    stacks of blocks older than the trace say so too) add up to what live memory grew by over the sampled
    steps (0.8-1.5x): model outputs kept with their graphs, every layer's saved activations with them."""
    trend, kc, tl = ev.trend, ev.kept_calls, ev.oom_timeline
    if trend is None or tl is None or ev.snapshot is None:
        return
    grown = trend.end_bytes - trend.start_bytes
    if grown <= 0:
        return
    if kc is None or kc.calls < 2:
        # a trace too short to show two of the line's calls: the blocks made inside one line's calls
        # before the trace began, most of what live memory grew by (and no other line's), are what it kept;
        # the rest of the growth is what each call's loss kept outside the call (its saved log-probabilities)
        older = [
            (key, held)
            for key, held in live_under_calls_before_trace(ev).items()
            if 0.5 * grown <= held <= 1.5 * grown
        ]
        if len(older) != 1:
            return
        (filename, line, name), held = older[0]
        site = Site(str(filename), int(line or 0), str(name))
        f.leak_site = site.to_dict()
        f.facts.append(
            f"{human(held)} of live blocks were made inside calls of the model at {site.label} before the trace "
            f"began, most of what live memory grew by over the {trend.steps} sampled steps ({human(grown)}): the "
            "outputs of those calls are kept, with their autograd graphs."
        )
        return
    held = live_under_calls(ev).get((kc.call.filename, kc.call.line, kc.call.name), (0, 0))[0]
    # calls kept past their optimizer step, about one a step: whole graphs kept (the loss's saved tensors,
    # made outside the call, are the rest of the growth)
    past = kc.past_step >= 1 and 2 * kc.calls >= trend.steps and held <= 1.5 * grown
    if not (0.8 * grown <= held <= 1.5 * grown or past):
        return
    f.leak_site = kc.call.to_dict()
    f.facts.append(
        f"{human(held)} of live blocks were made inside calls of the model at {kc.call.label}, as much as live "
        f"memory grew over the {trend.steps} sampled steps ({human(grown)}); the trace shows {kc.calls} of those "
        "calls still held: their outputs are kept with their autograd graphs."
    )


PEAKS_OUTGROW = 4  # the steps' peaks rose this many times what live memory after them did: the steps grew


def _steps_outgrew(ev: Evidence, trend: StepTrend, f: Finding) -> None:
    """Live memory after each step rose, and the steps' own peaks rose several times faster at the same batch
    size: the steps themselves grew (a sequence-length or resolution schedule, longer inputs), and what a step
    leaves behind until the next one replaces it (last step's outputs, a loss still bound to a name) grew with
    them. Kept tensors raise a step's peak by no more than they raise the floor. When the trace covers
    several of those steps and none of its blocks outlived more than the step after the one that made it,
    nothing accumulates: a candidate; without the trace, a lead."""
    steps = ev.steps
    if len(steps) < 4 or trend.growth_bytes <= 0 or ev.batch_grew_from:
        return
    sampled = [s for s in steps if s.peak_allocated_bytes > s.allocated_bytes]
    if len(sampled) < 0.75 * len(steps):
        return  # the peaks were not sampled
    k = max(1, len(steps) // 4)
    first = sorted(s.peak_allocated_bytes for s in steps[:k])[k // 2]
    last = sorted(s.peak_allocated_bytes for s in steps[-k:])[k // 2]
    if last - first < PEAKS_OUTGROW * trend.growth_bytes:
        return
    f.facts.append(
        f"The steps' own peaks rose by {human(last - first)} while live memory after them rose by "
        f"{human(trend.growth_bytes)}, at the same batch size: the steps themselves grew (longer inputs, a "
        "sequence-length schedule), and what each leaves behind until the next replaces it grew with them."
    )
    covered = len(trace_cycles(ev.oom_timeline.levels)) if ev.oom_timeline is not None else 0
    if ev.has_trace and ev.has_frames and covered >= 4 and not any(s.cycles >= 2 for s in ev.survivors):
        f.facts.append(
            f"The trace covers {covered} of those steps and no block in it outlived the step after the one "
            "that made it: nothing accumulates."
        )
        f.score = min(f.score, CANDIDATE)
    else:
        f.missing.append("an allocator trace with stacks over several steps: whether anything accumulates")
        f.score = min(f.score, LEAD)


def _stored_since_steps(ev: Evidence, f: Finding) -> Finding | None:
    """The steps were flat, and this moment needed far more than they peaked at; most of the difference is
    blocks one user line (outside the model) made before the trace began, beyond what the last step left:
    kept since the steps, in a loop that runs no optimizer step. A lead: the trace does not show them pile
    up, and a store the job means to keep looks the same."""
    stored = stored_since_steps(ev)
    if stored is None or not ev.is_cuda_oom:
        return None
    site, n, size = stored
    f.facts.append(
        f"{n} blocks, {human(size)}, made at {site.label} before the trace began are still alive, beyond what "
        f"the last sampled step left; without them this moment needed no more than the {human(max(ev.step_peaks))} "
        "the steps peaked at: kept since the steps (outputs or metrics appended in an evaluation loop)."
    )
    f.missing.append(
        "an allocator trace that reaches back to the last step (a larger history_max_entries): whether these "
        "blocks piled up call after call"
    )
    f.values.update({"leak_bytes": size, "leak_blocks": n, "site": site.label})
    f.leak_site = site.to_dict()
    f.score = LEAD
    return f


def _graphs_beyond_site(leak: Survivors, held: KeptCalls) -> bool:
    """Whether the calls ``held`` keeps hold more than ``leak``'s own blocks: a kept autograd graph holds
    every op's saved activations; a line inside the model that keeps one tensor per layer
    (``self.maps.append(att)``) is all its calls hold, and that line is the one to fix."""
    same_calls = leak.call is not None and leak.call.label == held.call.label
    return not (same_calls and held.bytes <= SITE_IS_CALLS * leak.stats.bytes)


def _older(kc: KeptCalls) -> str:
    """The clause for the line's blocks older than the trace, when there are any."""
    if not kc.older_bytes:
        return ""
    return f", with {human(kc.older_bytes)} more made under the same line before the trace began (earlier calls kept)"


def evaluate(ev: Evidence) -> Finding | None:
    f = _evaluate(ev)
    if ev.eval_gather is not None and ev.is_cuda_oom and (f is None or f.score < LEAD):
        # an evaluation loop that keeps every batch's predictions on the GPU: memory kept across its batches
        f = f or Finding(rule=ID, verdict=VERDICT, score=0.0)
        f.facts.insert(
            0,
            f"The OOM came while the evaluation loop gathered its predictions ({ev.eval_gather}): every batch's "
            "outputs kept on the GPU until the evaluation ends.",
        )
        f.missing.append(
            "live memory per evaluation batch: kept predictions grow with each, a too-large batch does not"
        )
        f.actions.insert(
            0,
            "Set eval_accumulation_steps (HF Trainer) or move each batch's predictions to the CPU before keeping them.",
        )
        f.score = LEAD
    if f is not None and ev.device_had_room:
        # whatever the job kept, the device had room for this request: the leak did not cause this OOM
        if f.score <= CANDIDATE:
            return None
        f.score = CANDIDATE
    kept = ev.restart_kept_bytes
    if kept is None or ev.restart_growth is None or not (ev.is_cuda_oom or ev.kind == "none"):
        return f
    if f is None:
        f = Finding(rule=ID, verdict=VERDICT, score=0.0)
    went_from, went_to, _ = ev.restart_growth
    f.facts.insert(
        0,
        f"The step count started again ({went_from} → {went_to}: an attempt restarted from a checkpoint in the "
        f"same process), and live memory after the same steps was {human(kept)} higher than the first time: what "
        "the earlier attempt held (its model, optimizer state, outputs) was never freed"
        + (", and the count started again once more before this OOM." if ev.restarted_again else "."),
    )
    f.values["restart_kept_bytes"] = kept
    usable, needed = ev.usable_bytes, ev.needed_bytes
    decisive = usable is not None and needed is not None and needed - kept <= usable
    f.score = max(f.score, STRONG if ev.restarted_again and decisive else LIKELY)
    f.actions.insert(
        0,
        "Free the failed attempt before starting again: drop every reference to its model, optimizer and "
        "outputs (`del model, optimizer`, clear exception tracebacks that hold frames), then `gc.collect()` and "
        "`torch.cuda.empty_cache()`; or restart the process instead of retrying in it.",
    )
    return f


def _evaluate(ev: Evidence) -> Finding | None:
    f = Finding(rule=ID, verdict=VERDICT, score=0.0)
    limit = ev.limit_bytes or 0
    trend = ev.trend
    leak = _leaky_site(ev)
    if leak is None and trend is not None and trend.steps >= 3 and trend.rising_fraction >= 0.99:
        # every sampled step grew: two steps' worth of surviving blocks from one site are enough
        leak = _leaky_site(ev, min_cycles=2)
    trend_growing = False
    trend_flat = False
    flat_fact = ""
    if trend is not None:
        growth_floor = max(256 * MiB, int(MIN_GROWTH_FRACTION * limit)) if limit else 256 * MiB
        if ev.growth_with_input is not None:
            what, smallest, largest = ev.growth_with_input
            trend_flat = True
            flat_fact = (
                f"{ev.step_series} rose only where the {what} printed beside it grew ({smallest} → {largest}), and "
                "never otherwise: the input grew and live memory with it (the last batch's outputs, buffers sized "
                "by it), not something kept."
            )
            f.facts.append(flat_fact)
        elif trend.plateaued and trend.steps >= 6:
            trend_flat = True
            f.facts.append(
                f"{ev.step_series} rose by {human(trend.early_growth_bytes)} and then levelled off "
                f"(+{human(max(0, trend.late_growth_bytes))} over the last third of {trend.steps} steps): "
                "a bounded cache or warm-up, not a leak."
            )
        elif late_leak(trend, growth_floor, limit):
            # flat for a while, then up at every step to the OOM: a leak that began late (after the first
            # evaluation, when a feature turned on)
            trend_growing = True
            f.facts.append(
                f"{ev.step_series} rose at every one of the last {trend.tail_rises} steps, to "
                f"{human(trend.end_bytes)}, and never fell: something kept every step since then is never released."
            )
            f.values["growth_bytes"] = trend.growth_bytes
            f.values["steps"] = trend.steps
        elif trend.growth_bytes >= growth_floor and (
            trend.rising_fraction >= MIN_RISING_FRACTION
            or (trend.falling_fraction <= 0.1 and trend.rising_fraction >= 0.25 and trend.rises_throughout)
            or trend.staircase
        ):
            # rises in most steps, or never falls (a tensor kept every other step rises in half of them,
            # one kept at every evaluation rises in a few and never gives anything back)
            trend_growing = True
            if trend.rising_fraction >= 0.25:
                f.facts.append(
                    f"{ev.step_series} grew in {trend.rising_fraction:.0%} of {trend.steps} steps, "
                    f"from {human(trend.start_bytes)} to {human(trend.end_bytes)} "
                    f"(about {human(trend.slope_bytes_per_step)} per step)."
                )
            else:
                f.facts.append(
                    f"{ev.step_series} rose {trend.rises} times over {trend.steps} steps and never "
                    f"fell, from {human(trend.start_bytes)} to {human(trend.end_bytes)}: something kept at "
                    "every few steps (an evaluation, a logging step) is never released."
                )
            f.values["growth_bytes"] = trend.growth_bytes
            f.values["steps"] = trend.steps
        elif trend.steps >= 4:
            trend_flat = True
            flat_fact = (
                f"{ev.step_series} stayed flat over {trend.steps} steps "
                f"({human(trend.start_bytes)} → {human(trend.end_bytes)})."
            )
            f.facts.append(flat_fact)

    graphs = kept_graphs(ev) if leak is None and not trend_growing else None
    unsure = kept_graphs(ev, unproven=True) if leak is None and not trend_growing and graphs is None else None
    if unsure is not None:
        kc, peak = unsure  # unproven: no optimizer step came after them, so an earlier peak is what convicts
        against = (
            f"the earlier steps peaked at {human(peak)}"
            if peak is not None
            else f"without them this moment needed {human((ev.needed_bytes or 0) - kc.kept_bytes)}, which fitted"
        )
        f.facts.append(
            f"{kc.blocks} blocks, {human(kc.bytes)}, allocated in {kc.calls} earlier calls of the model at "
            f"{kc.call.label} are still alive{_older(kc)}, and {against}: outputs kept with "
            "their autograd graphs (a validation loop without `torch.no_grad()`), unless every step runs the "
            "model that many times before one backward."
        )
        f.score = LEAD
        if _RE_EVAL_NAME.search(kc.call.name):
            # a step that sums its calls for one backward is a training step; a loop named for evaluation
            # or prediction runs no backward, so nothing should keep its calls' graphs
            f.facts.append(
                f"The calls are made in `{kc.call.name}`, an evaluation or prediction loop by its name: it runs "
                "no backward, so nothing there should keep a graph."
            )
            f.leak_site = kc.call.to_dict()
            f.score = LIKELY
        else:
            f.missing.append(
                "an allocator trace that reaches back into the steps before these calls (a larger "
                "history_max_entries): whether this line held its calls at every step"
            )
    elif graphs is not None:
        kc, peak = graphs
        f.facts[:0] = [
            f"{kc.blocks} blocks, {human(kc.bytes)}, allocated in {kc.calls} earlier calls of the model at "
            f"{kc.call.label} are still alive{_older(kc)}: each call's activations, kept for a backward that never "
            "came (its output is still referenced, and with it its autograd graph).",
            f"Earlier steps peaked at {human(peak)}; without the kept calls this moment needed no more "
            f"than that, with them {human(ev.needed_bytes or 0)}."
            if peak is not None
            else f"They are {human(kc.kept_bytes)} of the {human(ev.needed_bytes or 0)} this moment needed; "
            f"without them it needed {human((ev.needed_bytes or 0) - kc.kept_bytes)}, which fitted.",
        ]
        if kc.past_step:
            f.facts.insert(
                1,
                f"{kc.past_step} of those calls outlived an optimizer step: their step's backward and update were "
                "over and their graphs were still referenced (a hidden state carried into the next step "
                "without `.detach()`, outputs kept across steps).",
            )
        f.values.update({"leak_bytes": kc.kept_bytes, "leak_blocks": kc.blocks, "kept_calls": kc.calls})
        f.leak_site = kc.call.to_dict()

        f.score = STRONG if kc.calls >= 4 else LIKELY
    elif leak is not None:
        st = leak.stats
        where = (
            f"at {st.site.label}" if st.site.kind in ("user", "library") else "(no stack recorded for them)"
        )
        f.facts.append(
            f"{st.count} blocks, {human(st.bytes)}, allocated {where} over at least {leak.cycles + 1} steps are still alive "
            f"({leak.freed_at_site} of the site's {max(st.allocs_in_trace, st.traced)} allocations in the trace were freed)."
        )
        f.values.update(
            {
                "leak_bytes": st.bytes,
                "leak_blocks": st.count,
                "leak_steps": leak.cycles + 1,
                "site": st.site.label,
            }
        )
        if st.site.kind in ("user", "library"):
            f.leak_site = st.site.to_dict()
        if leak.call is not None and leak.call.label != st.site.label:
            f.facts.append(
                f"They were made inside the model, in its calls at {leak.call.label}: what is kept from one call "
                "to the next is the model's (its outputs appended to a list at that line, or a module that "
                "stores tensors on itself)."
            )
            f.values["call"] = leak.call.label
        held = ev.kept_calls
        if (
            held is not None
            and held.calls > leak.cycles
            # the calls hold far more than the site; or they hold whole graphs (several blocks a call, saved
            # activations, not one output each) and at least half of what the site holds (a layer's line
            # whose saved activations are those graphs', beside the call under way)
            and (
                held.bytes >= 2 * st.bytes
                or (
                    2 * held.bytes >= st.bytes
                    and held.blocks >= 2 * held.calls
                    and _graphs_beyond_site(leak, held)
                )
            )
        ):
            # what is kept with it is mostly whole forward passes: the outputs of those calls are kept with
            # their graphs (a buffer of model outputs), and the call is the line to fix
            f.facts.insert(
                0,
                f"{held.blocks} blocks, {human(held.bytes)}, from {held.calls} calls of the model at "
                f"{held.call.label} are still alive across steps: the outputs of those calls are kept with their "
                "autograd graphs (every saved activation).",
            )
            f.values["leak_bytes"] = held.bytes + st.bytes
            f.values["kept_calls"] = held.calls
            f.leak_site = held.call.to_dict()
        # decisive: with the leaked memory released, the failing request would have fitted
        decisive = ev.request_bytes is not None and st.bytes + (ev.device_free_bytes or 0) >= ev.request_bytes
        significant = st.bytes >= 64 * MiB or (ev.allocated_bytes and st.bytes >= 0.02 * ev.allocated_bytes)
        if significant or decisive:
            f.score = STRONG
        elif leak.cycles >= 10:
            f.score = LIKELY  # small, but made and kept in step after step: nothing bounds it
        else:
            f.score = LIKELY - 0.1
        if decisive and not significant:
            f.facts.append(
                f"Small as it is, it decided the OOM: freed, its {human(st.bytes)} would have covered the "
                f"{human(ev.request_bytes or 0)} request."
            )
        # rising at nearly every step, and not giving most of it back now and then (a cache cleared every N
        # steps rises at every other step too: a saw-tooth, not a leak)
        steady = (
            trend is not None
            and trend.rising_fraction >= 0.9
            and not trend.plateaued
            and trend.given_back < GIVEN_BACK
        )
        # (far more blocks of one line than a forward pass has layers, holding most of the memory, are no pass:
        # an inference loop that never steps an optimizer reports step 0 all along)
        piled = st.count >= PASS_BLOCKS_MAX and st.bytes >= 0.5 * (ev.allocated_bytes or 0)
        if ev.step is not None and ev.step <= EARLY_STEP and not trend_growing and not piled:
            # the job says it was in its first steps: what the trace shows as steps were the layers of one
            # forward pass, or the micro-steps of one optimizer step
            f.facts.append(
                f"But the job was at step {ev.step}: the trace's {leak.cycles + 1} rounds at this site are "
                "passes within its first steps, not a leak over many."
            )
            f.score = min(f.score, LEAD)
        elif leak is turning_window(ev) and leak.replacing is not None:
            (filename, line, name), n, k = leak.replacing
            where = f"{str(filename).rsplit('/', 1)[-1]}:{line} in {name}"
            f.facts.append(
                f"But as its blocks came in, blocks older than the trace were freed at {where}, one for one "
                f"({n} of its last {k + 1}): a window that turns over (a deque with maxlen, a list trimmed from "
                "the front), not a pile that grows"
                + (", and live memory per step stopped growing when it began." if trend_growing else ".")
            )
            if trend is None:
                f.missing.append(
                    "live memory per step (the collector's step samples): a window levels off, a leak does not"
                )
            f.score = min(f.score, BOUNDED)
        elif (
            not decisive
            and _huge_request(ev)
            and _minor(ev, kept := max(st.bytes, trend.growth_bytes if trend else 0))
        ):
            # a real leak, but one this OOM did not need: all it kept, freed, would not have made room for the
            # request (a single allocation far larger than anything kept)
            f.facts.append(
                f"All it kept comes to {human(kept)}, {kept / max(1, ev.allocated_bytes or 1):.1%} of the job's "
                f"memory: freed, it would not have made room for the {human(ev.request_bytes or 0)} request. A "
                "leak, but not what failed here."
            )
            f.score = min(f.score, LEAD)
        elif trend_growing or (steady and f.score >= STRONG):
            f.score = 0.95
        elif trend_flat and not steady and (last := _after_the_steps(ev, leak)) is not None:
            # the flat steps are the background here, not the finding: the kept blocks lead
            f.facts.remove(flat_fact)
            f.facts.append(
                f"All of them were made after the last optimizer step the collector sampled (step {last.step}): "
                "they piled up in a loop that runs no optimizer step (an evaluation or inference loop), "
                "which the flat steps before it do not cover."
            )
            f.facts.append(flat_fact)
        elif trend_flat and not steady:
            f.score = min(f.score, BOUNDED)
        elif trend is None and (churn := turned_over(ev, leak)):
            f.facts.append(
                f"But the site never held more than {churn[2]} blocks at once: it reached {churn[0]} early and "
                f"then made {churn[1]} more, freeing as many — a cache that evicts, not a leak."
            )
            f.missing.append(
                "live memory per step (the collector's step samples): a cache levels off, a leak does not"
            )
            f.score = min(f.score, BOUNDED)
        elif trend is None and (let_go := released_after_calls(ev, leak)) >= max(
            RELEASED_MIN, RELEASED_SHARE * leak.stats.count
        ):
            f.facts.append(
                f"But {let_go} of the site's blocks were kept across {RELEASED_CALLS} or more later calls of the "
                "model and then freed: the site lets go of what it keeps (a memory bank or cache that ages its "
                "entries out), not a pile that only grows."
            )
            f.missing.append(
                "live memory per step (the collector's step samples): a bank that ages out levels off, a leak does not"
            )
            f.score = min(f.score, BOUNDED)
        elif trend is None and (gone := store_turnover(ev, leak)) is not None:
            f.facts.append(
                f"But while it made them, {gone[0]} blocks older than the trace, {human(gone[1])}, of the sizes it "
                "makes, were freed now and again: a store whose entries come and go (per-request caches freed "
                "as requests finish, a window moving on), not a pile that only grows."
            )
            f.missing.append(
                "live memory per step (the collector's step samples): a store that turns over levels off, a "
                "leak does not"
            )
            f.score = min(f.score, BOUNDED)
        elif trend is None and (quiet := _steps_since_last(ev, leak)):
            f.facts.append(
                f"Then the trace shows {quiet} more steps without a new one: the site filled up and stopped "
                "(a cache of one entry per shape, state created on first use), not a leak."
            )
            f.missing.append(
                "live memory per step (the collector's step samples): a filled cache levels off, a leak does not"
            )
            f.score = min(f.score, BOUNDED)
        elif trend is None and not decisive and _minor(ev, kept := _kept_across_steps(ev)):
            # without the steps, only the blocks show the leak: if everything that outlived its step could
            # not have made room for the request, this OOM came from something else (the leak is still real)
            f.facts.append(
                f"All that outlived its step comes to {human(kept)}, {kept / max(1, ev.allocated_bytes or 1):.1%} "
                f"of the job's memory: freed, it would not have made room for the {human(ev.request_bytes or 0)} "
                "request. A leak, but not what failed here."
            )
            f.score = min(f.score, LEAD)
        elif trend is None and leak.freed_at_site >= 2 and leak.freed_after_first == 0:
            # the site's oldest blocks were freed and none after them: a cache that has begun evicting
            # (oldest first) looks exactly like this until it has evicted more; only the steps can tell
            f.facts.append(
                f"The site's {leak.freed_at_site} oldest blocks were freed and none after them: a bounded "
                "cache that has begun evicting looks the same."
            )
            f.missing.append(
                "live memory per step (the collector's step samples): a cache levels off, a leak does not"
            )
            f.score = min(f.score, LEAD)
    elif trend_growing and trend is not None:
        f.score = LIKELY + 0.05 if trend.steps >= 8 else LIKELY - 0.1
        if (
            trend.never_falls
            and limit
            and (
                (trend.steps >= 8 and trend.growth_bytes >= 0.10 * limit)
                or (trend.steps >= 4 and trend.growth_bytes >= 0.25 * limit)
            )
        ):
            # steady growth over many steps that ate a sixth of the device: nothing else looks like this
            f.score = STRONG
        if ev.has_trace and ev.has_frames and f.score < STRONG:
            # the trace should have shown the survivors: keep the verdict, lower the confidence
            f.score -= 0.1
            f.missing.append("the allocator trace does not reach back far enough to show the leaking site")
        elif not ev.has_frames:
            f.missing.append(
                "allocation stacks (record history with stacks='python') would name the leaking line"
            )
        _lead(ev, f)
        if f.leak_site is None:
            _lead_by_growth(ev, f)
        if f.leak_site is None:
            _lead_by_calls(ev, f)
        if f.leak_site is None:
            _lead_by_regrowth(ev, f)
        if f.leak_site is None:
            _steps_outgrew(ev, trend, f)
    elif (
        trend is not None
        and trend.steps >= 8
        and trend.rising_fraction >= 0.9
        and not trend.plateaued
        # (a floor is exact to the byte; a peak printed alone moves with the input)
        and not ev.log_peaks_only
        and not _small_growth_undecisive(ev, trend.growth_bytes)
        # (all it grew by, freed, would not have made room for a request that large: a leak, not this OOM's cause)
        and not (_huge_request(ev) and _minor(ev, trend.growth_bytes))
    ):
        # a small rise after every single step: live memory after a step is exact to the byte in a
        # healthy loop, so even a few KiB a step is something kept; the longer the run, the surer
        f.score = LIKELY if trend.steps >= 20 and trend.rising_fraction >= 0.95 else LIKELY - 0.05
        if flat_fact in f.facts:
            f.facts.remove(flat_fact)  # flat beside the device, not beside the step before
        f.facts.append(
            f"{ev.step_series} rose in {trend.rising_fraction:.0%} of {trend.steps} steps, by "
            f"{human(trend.growth_bytes)} in all: small, but something is kept every step."
        )
        if not ev.has_frames:
            f.missing.append(
                "allocation stacks (record history with stacks='python') would name the leaking line"
            )
        _lead(ev, f)
        if f.leak_site is None:
            _lead_by_growth(ev, f)
        if f.leak_site is None:
            _lead_by_calls(ev, f)
    elif trend_flat and graphs is None and unsure is None:
        return _stored_since_steps(ev, f)
    else:
        if ev.step is not None and ev.step <= 1 and ev.is_cuda_oom:
            return None  # nothing can leak before the first step completes
        if not ev.is_cuda_oom:
            return None  # no OOM and nothing growing: nothing to suspect
        if ev.request_beyond_device or ev.request_beyond_floor:
            return None  # kept tensors cannot make room for one request larger than the device
        f.score = CANDIDATE
        adding = accumulating_site(ev)
        regrown = regrown_across_calls(ev)
        if regrown is not None:
            st, n, smallest, largest, passes = regrown
            f.facts.append(
                f"One block at {st.site.label} was re-made larger {n} times in the trace ({human(smallest)} → "
                f"{human(largest)}), each freeing the one before, with a whole pass through the model between "
                f"re-makes {passes} times: a tensor concatenated onto itself from call to call "
                f"(`buf = torch.cat([buf, new])`) and never trimmed. It holds {human(st.bytes)} of the "
                f"{human(ev.allocated_bytes or 0)} live at the OOM."
            )
            f.leak_site = st.site.to_dict()
            f.score = LIKELY
            f.actions.append(
                f"At {st.site.label}: bound what is concatenated (keep the last N, or move it to the CPU with "
                "`.cpu()`), or collect the pieces in a list and concatenate once at the end."
            )
        elif (rr := regrown_request(ev)) is not None:
            n, smallest, req, passes, last_bytes = rr
            frame = _keeping_frame(ev)
            where = f" at {frame.label}" if frame is not None else ""
            f.facts.append(
                f"The failing {human(req)} request is the next re-make of one tensor{where}, re-made larger {n} "
                f"times in the trace ({human(smallest)} → {human(req)}), each replacing the one before, with a "
                f"whole pass through the model between re-makes {passes} times: every call's outputs "
                f"concatenated onto one tensor on the device (`torch.cat`) and never moved off it. The last "
                f"holds {human(last_bytes)} of the {human(ev.allocated_bytes or 0)} live at the OOM."
            )
            if frame is not None:
                f.leak_site = frame.to_dict()
            f.score = LIKELY
            f.actions.append(
                f"{'At ' + frame.label + ': m' if frame is not None else 'M'}ove what is gathered to the CPU as "
                "it comes (`.cpu()`; with the HF Trainer, set `eval_accumulation_steps`), or keep only the "
                "metrics you need instead of every output."
            )
        elif (per_step := per_step_blocks(ev)) is not None:
            kept_at, n, size = per_step
            f.facts.append(
                f"{n} blocks of {human(size)}, {human(n * size)}, allocated at {kept_at.label} are alive at step "
                f"{ev.step}: one kept at every step (a loss or an output appended to a list, with or without "
                "its graph), never released."
            )
            f.missing.append(
                "live memory after each step (the collector's step samples): whether it kept growing"
            )
            f.leak_site = kept_at.to_dict()
            f.score = LIKELY
        elif adding is not None:
            st = adding.stats
            f.facts.append(
                f"{st.count} blocks, {human(st.bytes)}, allocated at {st.site.label} are alive, "
                f"{st.count - st.traced} of them from before the trace began and {st.traced} made in it after "
                "a step ended; none of that site's allocations was freed: it keeps adding, but the trace shows "
                "too few of its steps to tell a leak from a store the job means to keep."
            )
            f.missing.append(
                "live memory after each step (the collector's step samples): whether it kept growing"
            )
            f.leak_site = st.site.to_dict()
            f.score = LEAD
            if filling_site(ev) is adding:
                f.facts.append(
                    f"That is {st.bytes / (ev.allocated_bytes or 1):.0%} of the memory live at the OOM, "
                    f"{st.count} blocks from one line: what filled the device."
                )
                f.score = LIKELY
        elif (pile := _piled_site(ev)) is not None:
            st, size, n = pile
            f.facts.append(
                f"{n} blocks of exactly {human(size)} allocated at {st.site.label} are alive ({human(n * size)}, "
                f"{n * size / (ev.allocated_bytes or 1):.0%} of live memory), all from before the trace began: one "
                "small tensor kept again and again (a per-step or per-token value appended to a list) piles up "
                "like this; weights and optimizer state come in many sizes, one per parameter."
            )
            f.missing.append(
                "live memory after each step (the collector's step samples) or the job's step count: whether the "
                "pile grew with the steps"
            )
            f.leak_site = st.site.to_dict()
            f.score = LEAD
        elif ev.has_trace and ev.has_frames:
            f.score = 0.15
            f.facts.append("No allocation site in the trace kept blocks alive across steps.")
        else:
            f.missing.append(
                "live memory per step (the collector's step samples) or an allocator trace with stacks: "
                "at the moment of failure a leak and a too-large batch look the same"
            )
        if regrown is None:
            return f

    if graphs is not None and f.leak_site is not None:
        loc = graphs[0].call.label
        f.actions.append(
            f"At {loc} the model runs with gradients on and each output is kept: if it is an evaluation, "
            "wrap the loop in `torch.no_grad()` (or `torch.inference_mode()`); if the outputs are kept for "
            "later, keep `out.detach()` (or `.cpu()`, or a number with `.item()`) instead."
        )
        f.actions.append(
            "If the losses of several calls are summed for one backward (accumulation), call `backward()` "
            "on each call's loss instead: gradients accumulate the same, and each graph is freed at once."
        )
        if graphs[0].past_step:
            f.actions.append(
                "If a state is carried from one step into the next (an RNN's hidden state, a memory), detach "
                "it at each step (`hidden = hidden.detach()`): carried with its graph, every earlier step's "
                "activations stay alive (and `retain_graph=True` only hides the error that says so)."
            )
    elif f.leak_site is not None:
        site = f.leak_site
        loc = f"{site['filename']}:{site['line']} in {site['name']}"
        if isinstance(call := f.values.get("call"), str):
            f.actions.append(
                f"At {call}: if the model's outputs are kept from call to call, keep `out.cpu()` (or the "
                "numbers you need, with `.item()`) instead of the tensor on the device; if a module keeps them "
                "on itself, bound or clear that store."
            )
        f.actions.append(
            f"At {loc}: keep a number, not the tensor — `loss.item()` / `.detach().cpu()` before storing "
            "it in a list, dict or attribute that outlives the step."
        )
        f.actions.append(
            f"If {loc} runs in evaluation or logging, wrap it in `torch.no_grad()` so no graph is kept."
        )
        f.actions.append(
            "Clear collections that grow every step (metrics lists, caches) or bound their size."
        )
    else:
        f.actions.append(
            "Find what grows every step: run with the collector's allocator history (stacks='python') "
            "and look for a site whose blocks survive across steps; usually a loss or output kept without "
            "`.item()`/`.detach()`."
        )
    if ev.limit_bytes:
        f.values["limit_bytes"] = ev.limit_bytes
    if f.score >= LIKELY and ev.total_bytes and ev.total_bytes >= 8 * GiB:
        f.facts.append("A bigger GPU only delays this OOM: the growth does not stop.")
    return f
