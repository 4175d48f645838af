"""workload_too_large: the job's own peak does not fit in the memory it may use.

Allocator behaviour relied on: a training step's memory is a fixed part (weights, gradients, optimizer
state — present before the step starts and after it ends) plus a part that scales with the batch
(activations saved for backward, temporaries). The allocator fails when the live blocks plus the new
request exceed what the process can reserve: the device's free memory plus its own cached free blocks.
When nothing else on the device is large (no neighbour process, no quota below the device), when live
memory does not grow across steps (no leak), and when the cached free memory could not have served the
request anyway (no fragmentation), the step itself is too big.

Without the step samples (a replay), a step that failed within a few percent of all the job could hold is
too large when the trace shows nothing kept that could have filled the device instead (several forward
passes came and went with no block surviving across them, or the trace begins with the model's load and
has seen no more than the first steps); packing the cache's last holes would have put the failure off by
an allocation or two, not let the step finish. Earlier forward passes still held (kept outputs) fill the
device the same way and keep it a candidate.

A step that wants far more than every earlier one is new (a longer input, an evaluation pass): whether
it could fit is settled by the step before it in the trace when that step ran the same stacks,
allocation by allocation, up to the failing request (``triage.evidence.aligned_step``). Its tensors so
far are some factor larger; the step before went on growing to its peak after that allocation, and the
failing step, scaled by the same factor, would have needed that much. More than the job could hold (by
5%): too large, and the holes in the cache decided nothing.

A log that says the input grew (a curriculum's ``seq_len 2048 -> 4096``, progressive resizing, a
batch-size ramp) after steps had run at the smaller size, with no step printed after it, shows the first
step at the larger size failing: the demand changed, the memory it may use did not.

One allocation that does not fit beside the least live memory the log ever printed (the weights, just
loaded) is too large whatever else was released. An inference server that sizes itself at start-up says so
in its own words (vLLM's KV cache too small for its max_model_len, TGI's warm-up prefill): the service's
configuration against its device. Steps that fitted before at this batch size, on a device a neighbour now
shares, are not too large: the device has less room (``Evidence.neighbour_took_margin``).

The maximum batch size is estimated from the fixed part and the per-sample part:
- from completed steps, when the collector sampled them: fixed = live memory after the last step,
  per-sample = (the step's peak − fixed) / batch size;
- else from the failing step: per-sample ≥ (live memory at the OOM + the request − fixed) / batch size,
  which makes the estimate an upper bound (the step had not reached its peak yet).
The reservation the allocator could not use at the OOM (split segments) is taken off what is usable for
an estimate from completed steps; an upper bound keeps it, since a smaller batch strands less. A failing
step set beside the step before it gives its whole peak, not just where it failed: a tighter ceiling
(the allocator's overhead at that peak is still not counted).
``max_batch_size = floor((usable − fixed) / per-sample)`` where usable is what this process could have
reserved (its reservation plus the device's free memory, capped by a fraction cap).
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

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
    CUDA_CONTEXT_MAX,
    FIRST_STEPS,
    LATE_RISES,
    aligned_step,
    filling_site,
    frame_key,
    kept_graphs,
    large_late_rise,
    live_under_calls,
    model_call,
    nothing_kept,
    per_step_blocks,
    regrown_across_calls,
    regrown_request,
    stored_since_steps,
)
from triage.units import GiB, human

if TYPE_CHECKING:
    from triage.evidence import Evidence
    from triage.messages import OomMessage

ID = "workload_too_large"
VERDICT = "workload_too_large"
OWNER = "algorithm"

EARLY_STEPS = FIRST_STEPS  # an OOM in the first steps: nothing had time to leak
CROWDED_UNKNOWN_TOTAL = 8 * GiB  # held by neighbours on a device of unknown size: a tenth of a large GPU


def usable_bytes(ev: Evidence) -> int | None:
    """What this process could have held at most at the OOM (``Evidence.usable_bytes``)."""
    return ev.usable_bytes


def _completed_steps(ev: Evidence) -> list[tuple[int, int, int]]:
    """(start level, peak, batch) of each completed step the collector sampled: a step starts at the
    live memory the previous one ended with."""
    out: list[tuple[int, int, int]] = []
    if ev.log_peaks_only:
        return out  # peaks printed alone: where each step started is not known
    for prev, cur in itertools.pairwise(ev.steps):
        batch = cur.batch_size or ev.batch_size
        if batch and batch > 0:
            out.append((prev.allocated_bytes, cur.peak_allocated_bytes, batch))
    return out


def _buffer(ev: Evidence) -> tuple[int, int, int] | None:
    """(bytes, batch size it filled at, live memory without it) of a bounded buffer: live memory that
    grew over the first steps and then stopped (kept outputs, features, a replay cache).

    Its entries are per-batch tensors, so its size per sample is what it grew by over the batch size
    in effect while it grew, and the memory that does not scale is the live memory after the last step
    run at that batch size, less the buffer. (A later step at another batch size already holds entries
    of the new size: its level mixes the two.)
    """
    trend = ev.trend
    if trend is None or not trend.plateaued or trend.early_growth_bytes <= 0 or len(ev.steps) < 2:
        return None
    grew: dict[int, int] = {}  # batch size -> net bytes live memory grew by between steps at that size
    for a, b in itertools.pairwise(ev.steps):
        size = b.batch_size or ev.batch_size
        if size and size > 0 and (a.batch_size or ev.batch_size) == size:
            grew[size] = grew.get(size, 0) + b.allocated_bytes - a.allocated_bytes
    grew = {k: v for k, v in grew.items() if v > 0}
    if not grew:
        return None
    fill_batch = max(grew, key=lambda k: grew[k])
    level = next(
        s.allocated_bytes for s in reversed(ev.steps) if (s.batch_size or ev.batch_size) == fill_batch
    )
    size = min(trend.early_growth_bytes, level)
    return size, fill_batch, level - size


def _batch_fit(ev: Evidence) -> tuple[int, float, int, int] | None:
    """(fixed, per sample, smaller, larger batch size) from the peaks of completed steps run at two batch sizes
    (a batch-size sweep, a ramp): each step's peak is fixed memory plus per-sample memory times its batch, so
    two sizes give both. The two largest sizes run are used (the nearest to the failing one); a per-sample
    cost that is not positive, or fixed memory below nothing, is no fit."""
    peaks: dict[int, int] = dict(ev.log_batch_peaks)
    for st in ev.steps:
        if st.batch_size and st.batch_size > 0:
            peaks[st.batch_size] = max(peaks.get(st.batch_size, 0), st.peak_allocated_bytes)
    if len(peaks) < 2:
        return None
    b1, b2 = sorted(peaks)[-2:]
    per_sample = (peaks[b2] - peaks[b1]) / (b2 - b1)
    fixed = int(peaks[b1] - b1 * per_sample)
    if per_sample <= 0 or fixed < 0:
        return None
    return fixed, per_sample, b1, b2


def estimate_max_batch(ev: Evidence) -> tuple[int | None, dict[str, Any]]:
    info: dict[str, Any] = {}
    batch = ev.batch_size
    usable = usable_bytes(ev)
    if not batch or batch <= 0 or usable is None:
        return None, info
    fit = _batch_fit(ev)
    if fit is not None and batch > fit[3]:
        fixed_fit, per, b1, b2 = fit
        est = math.floor((usable - fixed_fit) / per)
        if ev.is_cuda_oom:
            est = min(est, batch - 1)
        info.update(
            {
                "source": f"completed steps at batch sizes {b1} and {b2}",
                "fixed_bytes": fixed_fit,
                "per_sample_bytes": int(per),
                "usable_bytes": usable,
            }
        )
        return max(0, est), info
    fixed: int | None = None
    per_sample: float | None = None
    steps = _completed_steps(ev)
    needed = ev.needed_bytes
    if steps:
        # the most demanding completed step per sample; the next step starts where the last one ended
        per_sample = max((peak - start) / b for start, peak, b in steps)
        fixed = ev.steps[-1].allocated_bytes
        info["source"] = f"{len(steps)} completed steps"
        buf = _buffer(ev)
        if buf is not None:
            # counted as growing with the batch: the conservative reading, since a too-large answer
            # OOMs again once the buffer turns over at the new size
            size, fill_batch, fixed = buf
            per_sample += size / fill_batch
            info["source"] += " (bounded buffer counted per sample)"
            info["buffer_bytes"] = size
        if needed is not None and (needed - fixed) / batch > per_sample:
            per_sample = (needed - fixed) / batch  # the failing step wanted more per sample than any before
            info["source"] = "failing step (upper bound)"
    elif needed is not None:
        # the failing step starts where the last sampled step ended; without a sample, from the trace
        fixed = ev.steps[-1].allocated_bytes if ev.steps and not ev.log_peaks_only else _fixed_from_trace(ev)
        per_sample = (needed - fixed) / batch
        info["source"] = "failing step (upper bound)"
    aligned = aligned_step(ev)
    if fixed is not None and per_sample is not None and aligned is not None and needed is not None:
        # the failing step beside the one before it: what it would have needed at its peak, still a ceiling
        # (the allocator's own overhead at that peak is not counted)
        at_peak = (aligned.predicted - fixed) / batch
        if aligned.predicted > needed and at_peak > per_sample:
            per_sample = at_peak
            info["source"] = "failing step set beside the step before it (upper bound)"
    if fixed is None or per_sample is None or per_sample <= 0:
        return None, info
    # at the OOM the allocator has already released every cached segment it could; what it still holds
    # unallocated is split segments this allocation pattern leaves behind: tensors cannot use it. An
    # upper bound leaves it in: it was stranded at the failing batch, and a smaller batch strands less
    # (an H200 step at batch 95 stranded 22.8 GiB; taking it all away put the "upper bound" at 78 where
    # 82 fitted)
    upper = info["source"].endswith("(upper bound)")
    stranded = 0 if upper else ev.reserved_unallocated_bytes or 0
    if stranded:
        info["stranded_bytes"] = stranded
    est = math.floor((usable - stranded - fixed) / per_sample)
    if ev.is_cuda_oom:
        est = min(est, batch - 1)  # the failing batch itself did not fit
    info.update({"fixed_bytes": fixed, "per_sample_bytes": int(per_sample), "usable_bytes": usable})
    return max(0, est), info


def _beyond(ev: Evidence, usable: int | None) -> str | None:
    """A sentence when the failing step, set beside the step before it (``aligned_step``), would have
    needed more than the job could hold at its peak."""
    a = aligned_step(ev)
    if a is None or usable is None or a.predicted <= BEYOND_USABLE * usable:
        return None
    besides = f", besides {a.unmatched} it made that the earlier did not" if a.unmatched else ""
    return (
        f"Set beside the step before it (the same stacks, allocation by allocation{besides}, {a.ratio:.1f}x the "
        f"memory so far: a longer input or a larger batch), this step would have needed {human(a.predicted)} "
        f"at its peak, more than the {human(usable)} the job could hold: it does not fit, packed or not."
    )


def _call_line(ev: Evidence) -> tuple[Any, Any, Any] | None:
    """The line that called the model in the failing step: the failing allocation's own when it ran
    inside the forward; else (the OOM came in the loss, the backward or the optimizer) the call line
    under which most of the live memory was allocated."""
    oom = ev.oom_entry
    call = model_call(ev.classifier, oom.frames) if oom is not None and oom.frames else None
    if call is not None or ev.snapshot is None or ev.oom_timeline is None:
        return call
    under = live_under_calls(ev)
    return max(under, key=lambda c: under[c][1]) if under else None


def _first_forward(ev: Evidence, end: int) -> int | None:
    """Trace index of the first allocation made under the line that called the model."""
    tl = ev.oom_timeline
    call = _call_line(ev)
    if tl is None or call is None:
        return None
    seen: dict[int, bool] = {}
    raw = tl.raw
    for i in tl.alloc_indices:
        if i > end:
            break
        frames = raw[i].get("frames")
        if not frames:
            continue
        hit = seen.get(id(frames))
        if hit is None:
            hit = seen[id(frames)] = any(isinstance(f, dict) and frame_key(f) == call for f in frames)
        if hit:
            return i
    return None


def _fixed_from_trace(ev: Evidence) -> int:
    """Live memory before the failing step began: the lowest level since the first forward pass in
    the trace (the end of a step, or the weights and the batch just before the first forward).

    A trace that also recorded the model being loaded starts at nothing; the line that called the
    model (from the stacks) tells where training began. Without stacks, the lowest level since the trace
    began; without a trace, nothing is known to be fixed.
    """
    tl = ev.oom_timeline
    if tl is None or not tl.levels:
        return 0
    end = ev.oom_entry.index if ev.oom_entry is not None else len(tl.levels) - 1
    start = _first_forward(ev, end)
    # from just before the first forward's first block; else from the trace's start
    low = min(tl.levels[start - 1 : end + 1]) if start else min(0, min(tl.levels[: end + 1]))
    return max(0, low + tl.start_allocated)


def _stranded(ev: Evidence, needed: int | None, usable: int | None) -> str | None:
    """A sentence when the job's live memory plus the request fitted what it could hold, and the request
    failed only because its cached free memory sat where it could not serve it: in holes smaller than the
    request (with the device's free memory, enough packed) or in another stream's or pool's segments that
    live blocks keep from being released."""
    req = ev.request_bytes
    largest = ev.largest_free_block_bytes
    if req is None or needed is None or usable is None or needed > usable:
        return None
    free = ev.device_free_bytes or 0
    pool = ev.free_in_pool_bytes
    ru = ev.reserved_unallocated_bytes or 0
    if ru < MIN_WASTE_FRACTION * usable:
        return None  # too little was stranded to have decided anything but this one allocation
    if not ev.has_snapshot:
        # the message alone: the reservation held more free memory than the request, where it could not
        # serve it (the allocator had released every cached segment it could before giving up)
        if ru < req:
            return None
        return (
            f"{human(ru)} of the reservation was free, more than the {human(req)} requested, and the step had "
            f"needed {human(needed)} of the {human(usable)} it could hold: the memory was there, not in one "
            "piece; whether the rest of the step fits is not known."
        )
    if largest is None or largest >= (ev.block_request_bytes or req):
        return None
    if pool is not None and pool < req and pool + free >= req:
        return (
            f"{human(pool)} free in the pool's holes and {human(free)} free on the device would, packed, "
            f"have held the {human(req)} request: the step had not outgrown the device when it failed."
        )
    if ru >= req and (pool is None or pool < req):
        return (
            f"{human(ru)} of the reservation was free but in other streams' or pools' segments that live "
            f"blocks keep from being released, or in holes too small: the {human(req)} request had the "
            "memory, not where it could use it; the step had not outgrown the device when it failed."
        )
    return None


def _serving_config(m: OomMessage, f: Finding) -> Finding:
    """An inference server's own profile at start-up (``serving-config`` messages): the weights leave its
    memory budget too small for the sequence length or prefill its flags ask for. That is the service's
    configuration against its device, before any request: nothing could have leaked."""
    x = m.extra
    if x.get("limit") == "prefill":
        f.facts.append(
            f"{x.get('engine', 'The server').upper()} could not run its warm-up prefill of {x.get('prefill_tokens')} "
            "tokens in the memory left after the weights: its flags ask for more than this device holds."
        )
        f.actions.append(
            "Lower --max-batch-prefill-tokens (and --max-total-tokens / --max-input-length with it), or shard the "
            "model over more GPUs (--num-shard), or quantize it."
        )
    else:
        if x.get("kv_tokens"):
            what = (
                f"its KV cache holds {x['kv_tokens']} tokens, fewer than one request of max_model_len "
                f"{x.get('max_model_len')} needs"
            )
        elif m.requested_bytes and x.get("kv_available_bytes"):
            what = (
                f"one request of max_model_len {x.get('max_model_len')} needs {human(m.requested_bytes)} of KV cache, "
                f"more than the {human(int(x['kv_available_bytes']))} left for it"
            )
        else:
            what = "nothing of its budget was left for the KV cache after the weights and the profiling run"
        f.facts.append(
            f"vLLM sized itself at start-up and {what}: the model and its max_model_len do not fit this "
            "device's budget (total memory × gpu_memory_utilization)."
        )
        f.actions.append(
            "Lower --max-model-len (or --max-num-seqs / --max-num-batched-tokens), raise "
            "--gpu-memory-utilization if nothing else shares the GPU, or serve with more GPUs "
            "(--tensor-parallel-size) or a quantized model."
        )
    f.missing.append("the device's size and its other processes (the collector's device record)")
    f.score = LIKELY
    return f


def evaluate(ev: Evidence) -> Finding | None:
    if not ev.is_cuda_oom or ev.device_had_room:
        return None  # with room on the device, no step of the job's was too large for it
    f = Finding(rule=ID, verdict=VERDICT, score=CANDIDATE)
    if ev.message is not None and ev.message.format == "serving-config":
        return _serving_config(ev.message, f)
    if ev.message is not None and ev.message.format == "vllm-startup":
        # the "request" is the budget vLLM was told to take, not a tensor; a smaller one only moves the
        # shortage to its KV cache, and the memory missing is held outside it
        f.facts.append(
            f"vLLM was set to take {ev.message.extra.get('gpu_memory_utilization')} of the device "
            f"({human(ev.request_bytes or 0)}) and found {human(ev.device_free_bytes or 0)} free: a lower "
            "--gpu-memory-utilization would start it, with that much less for its KV cache."
        )
        f.actions.append(
            "Lower --gpu-memory-utilization to what is free, or give the server a GPU of its own."
        )
        return f
    needed = ev.needed_bytes
    usable = usable_bytes(ev)
    early = ev.step is not None and ev.step <= EARLY_STEPS
    trend = ev.trend
    flat = (
        trend is not None
        and trend.steps >= 3
        and (trend.plateaued or (trend.rising_fraction < 0.5 and not trend.staircase))
        and trend.tail_rises < LATE_RISES  # flat, then up at every step to the OOM: a leak that began late
        and not large_late_rise(trend, ev.limit_bytes)
    )
    beyond = None if early else _beyond(ev, usable)
    if needed is not None and usable is not None:
        f.facts.append(
            f"At the OOM the job held {human(ev.allocated_bytes or 0)} and asked for {human(ev.request_bytes or 0)} more; "
            f"it could hold at most {human(usable)} (its reservation plus the device's free memory)."
        )
        f.values.update({"needed_bytes": needed, "usable_bytes": usable})
    if early:
        f.facts.append(
            f"It failed in the model's setup ({ev.setup_call}), before the first step: nothing had time to accumulate."
            if ev.setup_call
            else f"It failed at step {ev.step}: nothing had time to accumulate."
        )
        f.score = LIKELY
    elif flat and trend is not None:
        if trend.plateaued:
            f.facts.append(
                f"{ev.step_series} grew for a while, then stopped, over {trend.steps} steps: "
                "a bounded buffer filling up, not a leak."
            )
        else:
            f.facts.append(f"{ev.step_series} did not grow over {trend.steps} steps.")
        f.score = LIKELY
    elif (
        (ev.has_trace or trend is not None)
        and not any(s.cycles >= 3 and not s.bounded for s in ev.survivors)
        and not (trend is not None and trend.steps >= 3 and trend.growth_bytes > 0 and trend.never_falls)
        and not (trend is not None and large_late_rise(trend, ev.limit_bytes))
        and regrown_across_calls(ev) is None
        and regrown_request(ev) is None
        and per_step_blocks(ev) is None
        and filling_site(ev) is None
    ):
        # the history could have shown growth and did not
        f.score = POSSIBLE
        if needed is not None and usable is not None and needed > usable:
            # the history could have shown a leak and did not; the step wants more than all it could get
            f.facts.append(
                f"The step needed {human(needed)}, more than the {human(usable)} it could ever hold."
            )
            f.score = LIKELY
        elif beyond is not None:
            f.facts.append(beyond)
            f.score = LIKELY - 0.05
        elif (
            needed is not None
            and usable is not None
            and usable - needed < MIN_WASTE_FRACTION * usable
            and nothing_kept(ev)
        ):
            # within a sliver of all it could hold, the step still going: packing the cache would have put
            # the failure off by an allocation or two
            f.facts.append(
                f"The step needed {human(needed)}, all but {human(usable - needed)} "
                f"({(usable - needed) / usable:.1%}) of the most it could ever hold, and had not finished."
            )
            f.score = LIKELY - 0.05
    if ev.has_snapshot and ev.largest_free_block_bytes is not None and ev.request_bytes is not None:
        ru = ev.reserved_unallocated_bytes or 0
        if needed is not None and usable is not None and needed > usable and ru < ev.request_bytes:
            f.facts.append(
                f"Only {human(ru)} of the reservation was free: caching did not hide the memory it needed."
            )
            f.score = max(f.score, POSSIBLE) + 0.05
    # a neighbour holding a tenth of the device or more: the job may not be what ran out
    # (the device's size unknown: a neighbour holding more than a large GPU's tenth)
    crowded = bool(
        ev.other_process_bytes
        and ev.other_process_bytes > (0.1 * ev.total_bytes if ev.total_bytes else CROWDED_UNKNOWN_TOTAL)
    )
    neighbour_penalty = 0.2 if crowded else 0.0
    f.score -= neighbour_penalty
    if (
        trend is not None
        and trend.steps >= 3
        and needed is not None
        and needed <= trend.peak_bytes
        and not ev.batch_grew_from
        and not ev.log_size_change
    ):
        f.facts.append(
            f"{trend.steps} steps of this size completed before (peak {human(trend.peak_bytes)}): "
            "the step itself fits; something else changed."
        )
        f.score = min(f.score, CANDIDATE)
    if (
        ev.has_snapshot
        and ev.request_bytes is not None
        and ev.free_in_pool_bytes is not None
        and ev.largest_free_block_bytes is not None
        and (ev.block_request_bytes or ev.request_bytes) > ev.largest_free_block_bytes
        and ev.free_in_pool_bytes >= ev.request_bytes
    ):
        f.facts.append(
            f"{human(ev.free_in_pool_bytes)} was free in the request's own pool: packed, it would have fitted."
        )
        if beyond is not None:
            f.facts.append("Packed, it would have failed later in the step (above).")
        elif usable is None or ev.free_in_pool_bytes >= MIN_WASTE_FRACTION * usable:
            f.score -= 0.2
        else:  # a sliver of what the job may hold: the next allocation of the step would have failed instead
            f.facts.append(f"But that is {ev.free_in_pool_bytes / usable:.1%} of what the job could hold.")
    if early and ev.mig_profile and not ev.declared_total_bytes and f.score > POSSIBLE:
        # a first step that does not fit a MIG slice nothing says the job asked for is the slice's size as
        # much as the batch's: the slice (gpu_quota) speaks for itself, this stays a candidate beside it
        f.facts.append(
            f"It runs on a MIG slice ({ev.mig_profile}) and nothing says the job asked for one: the first step not "
            "fitting says as much about the slice as about the batch."
        )
        f.score = POSSIBLE
    grown = ev.batch_grew_from
    if grown:
        f.facts.append(
            f"The batch grew to {ev.batch_size} (from at most {grown} in the earlier steps) just before the OOM: "
            "the demand changed, the memory it may use did not."
        )
        f.score = max(f.score, LIKELY - neighbour_penalty) + 0.15
    elif ev.log_size_change is not None:
        what, old, new = ev.log_size_change
        f.facts.append(
            f"The log says the input grew just before the OOM ({what} {old} -> {new}), after steps at {old} had "
            f"run: the first step at {new} is the one that failed. The demand changed, the memory it may use "
            "did not."
        )
        f.score = max(f.score, LIKELY - neighbour_penalty) + 0.1
        grown = old
    # the collector's samples, however few; else the steps the trace shows
    peaks = ev.step_peaks if len(ev.steps) >= 2 else ev.earlier_peaks
    if (
        peaks
        and needed is not None
        and (usable is None or needed <= usable)
        and not early
        and not grown
        and needed > UNLIKE_EARLIER * max(peaks)
    ):
        # the same batch wants far more than every earlier step, and had not outgrown what the job could hold:
        # a longer input, an evaluation pass run with gradients on, or tensors kept from pass to pass inside
        # it; the steps say nothing about which
        f.facts.append(
            f"At the OOM this step already wanted {human(needed)}, far more than the {human(max(peaks))} every "
            "earlier step peaked at, with the same batch size: something in this step differs (a longer input, "
            "an evaluation pass with gradients on, tensors kept from pass to pass)."
        )
        if beyond is not None:
            if beyond not in f.facts:
                f.facts.append(beyond)  # the same code with larger tensors: it does not fit, packed or not
        elif (
            flat
            and usable is not None
            and 0 <= usable - needed < MIN_WASTE_FRACTION * usable
            and (ev.reserved_unallocated_bytes or 0) < MIN_WASTE_FRACTION * usable
        ):
            # whatever it ran, it had taken all but a sliver of what the job could hold and was not done;
            # the steps rule out a leak, and packing the cache would have bought less than that sliver
            f.facts.append(
                f"Whatever it ran, it had taken all but {human(usable - needed)} of the {human(usable)} the job "
                "could hold and had not finished; packing the cache would have bought less than that."
            )
            f.score = min(f.score, LIKELY - 0.05)
        else:
            f.missing.append(
                "what this step ran that the earlier ones did not (its input sizes, train or eval)"
            )
            f.score = min(f.score, LEAD)
    stored = None if early or grown else stored_since_steps(ev)
    if stored is not None:
        site, n, size = stored
        f.facts.append(
            f"But {n} blocks, {human(size)}, made at {site.label} before the trace began are still alive, beyond "
            "what the last sampled step left: stored since the steps (outputs or metrics kept in a loop), and "
            "without them this moment needed no more than the earlier steps peaked at."
        )
        f.score = min(f.score, LEAD)
    graphs = kept_graphs(ev)
    unsure = kept_graphs(ev, unproven=True) if graphs is None and not early else None
    kept = graphs or unsure
    if kept is not None:
        kc, peak = kept
        f.facts.append(
            f"{human(kc.bytes)} of it is {kc.calls} earlier calls of the model at {kc.call.label}, still "
            + (
                f"alive; without them this moment needed no more than the {human(peak)} earlier steps peaked at."
                if peak is not None
                else f"alive; without them this moment needed {human((ev.needed_bytes or 0) - kc.bytes)}, which fitted."
            )
        )
        f.score = min(f.score, CANDIDATE if graphs is not None else LEAD)
    # the step set beside the one before it would not have fitted packed: the holes decided nothing
    stranded = None if early or beyond is not None else _stranded(ev, needed, usable)
    if stranded is not None and grown and needed is not None:
        # after the batch grew, the stranded memory is the story only if it is more than what the bigger
        # batch added to the step so far
        before = [
            s.peak_allocated_bytes for s in ev.steps if s.batch_size is not None and s.batch_size <= grown
        ]
        if before and (ev.reserved_unallocated_bytes or 0) + (ev.device_free_bytes or 0) < needed - max(
            before
        ):
            stranded = None
    if stranded is not None:
        # the memory the request needed was in the process's hands, unusable where it sat: this allocation
        # failed on the layout, and whether the rest of the step fits is not known
        f.facts.append(stranded)
        f.score = min(f.score, LEAD)
    if ev.neighbour_took_margin is not None:
        f.facts.append(
            "The same steps fitted before at this batch size: the device has less room now, not the step more need."
        )
        f.score = min(f.score, POSSIBLE)
    if ev.eval_gather is not None:
        f.facts.append(
            f"The OOM came while the evaluation loop gathered its predictions ({ev.eval_gather}): predictions kept "
            "on the GPU across the evaluation's batches grow with the evaluation set, not with the batch."
        )
        f.actions.insert(
            0,
            "Move predictions off the GPU as they come: set eval_accumulation_steps (HF Trainer), or .cpu() each "
            "batch's outputs before keeping them.",
        )
        f.score = min(f.score, LEAD)
    left = ev.restart_kept_bytes
    if left is not None and needed is not None and usable is not None and needed - left <= usable:
        f.facts.append(
            f"Without the {human(left)} an earlier attempt in the same process left behind, this moment needed "
            f"{human(needed - left)}, which fitted."
        )
        f.score = min(f.score, POSSIBLE)
    promised = ev.promised_bytes
    if promised is not None and needed is not None and needed <= 0.9 * promised:
        f.facts.append(
            f"It would fit the {human(promised)} it was promised: the limit it hit is not its own size."
        )
        f.score -= 0.3
    if early and (flat or ev.trend is None) and f.score >= LIKELY:
        f.score = STRONG - 0.05 if needed is not None else LIKELY
    unexplained = ev.non_pytorch_bytes
    if unexplained is not None and unexplained > CUDA_CONTEXT_MAX and not ev.processes:
        # old messages have no process lines: memory in use outside this allocator may be a neighbour's
        f.facts.append(
            f"{human(unexplained)} of the device was in use outside this process's allocator, and nothing "
            "says whose: the job may have been squeezed, not too large."
        )
        f.missing.append("the process list (the OOM message of torch 2.1+, or the collector's NVML list)")
        f.score = min(f.score, LEAD)
    if ev.device_unseen:
        # the job's own state rules out a leak or holes; what else was on the device is unknown
        f.facts.append(
            "The device's size and its other processes are not in this input: memory held outside this "
            "process cannot be ruled out."
        )
        f.missing.append(
            "the OOM message or the collector's bundle (the device's total and its process list): without "
            "them a neighbour or a smaller slice than the job asked for looks the same as a too-large step"
        )
        f.score = min(f.score, LEAD)
    slice_name = ev.slice_sized
    if slice_name:
        f.facts.append(
            (
                f"The device has {human(ev.total_bytes)}"
                if ev.total_bytes
                else f"The job could reach {human(ev.usable_bytes or 0)} (its reservation plus the device's free memory)"
            )
            + f", the size of a MIG slice ({slice_name}): whether "
            "the job was meant to fit in it decides between shrinking the job and asking for more."
        )
        f.score = min(f.score, LEAD)
    if ev.outside_allocator:
        f.facts.append(
            f"The failure was a CUDA error, not the caching allocator's: it held {human(ev.reserved_bytes or 0)} "
            f"of the {human(ev.limit_bytes or 0)} the job may use. What filled the device (a library's "
            "workspace, NCCL buffers, another process) is outside its figures."
        )
        f.missing.append("the device's process list (NVML) and what else in the process allocates on the GPU")
        f.score = min(f.score, CANDIDATE)
    if (
        ev.request_beyond_device
        and not slice_name
        and (promised is None or promised < (ev.request_bytes or 0))
    ):
        f.facts.append(
            f"The one allocation it asked for, {human(ev.request_bytes or 0)}, is larger than the whole device "
            f"({human(ev.physical_bytes)}): nothing held beside it, kept, "
            "a neighbour's or cached, could have made room. A tensor this size is the step's own (a batch, a "
            "sequence or a shape far larger than meant)."
        )
        f.score = max(f.score, STRONG - 0.05)
    elif ev.request_beyond_floor and not slice_name and promised is None:
        f.facts.append(
            f"The one allocation it asked for, {human(ev.request_bytes or 0)}, does not fit beside the least the "
            f"log ever showed the job holding ({human(ev.log_floor_bytes or 0)}) on a device of "
            f"{human(ev.physical_bytes)}: whatever else was released, it could not have fitted. A tensor this "
            "size is the work's own (a batch, a sequence, a beam search far larger than this device takes)."
        )
        f.score = max(f.score, LIKELY + 0.05)
    if f.score <= CANDIDATE:
        f.missing.append(
            "live memory per step (the collector's step samples): a leak grows across steps, a too-large batch does not"
        )
    if not ev.bundle and ev.total_bytes and not slice_name and promised is None:
        # a replay knows the device only from the message: not what the job was scheduled for
        f.missing.append(
            f"the GPU the job was scheduled for (the collector's device record with the pod's request): a job "
            f"sized for a larger GPU than this {human(ev.total_bytes)} one was given the wrong device (gpu_quota)"
        )
    est, info = estimate_max_batch(ev)
    if est is not None:
        f.max_batch_size = est
        f.values.update(info)
        bound = (
            " (an upper bound: the failing step had not reached its peak)"
            if "upper" in info.get("source", "")
            else ""
        )
        f.facts.append(
            f"Fixed memory {human(info['fixed_bytes'])} + {human(info['per_sample_bytes'])} per sample: "
            f"at most {est} samples fit in {human(info['usable_bytes'])}{bound}."
        )
    if ev.batch_size:
        if est is not None and est >= 1 and "upper" in info.get("source", ""):
            # the failing step never reached its peak: N is a ceiling, not a fit; start well below it
            start = max(1, est // 2)
            accum = max(2, math.ceil(ev.batch_size / start))
            f.actions.append(
                f"At most {est} samples can fit, likely fewer (the step failed before its peak): try "
                f"{start} with gradient accumulation over {accum} micro-batches; with the collector on, the "
                "next ticket measures a completed step and gives the exact maximum."
            )
        elif est is not None and est >= 1:
            accum = max(2, math.ceil(ev.batch_size / max(1, est)))
            f.actions.append(
                f"Lower the batch size from {ev.batch_size} to {est} and keep the effective batch with "
                f"gradient accumulation over {accum} micro-batches."
            )
        else:
            f.actions.append(
                f"Lower the batch size (now {ev.batch_size}) and keep the effective batch with gradient accumulation."
            )
    else:
        f.actions.append("Lower the batch size and keep the effective batch with gradient accumulation.")
    f.actions.append(
        "Cut activation memory: mixed precision (bf16 autocast), activation checkpointing, or a fused/flash attention kernel."
    )
    if ev.total_bytes and ev.total_bytes < 40 * GiB:
        f.actions.append(
            f"Or run on a GPU with more than {human(ev.total_bytes)}, or shard the model (FSDP/ZeRO)."
        )
    return f
