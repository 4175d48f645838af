"""host_memory_limit: the kernel's OOM killer ended the process at the pod's memory limit.

Behaviour relied on: host RAM is limited by the container's cgroup (``memory.max`` in cgroup v2,
``memory.limit_in_bytes`` in v1). When usage reaches it the kernel kills a process with SIGKILL: no
Python hook runs, the log ends with "Killed", the exit code is 137 (128 + 9) and Kubernetes reports
the container as ``OOMKilled``; the cgroup's ``oom_kill`` counter goes up. Page-locked (pinned) host
buffers, which the DataLoader's pin memory thread allocates through the CUDA driver, fail instead: the
driver cannot lock more of the host's RAM and CUDA says ``out of memory`` about the host, not the GPU.
Typical causes are DataLoader workers each holding a copy of the dataset, pinned-memory buffers and CPU
offload. GPU memory has nothing to do with it.

A limit reached by host memory that grew at nearly every step the job's log printed it (a list of CPU
tensors kept, Python objects in DataLoader workers touched copy-on-write) is still the limit's kill, the
only verdict host memory has, but at a lower confidence and with the growth as its first fact: a higher
limit only puts it off, and the fix is in the job. Host memory that grew while the job loaded its data,
before any training step, is a load the limit does not hold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rules.base import CANDIDATE, LIKELY, STRONG, Finding
from triage.units import human

if TYPE_CHECKING:
    from triage.evidence import Evidence

ID = "host_memory_limit"
VERDICT = "host_memory_limit"
OWNER = "platform"


# a SIGKILL or exit code 137 alone: the OOM killer sends it, and so do timeouts, probes and preemptions
WEAK = frozenset({"host-sigkill", "host-exit-137"})
# what says a process got SIGKILL and not who sent it (the shell's "Killed", a DataLoader worker "killed by
# signal: Killed"): the cgroup's own counter can still say the OOM killer did not
SIGKILL_ONLY = WEAK | {"host-killed", "host-worker-killed"}
LOW_USAGE = 0.5  # of the container's limit: far from where the OOM killer acts
BEYOND_ANY_HOST = 4 << 40  # one host allocation larger than this (4 TiB) is larger than any node's memory


def evaluate(ev: Evidence) -> Finding | None:
    host_msgs = ev.host_kills
    f = Finding(rule=ID, verdict=VERDICT, score=0.0)
    # the shell's "Killed" names no sender either when the log names another one (torchrun's teardown)
    weak = WEAK | ({"host-killed"} if ev.other_killer else set())
    named = any(m.format not in weak for m in host_msgs)  # OOMKilled, the kernel's line, Killed, slurm
    text_kinds = [m for m in ev.messages if m.kind == "host_oom"]
    # the incident's kind says host OOM from a source that named it (the watcher's OOMKilled, a kernel
    # line), not only from a SIGKILL in the text
    weak_kind = (
        bool(text_kinds) and all(m.format in weak for m in text_kinds) and ev.bundle.get("kind") != "host_oom"
    )
    strong_kind = ev.kind == "host_oom" and not weak_kind
    use, limit = ev.cgroup_usage_bytes, ev.cgroup_limit_bytes
    # the cgroup never killed and was far from its limit when the collector read it, after the kill
    calm = ev.oom_kill_count == 0 and bool(use and limit and use < LOW_USAGE * limit)
    sigkill_only = all(m.format in SIGKILL_ONLY for m in host_msgs)
    if strong_kind and sigkill_only and not ev.oom_kill_count and ((ev.other_killer and not named) or calm):
        # the incident is a host OOM only for a SIGKILL, and it names another sender or a calm cgroup
        strong_kind = False
    if strong_kind and host_msgs and all(m.format == "host-pinned" for m in host_msgs):
        # a refused pinned buffer, not a kill: host RAM, or a limit on locked memory
        strong_kind = False
    if strong_kind:
        f.score = STRONG
    elif named:
        f.score = LIKELY + 0.05
    elif host_msgs or ev.exit_code == 137 or ev.kind == "host_oom":
        f.score = LIKELY
    elif ev.oom_kill_count:
        f.score = LIKELY - 0.1
    else:
        return None
    if f.score < STRONG and sigkill_only and not ev.oom_kill_count:
        # only a SIGKILL says memory: anything that names another sender, or a cgroup that never killed
        # and was far from its limit, leaves it a candidate
        if ev.other_killer and not named:
            f.facts.append(f"Something else sends SIGKILL here: {ev.other_killer}")
            f.score = min(f.score, CANDIDATE)
        if calm and use and limit:
            f.facts.append(
                f"The cgroup's oom_kill counter is 0 and usage was {human(use)} of {human(limit)}: the kernel "
                "did not kill for memory here."
            )
            f.score = min(f.score, CANDIDATE)
        if f.score <= CANDIDATE:
            f.missing.append(
                "what sent the SIGKILL: the pod's last state (OOMKilled or not), the kernel log (oom-kill), "
                "the scheduler's reason (time limit, preemption, eviction)"
            )
    absurd = [
        m for m in host_msgs if m.format == "host-cpu-alloc" and (m.requested_bytes or 0) > BEYOND_ANY_HOST
    ]
    if absurd and not ev.oom_kill_count:
        # malloc refuses a request only when the node could not commit it at all (a cgroup's limit is
        # enforced later, by the OOM killer, when pages are touched); one request larger than any host is a
        # size computed from bad data or a bug, which no memory limit would have let through
        f.facts.append(
            f"The failing host allocation alone asked for {human(absurd[-1].requested_bytes or 0)}, more than any "
            "host has: a size computed from bad data or a bug, not a memory limit reached."
        )
        f.score = min(f.score, CANDIDATE)
    if host_msgs:
        last = host_msgs[-1]
        what = {
            "host-ray-oom": "Ray's memory monitor's kill",
            "host-cpu-alloc": "the host allocator's refusal",
            "host-pinned": "the driver's refusal to pin host memory",
            "host-evicted": "the kubelet's eviction for node memory pressure",
            "host-slurm-oom": "Slurm's memory-limit kill",
            "host-notebook-ram": "the notebook's restart for lack of RAM",
        }.get(last.format, "the kernel's kill")
        what = what if named else "a SIGKILL"
        f.facts.append(f"The log ends with {what}: {last.text.strip()[:160]}")
    if ev.exit_code == 137:
        f.facts.append("Exit code 137: the process was killed with SIGKILL.")
    if ev.cgroup_limit_bytes:
        use = ev.cgroup_usage_bytes
        if use:
            f.facts.append(
                f"The container's memory limit is {human(ev.cgroup_limit_bytes)}; usage was {human(use)} "
                f"({use / ev.cgroup_limit_bytes:.0%})."
            )
        else:
            f.facts.append(
                f"The container's memory limit is {human(ev.cgroup_limit_bytes)}; the last usage is unknown."
            )
        f.values.update({"memory_limit_bytes": ev.cgroup_limit_bytes, "memory_usage_bytes": use})
        if use and use >= 0.9 * ev.cgroup_limit_bytes:
            f.score = min(1.0, f.score + 0.05)
    if ev.oom_kill_count:
        f.facts.append(f"The cgroup's oom_kill counter is {ev.oom_kill_count}.")
        f.values["oom_kill_count"] = ev.oom_kill_count
        f.score = min(1.0, f.score + 0.05)
    for v in ev.contract_violations:
        if getattr(v, "related_verdict", None) == VERDICT:
            f.facts.append(str(getattr(v, "sentence", v)))
    if ev.host_growth is not None and not ev.host_growth[4]:
        _, b0, _, b1, _ = ev.host_growth
        f.facts.append(
            f"The job's host memory rose from {human(b0)} to {human(b1)} while it loaded its data or weights, "
            "before any training step its log printed: what it loads does not fit the limit it runs under."
        )
        f.values["host_growth_bytes"] = b1 - b0
        f.actions.append(
            "Load less into host RAM at once (stream or memory-map the data instead of caching it all), or size "
            "the container's memory limit for what the job loads."
        )
    elif ev.host_growth is not None:
        s0, b0, s1, b1, _ = ev.host_growth
        f.facts.append(
            f"The job's own host memory, as its log printed it, rose at nearly every print, from {human(b0)} at "
            f"step {s0} to {human(b1)} at step {s1}: the limit was reached by memory growing step after step, "
            "not by a steady need; a higher limit only puts the kill off."
        )
        f.values["host_growth_bytes"] = b1 - b0
        f.missing.append(
            "what the job keeps in host memory as it runs (a memory profile of the process and its DataLoader "
            "workers: tracemalloc, memray, or RSS per worker)"
        )
        f.actions.append(
            "Find what grows in host memory: CPU tensors, batches or outputs kept in a list (`.cpu()` results "
            "appended each step), Python lists/dicts of samples in the Dataset that workers touch copy-on-write "
            "(store them as numpy arrays), caches without a bound."
        )
        f.score = min(f.score, LIKELY - 0.05)
    f.actions.append(
        "Raise the container's memory limit (resources.limits.memory) to cover the job's host RAM peak."
    )
    f.actions.append(
        "Reduce host memory: fewer DataLoader workers, a memory-mapped dataset instead of one copy per worker, smaller pinned buffers."
    )
    return f
