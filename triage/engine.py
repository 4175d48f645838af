"""The engine: run every rule on the Evidence, then decide.

Decision:
- a verdict needs a finding scored ≥ ``CONFIDENT`` that leads the runner-up by ≥ ``MARGIN``;
  otherwise the answer is ``inconclusive`` with the candidates (findings scored ≥ ``CANDIDATE_MIN``)
  and the missing evidence that would decide. A confident wrong verdict pages the wrong team, so ties
  and weak evidence stay inconclusive.
- root-cause precedence: a proven leak (≥ ``LEAK_PRECEDENCE``) outranks the platform limits it runs
  into (quota, neighbour): the job would reach any limit in time.
- no OOM in the input (a snapshot taken while healthy): findings are reported, the verdict stays
  inconclusive.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rules import Finding, Rule, load_rules
from triage.diagnosis import OWNER_OF, SUMMARY_KEYS, Diagnosis, EvidenceItem
from triage.evidence import Evidence

CONFIDENT = 0.6
MARGIN = 0.15
CANDIDATE_MIN = 0.2
LEAK_PRECEDENCE = 0.8

_RULES: list[Rule] | None = None


def rules() -> list[Rule]:
    global _RULES
    if _RULES is None:
        _RULES = load_rules()
    return _RULES


def run_rules(ev: Evidence, selected: Sequence[Rule] | None = None) -> list[Finding]:
    findings: list[Finding] = []
    for rule in selected or rules():
        f = rule.evaluate(ev)
        if f is not None:
            findings.append(f)
    findings.sort(key=lambda f: -f.score)
    return findings


def decide(ev: Evidence, findings: list[Finding]) -> Diagnosis:
    d = Diagnosis()
    d.summary = _summary(ev)
    ranked = list(findings)
    leak = next((f for f in ranked if f.verdict == "tensor_leak"), None)
    if leak is not None and leak.score >= LEAK_PRECEDENCE:
        ranked.remove(leak)
        ranked.insert(0, leak)
    top = ranked[0] if ranked else None
    runner = ranked[1] if len(ranked) > 1 else None
    # scores are sums of tenths: round away the float error (0.7 - 0.55 is 0.1499…, not the 0.15 margin)
    gap = round(top.score - (runner.score if runner else 0.0), 6) if top else 0.0
    precedence = top is not None and top is leak and leak.score >= LEAK_PRECEDENCE
    can_decide = ev.kind not in ("none", "unknown") or (ev.kind == "unknown" and bool(ev.messages))
    if top is not None and can_decide and top.score >= CONFIDENT and (gap >= MARGIN or precedence):
        d.verdict = top.verdict
        d.owner = OWNER_OF[top.verdict]
        # confidence: the finding's score, discounted by a close runner-up
        d.confidence = round(top.score * (1.0 - 0.5 * max(0.0, (runner.score if runner else 0.0) - 0.3)), 3)
        d.candidates = [f.verdict for f in ranked if f.score >= CANDIDATE_MIN]
        d.leak_site = top.leak_site
        d.actions = list(top.actions)
        chosen = [top] + [f for f in ranked[1:] if f.score >= CANDIDATE_MIN]
    else:
        d.verdict = "inconclusive"
        d.owner = None
        d.candidates = [f.verdict for f in ranked if f.score >= CANDIDATE_MIN]
        d.confidence = round(1.0 - (top.score if top else 0.0), 3) if d.candidates else 0.0
        chosen = [f for f in ranked if f.score >= CANDIDATE_MIN]
        for f in chosen[:2]:
            d.actions.extend(a for a in f.actions[:1] if a not in d.actions)
        if not can_decide:
            d.missing.append(
                "no OOM in this input: the snapshot has no `oom` trace entry (taken while the job ran, or "
                "dumped with the trace off); the OOM message (`triage replay --message-file`) would decide"
            )
    sized = None
    if d.verdict in ("workload_too_large", "inconclusive"):
        sized = next((f for f in ranked if f.max_batch_size is not None), None)
        d.max_batch_size = sized.max_batch_size if sized is not None else None
    for f in chosen:
        for fact in f.facts:
            d.evidence.append(EvidenceItem(f.rule, fact, _value(f)))
        for m in f.missing:
            if m not in d.missing:
                d.missing.append(m)
    said = {e.fact for e in d.evidence}
    for v in ev.contract_violations:
        sentence = str(getattr(v, "sentence", v))
        if sentence not in said:
            value = {k: getattr(v, k, None) for k in ("check", "severity", "contract_version")}
            d.evidence.append(EvidenceItem("contract", sentence, value))
    for note in ev.notes:
        d.evidence.append(EvidenceItem("evidence", note, None))
    d.headline = _headline(ev, d, top)
    d.details = _details(ev, ranked)
    if sized is not None:
        source = str(sized.values.get("source", ""))
        d.details["max_batch_size"] = {
            "value": sized.max_batch_size,
            # the failing step had not reached its peak: the true maximum is lower
            "bound": "upper" if "upper" in source else "estimate",
            "source": source,
        }
    return d


def _value(f: Finding) -> Any:
    return {k: v for k, v in f.values.items() if isinstance(v, int | float | str | bool) or v is None} or None


def _summary(ev: Evidence) -> dict[str, int]:
    if ev.accounting is not None:
        return ev.accounting.summary()
    s = dict.fromkeys(SUMMARY_KEYS, 0)
    if ev.reserved_bytes is not None:
        s["reserved_bytes"] = ev.reserved_bytes
    if ev.allocated_bytes is not None:
        s["allocated_bytes"] = ev.allocated_bytes
        s["active_bytes"] = ev.allocated_bytes
    if ev.reserved_unallocated_bytes is not None:
        s["free_in_reserved_bytes"] = ev.reserved_unallocated_bytes
    return s


def _headline(ev: Evidence, d: Diagnosis, top: Finding | None) -> str:
    if d.verdict == "inconclusive":
        if ev.kind == "none":
            return "No OOM in this snapshot: the accounting and live allocation sites are below."
        if not d.candidates:
            if ev.survived_oom:
                return f"Inconclusive: {ev.survived_oom}"
            return "No OOM cause found in this input."
        return "Inconclusive: could be " + ", ".join(d.candidates) + "."
    owner = {"algorithm": "training code", "platform": "platform"}.get(d.owner or "", "")
    lead = top.facts[0] if top is not None and top.facts else ""
    return f"{d.verdict} ({owner}, confidence {d.confidence:.0%}): {lead}".strip()


def _details(ev: Evidence, findings: list[Finding]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": ev.kind,
        "findings": [
            {"rule": f.rule, "verdict": f.verdict, "score": round(max(0.0, f.score), 3)} for f in findings
        ],
        "device": {
            "index": ev.device,
            "name": ev.device_name or None,
            "total_bytes": ev.total_bytes,
            "limit_bytes": ev.limit_bytes,
            "free_bytes": ev.device_free_bytes,
            "mig_profile": ev.mig_profile,
            "fraction_cap_bytes": ev.fraction_cap_bytes,
            "declared_total_bytes": ev.declared_total_bytes,
            "other_process_bytes": ev.other_process_bytes,
            "non_pytorch_bytes": ev.non_pytorch_bytes,
        },
        "request_bytes": ev.request_bytes,
        "batch_size": ev.batch_size,
        "step": ev.step,
        "expandable_segments": ev.expandable_segments,
    }
    if ev.message is not None:
        out["message"] = {
            "format": ev.message.format,
            "text": ev.message.text[:2000],
            "rank": ev.message.rank,
        }
    if ev.trend is not None:
        out["step_trend"] = ev.trend.to_dict()
    if ev.accounting is not None:
        out["accounting"] = ev.accounting.to_dict()
    if ev.timelines:
        out["timelines"] = [t.to_dict() for t in ev.timelines]
    if ev.sites:
        out["top_sites"] = [s.to_dict(ev.classifier) for s in ev.sites[:10]]
    if ev.contract_violations:
        out["contract_violations"] = [
            getattr(v, "to_dict", lambda v=v: {"sentence": str(v)})() for v in ev.contract_violations
        ]
    return out


def diagnose(ev: Evidence) -> Diagnosis:
    """Run the rules and decide."""
    return decide(ev, run_rules(ev))
