"""fragmentation: enough memory was cached, but in pieces too small for the request.

Allocator behaviour relied on: the caching allocator keeps freed blocks reserved and serves new
requests from the best-fitting cached block of the *same stream and pool* (≤ 1 MiB requests from the
small pool, larger ones from the large pool). Blocks are split and merged only inside one segment.
When no cached block is large enough it asks the device for a new segment; if the device refuses, it
releases cached segments that are entirely free and retries. Free pieces inside segments that still
hold live blocks cannot be released: when the request is larger than the largest such piece but
smaller than their sum plus what the device still has free, the memory exists and the OOM is
fragmentation — typical of variable sequence lengths and interleaved long-lived/short-lived tensors.

The torch hint ("try expandable_segments") is printed whatever the settings; when
``expandable_segments`` is already on, that advice is wrong and we say so. Fragmentation needs the
block layout (a snapshot) to be proved; from the message alone (reserved-but-unallocated above the
request) it is only a candidate, unless the steps show what a leak would have shown: step samples whose
peaks passed this moment's need while live memory stayed flat, a long run of printed live memory that
stayed flat with holes left that are a large share of what the job could hold and the request several times
over, or a trace whose step floors did not climb with no earlier model calls still held.

Packing only helps a step that fits: when the failing step, set beside the step before it in the trace
(the same stacks allocation by allocation, larger tensors), would have needed more than the job could
hold at its peak, the holes only decided which allocation failed first.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from rules.base import (
    BEYOND_USABLE,
    CANDIDATE,
    LEAD,
    LIKELY,
    MIN_WASTE_FRACTION,
    POSSIBLE,
    STRONG,
    UNLIKE_EARLIER,
    Finding,
)
from triage.evidence import (
    TRACE_MIN_CYCLES,
    accumulating_site,
    aligned_step,
    growing_request,
    nothing_kept,
    turned_over,
    turning_window,
)
from triage.units import human

if TYPE_CHECKING:
    from triage.evidence import Evidence, Survivors

ID = "fragmentation"
VERDICT = "fragmentation"
OWNER = "algorithm"

RECORD_ROOM = (
    1.15  # a running peak's new record with less room than this times the moment's need: not decided
)
ROOM_SHRANK = 1.02  # the steps' typical peak above this times what the job could hold at the OOM: room shrank
LONG_FLAT_STEPS = 8  # printed steps of flat live memory before a long run shows nothing grew
FLAT_SHARE = 0.05  # of what the job could hold: growth over the run within this is flat
HOLES_TIMES_REQUEST = 4  # holes that could have held the request this many times over ...
HOLES_SHARE = 0.1  # ... and are this share of what the job could hold at least

# a step far above the earlier peaks (UNLIKE_EARLIER) is a new demand; so is one this much above them when
# that is beyond the whole range the earlier peaks spanned
BEYOND_EARLIER = 1.05


def _kept_every_step(ev: Evidence) -> Survivors | None:
    """A user site whose blocks outlived each of at least ``TRACE_MIN_CYCLES`` steps of the trace, none of
    them freed and not a store that turns over, when no step samples say whether live memory grew."""
    if ev.steps:
        return None
    kept = [
        s
        for s in ev.survivors
        if s.cycles >= TRACE_MIN_CYCLES
        and s.freed_at_site == 0
        and s.stats.site.kind == "user"
        and not s.bounded
        and not turned_over(ev, s)
    ]
    return max(kept, key=lambda s: s.stats.bytes) if kept else None


def _running_max(peaks: list[int]) -> bool:
    """The steps' peaks never fell and stayed flat between a few rises: a peak never reset
    (``max_memory_allocated()`` without ``reset_peak_memory_stats()``), which only says when a step set a new
    record, not what each step needed."""
    if len(peaks) < 4 or any(b < a for a, b in itertools.pairwise(peaks)):
        return False
    return 1 <= sum(1 for a, b in itertools.pairwise(peaks) if b > a) <= len(peaks) // 3


def _room_shrank(ev: Evidence, peaks: list[int]) -> str | None:
    """A sentence when the steps before, at the same batch size, typically peaked above all the job could
    hold at the OOM (its reservation plus the device's free memory, after the allocator released what it
    could): packed or not, this step would not have fitted; what the job may use had shrunk (memory outside
    its allocator grew), and the holes are beside the point."""
    usable = ev.usable_bytes
    if len(peaks) < 3 or usable is None or ev.batch_grew_from or ev.log_size_change:
        return None
    typical = sorted(peaks)[len(peaks) // 2]
    if typical <= ROOM_SHRANK * usable:
        return None
    return (
        f"The steps before typically peaked at {human(typical)}, more than the {human(usable)} the job could "
        "hold at the OOM: packed or not, this step would not have fitted. The memory it may use had shrunk "
        "(memory outside its allocator grew), not its layout."
    )


def evaluate(ev: Evidence) -> Finding | None:
    if not ev.is_cuda_oom or ev.device_had_room:
        return None  # the device would have given a fresh segment: the cache's layout did not matter
    req = ev.request_bytes
    ru = ev.reserved_unallocated_bytes
    if req is None or ru is None:
        return None
    free = ev.device_free_bytes or 0
    limit = ev.limit_bytes or (ev.reserved_bytes or 0) + free
    if ru + free < req:
        # the cached free memory and the device's free memory together could not have served the request
        return None
    usable_waste = ev.free_in_pool_bytes if ev.has_snapshot and ev.free_in_pool_bytes is not None else ru
    small_waste = bool(limit) and usable_waste < MIN_WASTE_FRACTION * limit
    f = Finding(rule=ID, verdict=VERDICT, score=CANDIDATE)
    f.values.update({"request_bytes": req, "free_in_reserved_bytes": ru, "device_free_bytes": free})
    largest = ev.largest_free_block_bytes if ev.has_snapshot else None
    pool_free = ev.free_in_pool_bytes if ev.has_snapshot else None
    if pool_free is not None and pool_free + free < req:
        # the cached memory sits in another pool or stream: the request could not use it even if packed
        return None
    if largest is not None:
        f.values["largest_free_block_bytes"] = largest
        pool = f" in the {ev.request_pool} pool" if ev.request_pool else ""
        if largest >= (ev.block_request_bytes or req):
            # a block that could have served the request existed: something else stopped it
            f.facts.append(
                f"A free block of {human(largest)}{pool} could have served the {human(req)} request, "
                "so the layout did not cause this OOM."
            )
            return None
        held = pool_free if pool_free is not None else ru
        if held >= req:
            f.facts.append(
                f"{human(held)} was reserved but free{pool}, yet its largest free block was {human(largest)}, "
                f"smaller than the {human(req)} requested; the device had {human(free)} free."
            )
        else:
            # the holes and the device's free memory together would have served it: the device could not
            # give one piece that large, and the holes cannot be released while live blocks pin their segments
            f.facts.append(
                f"{human(held)} was reserved but free{pool} in holes no larger than {human(largest)}, and the "
                f"device had {human(free)} free: together enough for the {human(req)} requested, but in no "
                "single piece (packed, or with expandable segments, it would have fitted)."
            )
        f.score = STRONG
    else:
        f.facts.append(
            f"{human(ru)} was reserved by PyTorch but unallocated, more than the {human(req)} requested: "
            "cached memory in pieces too small to use."
            if ru >= req
            else f"{human(ru)} was reserved by PyTorch but unallocated and the device had {human(free)} free: "
            f"together enough for the {human(req)} requested, but in no single piece."
        )
        f.missing.append(
            "a snapshot taken at the OOM (the largest free block decides whether the cached memory was usable)"
        )
        f.score = POSSIBLE - 0.05
    trend = ev.trend
    growing = trend is not None and (trend.rising_fraction >= 0.7 or trend.never_falls)
    if (
        trend is not None
        and growing
        and trend.steps >= 3
        and not trend.plateaued
        and turning_window(ev) is None
    ):
        f.facts.append(
            "Live memory grew step after step: the holes are a symptom of the growth, not its cause."
        )
        f.score = min(f.score - 0.25, POSSIBLE)
    needed = ev.needed_bytes
    peaks = ev.step_peaks if len(ev.steps) >= 3 else []
    # (a log that printed only each step's peak: its samples are the peaks)
    tops = peaks or (
        [s.peak_allocated_bytes for s in ev.steps] if ev.log_peaks_only and len(ev.steps) >= 3 else []
    )
    if (
        largest is None
        and ru >= req
        and trend is not None
        and trend.steps >= 3
        and not growing
        and tops
        and needed is not None
        and max(tops) >= needed
        and not ev.batch_grew_from
        and not (ev.other_process_bytes and ev.other_process_bytes > ru)
    ):
        # the allocator releases every cached segment it can before it gives up: what it still held
        # unallocated was in split segments; the same steps had run higher, and nothing was growing
        f.facts.append(
            f"{len(tops)} earlier steps of this size peaked at {human(max(tops))}, more than the "
            f"{human(needed)} this moment needed, and "
            f"{'the peaks printed' if ev.log_peaks_only else 'live memory after each step'} did not grow: the step fits, "
            f"and the {human(ru)} left in split segments after the allocator released what it could decided it."
        )
        f.score = max(f.score, LIKELY)
    elif (
        (usable := ev.usable_bytes) is not None
        and largest is None
        and needed is not None
        # the steps' peaks unprinted, or this moment's need with room for a quarter more
        and (not tops or usable >= UNLIKE_EARLIER * needed)
        and trend is not None
        and trend.steps >= LONG_FLAT_STEPS
        and not growing
        and not trend.staircase
        and needed <= usable
        and trend.growth_bytes <= FLAT_SHARE * usable
        and ru >= max(HOLES_TIMES_REQUEST * req, HOLES_SHARE * usable)
        and not ev.batch_grew_from
        and not (ev.other_process_bytes and ev.other_process_bytes > ru)
    ):
        # the floor between steps flat over a long run: nothing leaked, and steps like this one ran that long;
        # the holes the allocator could not release were a large share of what the job could hold and the
        # request several times over (with the peaks printed, this moment, a little above them, left room for
        # a quarter more)
        f.facts.append(
            f"Live memory between steps stayed flat over {trend.steps} printed steps, and {human(ru)} — "
            f"{ru / usable:.0%} of what the job could hold — sat in split segments the allocator could not "
            f"release, {ru / max(1, req):.0f}x the {human(req)} requested: the holes decided it "
            + (
                f"(this moment needed {human(needed)}, {human(usable - needed)} short of all it could hold)."
                if tops
                else "(how high this step would have gone is not printed)."
            )
        )
        if not tops:
            f.missing.append("each step's peak (torch.cuda.max_memory_allocated()) beside its live memory")
        f.score = max(f.score, LIKELY)
    grow = growing_request(ev)
    if grow is not None:
        n, first, last = grow
        f.facts.append(
            f"The request is the latest of {n} allocations from its own line that only grew ({human(first)} → "
            f"{human(last)}): a tensor re-made larger at every call (a cache grown token by token). How far it "
            "was going is not in the record: packed, a later one may still have failed."
        )
        f.missing.append("how far the growth was going (the generation's max_new_tokens, the longest input)")
        f.score = min(f.score, LEAD)
    shrunk = _room_shrank(ev, peaks)
    if shrunk is not None:
        f.facts.append(shrunk)
        f.score = min(f.score, CANDIDATE)
    if ev.batch_grew_from:
        f.facts.append("The batch size grew just before the OOM: the demand changed, not the layout.")
        f.score -= 0.3
    if ev.other_process_bytes and ev.other_process_bytes > ru:
        f.score -= 0.15
    if small_waste:
        f.facts.append(
            f"The cached free memory is under {MIN_WASTE_FRACTION:.0%} of what the job may hold: a minor factor."
        )
        f.score = min(f.score - 0.15, POSSIBLE)  # packing it would not have bought the job anything real
    tl = ev.oom_timeline
    if ev.step is not None and ev.step <= 1:
        # holes build up over iterations of a varying workload; in the first steps the batch itself is the
        # likelier story, and the snapshot cannot tell the two apart
        f.facts.append(
            f"It failed at step {ev.step}: too early for holes to have built up; the batch may just be too large."
        )
        f.score -= 0.3
    elif (
        ev.step is None
        and not ev.steps
        and tl is not None
        and tl.start_allocated == 0
        and ev.freed_calls is not None
        and ev.freed_calls <= 1
    ):
        # the same, read off a trace that begins at the model's load: at most one forward pass came and went
        f.facts.append(
            "The trace begins at the model's load and at most one forward pass ended before the OOM: too early "
            "for holes to have built up; the batch may just be too large."
        )
        f.score -= 0.3
    promised = ev.promised_bytes
    needed = ev.needed_bytes
    if promised is not None and needed is not None and needed <= 0.9 * promised:
        f.facts.append(
            f"The job would fit the {human(promised)} it was promised: the holes only matter at a limit set below that."
        )
        f.score -= 0.3
    if free >= req and (ev.fraction_cap_bytes or ev.vgpu_limit_bytes or ev.fraction_rejected):
        # with the device able to give a new segment, only a cap refused it: the layout did not decide
        f.facts.append(
            f"The device still had {human(free)} free, enough for a new segment: a cap refused it, not the layout."
        )
        f.score = min(f.score, CANDIDATE)
    peaks = ev.earlier_peaks
    needed = ev.needed_bytes
    beyond = aligned_step(ev)
    usable = ev.usable_bytes
    if beyond is not None and usable is not None and beyond.predicted > BEYOND_USABLE * usable:
        f.facts.append(
            f"Set beside the step before it (the same stacks, {beyond.ratio:.1f}x the memory so far), this "
            f"step would have needed {human(beyond.predicted)} at its peak, more than the {human(usable)} "
            "the job could hold: packed, it would still have failed."
        )
        f.score = min(f.score, CANDIDATE)
    elif peaks and needed is not None:
        before, spread = max(peaks), max(peaks) - min(peaks)
        # the layout is proved guilty only for a demand the job had met before: far above the earlier
        # peaks, or above them by more than the earlier steps ever varied (a longer batch after steps of
        # one size) — the step is new, and whether it fits at all, packed or not, is not known
        if needed > UNLIKE_EARLIER * before:
            f.facts.append(
                f"At the OOM this step already wanted {human(needed)}, far more than the {human(before)} the "
                "earlier steps peaked at: whether the step fits at all, packed or not, is not known."
            )
            f.score = min(f.score, LEAD)
        elif (
            needed > BEYOND_EARLIER * before
            and needed - before > spread
            and (usable is None or usable < UNLIKE_EARLIER * needed)
        ) or (
            # a new record of a running peak (printed peaks that only ever rose) with little room left: this
            # step is longer than any before and how far it was going is not known
            needed > before and _running_max(peaks) and usable is not None and usable < RECORD_ROOM * needed
        ):
            # (with room left for a quarter more than this moment's need, a step this close to the earlier
            # ones would have fitted packed: only one far above them could not)
            f.facts.append(
                f"At the OOM this step already wanted {human(needed)}: {human(needed - before)} more than the "
                f"{len(peaks)} earlier steps ever peaked at ({human(min(peaks))}–{human(before)}), and it had not "
                "finished: a step unlike the earlier ones, which may not fit at all, packed or not."
            )
            f.score = min(f.score, LEAD)
    adding = accumulating_site(ev)
    if adding is not None:
        f.facts.append(
            f"{human(adding.stats.bytes)} is held at {adding.stats.site.label}, made before the trace began and "
            "again in it and never freed: memory that keeps being added leaves holes behind; whether it grew "
            "to the OOM is not in this input."
        )
        f.score = min(f.score, LEAD)
    every = _kept_every_step(ev)
    if every is not None and adding is None:
        f.facts.append(
            f"{every.stats.site.label} kept its blocks at each of the {every.cycles + 1} steps the trace shows and "
            f"freed none ({human(every.stats.bytes)}): blocks kept between each step's temporaries split the "
            "segments, so the holes may be the leak's; whether it grew to the OOM is not in this input."
        )
        f.score = min(f.score, LEAD)
    kc = ev.kept_calls
    if (
        kc is not None
        and kc.before is not None
        # held as its next call began, against the most held as one began before; after its last call (the
        # loss, the backward) a step holds all of them, one more than when its last one began
        and kc.calls > kc.before + (0 if kc.in_call else 1)
        and peaks
        and needed is not None
        and needed > max(peaks)
    ):
        # the step runs the model call after call and holds them all for one backward (a rollout, summed
        # micro-batches); it holds more of them than any step before: its demand is new
        f.facts.append(
            f"This step holds {kc.calls} calls of the model at {kc.call.label} ({human(kc.bytes)}), more than "
            f"any step before held at once ({kc.before}), and wanted more than every earlier step's peak: a "
            "step unlike the earlier ones, which may not fit at all, packed or not."
        )
        f.score = min(f.score, LEAD)
    # with stacks, a trace of a few steps in which no site's surviving blocks were made in different steps
    # shows what a leak would have kept meanwhile: nothing; and a trace of a few steps whose floors did not
    # climb shows that nothing grew, whatever outlived its step (a server's requests live across steps)
    watched = (
        (ev.has_frames and ev.trace_steps >= TRACE_MIN_CYCLES and not any(s.cycles for s in ev.survivors))
        or nothing_kept(ev)
        # earlier calls of the model still held are a leak too small over a few steps to lift the floor
        or (ev.trace_floor_flat and ev.kept_calls is None)
        # a loop with no optimizer step (a server: no step will ever show in its trace) whose survivors came
        # and went around one level while the trace watched them turn over (per-request caches): the trace
        # saw that nothing kept grew
        or (
            ev.has_frames
            and ev.trace_steps == 0
            and bool(kept := [s for s in ev.survivors if s.cycles])
            and all(turned_over(ev, s) for s in kept)
        )
    )
    if (
        trend is None
        and len(ev.steps) < 2
        and ev.has_snapshot
        and ev.trace_steps < 2 * TRACE_MIN_CYCLES
        and not watched
    ):
        # a leak leaves holes too (its survivors pin segments the step's temporaries were split from)
        f.facts.append(
            f"Nothing here shows whether live memory grew from step to step (no step samples; the trace covers "
            f"{ev.trace_steps} step(s)): a leak leaves the same holes behind."
        )
        f.missing.append("live memory per step (the collector's step samples) or a longer allocator trace")
        f.score = min(f.score, LEAD)
    in_hand = (
        largest is not None
        and pool_free is not None
        and pool_free >= req
        and needed is not None
        and ev.reserved_bytes is not None
        and needed <= ev.reserved_bytes
    )
    if in_hand and ev.device_unseen:
        # what it held and what it asked for fitted in the segments it had already reserved: no limit on the
        # device (its size, a neighbour's share, a slice) was reached by the job's need, only by its holes
        f.facts.append(
            f"Packed, what it held and asked for ({human(needed or 0)}) fitted in the {human(ev.reserved_bytes or 0)} "
            "it had already reserved: whatever else was on the device, the holes decided this OOM."
        )
    if (ev.device_unseen and not in_hand) or ev.slice_sized:
        # holes only matter at a limit; whether the limit was the job's own device or a neighbour's share or
        # a smaller slice than it asked for is not in this input
        f.facts.append(
            "Which limit the job hit (its own GPU, a neighbour's share, a smaller slice than it asked for) is "
            "not in this input: the holes decided it only if that limit was the job's to live with."
        )
        f.score = min(f.score, LEAD)
    if ev.expandable_segments:
        f.facts.append(
            "expandable_segments is already on, so torch's hint to enable it does not apply; "
            "what remains are holes between live tensors inside the mapped segments."
        )
        f.score = min(f.score, LIKELY - 0.05)
        f.actions.append(
            "Reduce the variety of tensor sizes (pad or bucket sequence lengths to a few fixed sizes) and "
            "free long-lived tensors allocated in the middle of the step."
        )
    else:
        f.actions.append(
            "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: segments grow in place instead of leaving holes."
        )
        f.actions.append(
            "Pad or bucket variable sequence lengths so tensor sizes repeat; allocate long-lived buffers before the loop."
        )
    if ev.alloc_conf:
        f.values["PYTORCH_CUDA_ALLOC_CONF"] = ev.alloc_conf
    return f
