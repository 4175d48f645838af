"""Diagnosis quality on the labelled scenario set (every family × several seeds of `triage simulate`).

Prints, per family and overall: verdict accuracy, confident-wrong verdicts (a wrong verdict that is not
`inconclusive`), leak-site exactness (file and line) on leak cases, max_batch_size within 10% of the
simulated truth where it is asked; then the same cases from the message text alone (`triage diagnose`),
where the only acceptable answers are the right verdict or `inconclusive` — never a confident wrong one;
then from the snapshot alone and the snapshot with the message (`triage replay`, no collector context:
no device record, no step samples), reported without a target: what the engine may conclude without the
bundle, and how often it still must say `inconclusive`.

Targets (issue "Diagnosis"): accuracy ≥ 95%, zero confident-wrong on hard negatives, leak site exact in
≥ 95% of leak cases that recorded stacks, max_batch_size within 10% in ≥ 90% of cases where it is asked.

Usage: python bench/diagnosis.py [--seeds 0-5] [--json] [--verbose]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def evaluate(seeds: list[int], verbose: bool = False) -> dict[str, Any]:
    from rules.workload_too_large import estimate_max_batch
    from triage.pipeline import diagnose_bundle, diagnose_snapshot, diagnose_text
    from triage.simulate.scenarios import labelled_set
    from triage.snapshot.loader import normalise

    t0 = time.perf_counter()
    cases = labelled_set(seeds)
    gen_s = time.perf_counter() - t0
    rows = []
    t0 = time.perf_counter()
    for c in cases:
        d, ev = diagnose_bundle(c.bundle)
        truth = c.truth
        want = truth["verdict"]
        got = d.verdict
        row: dict[str, Any] = {
            "case": f"{c.name}/{c.seed}",
            "family": truth.get("family", c.name),
            "hard_negative": bool(truth.get("hard_negative")),
            "want": want,
            "got": got,
            "confidence": d.confidence,
            "correct": got == want,
            "confident_wrong": got != want and got != "inconclusive",
        }
        if want == "tensor_leak" and truth.get("leak_site"):
            ls = truth["leak_site"]
            row["leak_site_exact"] = bool(
                d.leak_site
                and d.leak_site.get("filename") == ls["filename"]
                and d.leak_site.get("line") == ls["line"]
            )
        if truth.get("max_batch_size") is not None:
            mb = d.max_batch_size
            tb = truth["max_batch_size"]
            row["max_batch"] = (mb, tb)
            row["max_batch_ok"] = mb is not None and abs(mb - tb) <= 0.1 * tb
            # what the estimate rests on: completed steps, or a step that failed before its peak (a ceiling)
            row["max_batch_bound"] = "upper" in estimate_max_batch(ev)[1].get("source", "")
        if c.message:
            dm, _ = diagnose_text(c.message)
            row["text_got"] = dm.verdict
            row["text_confident_wrong"] = dm.verdict not in (want, "inconclusive")
        if c.snapshot is not None:
            # `triage replay snapshot.pickle [--message]`: the snapshot without the collector's context
            snap = normalise(c.snapshot, source="simulated", shared_frames=False)
            for key, msg in (("snap", None), ("snap_msg", c.message)):
                ds, _ = diagnose_snapshot(snap, message=msg)
                row[f"{key}_correct"] = ds.verdict == want
                row[f"{key}_confident_wrong"] = ds.verdict not in (want, "inconclusive")
        rows.append(row)
        if verbose and (
            not row["correct"] or row.get("leak_site_exact") is False or row.get("max_batch_ok") is False
        ):
            print(
                f"  {row['case']:36} want {want:18} got {got:18} conf {d.confidence:.2f}  {d.headline[:90]}"
            )
    diag_s = time.perf_counter() - t0
    return {"rows": rows, "generate_seconds": gen_s, "diagnose_seconds": diag_s}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def rate(xs: list[bool]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    by_family: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_family[r["family"]].append(r)
    fam = {
        f: {
            "cases": len(rs),
            "accuracy": rate([r["correct"] for r in rs]),
            "confident_wrong": sum(r["confident_wrong"] for r in rs),
        }
        for f, rs in sorted(by_family.items())
    }
    return {
        "cases": len(rows),
        "accuracy": rate([r["correct"] for r in rows]),
        "confident_wrong": sum(r["confident_wrong"] for r in rows),
        "confident_wrong_hard_negatives": sum(r["confident_wrong"] for r in rows if r["hard_negative"]),
        "leak_site_exact": rate([r["leak_site_exact"] for r in rows if "leak_site_exact" in r]),
        "leak_cases_with_site": sum(1 for r in rows if "leak_site_exact" in r),
        "max_batch_within_10pct": rate([r["max_batch_ok"] for r in rows if "max_batch_ok" in r]),
        "max_batch_cases": sum(1 for r in rows if "max_batch_ok" in r),
        **{
            f"max_batch_{key}": rate([r["max_batch_ok"] for r in rows if r.get("max_batch_bound") is bound])
            for key, bound in (("from_steps", False), ("upper_bound", True))
        },
        **{
            f"max_batch_{key}_cases": sum(1 for r in rows if r.get("max_batch_bound") is bound)
            for key, bound in (("from_steps", False), ("upper_bound", True))
        },
        "text_only_confident_wrong": sum(r.get("text_confident_wrong", False) for r in rows),
        "text_only_cases": sum(1 for r in rows if "text_got" in r),
        **{
            f"{key}_{what}": (
                rate([r[f"{key}_correct"] for r in rows if f"{key}_correct" in r])
                if what == "accuracy"
                else sum(r.get(f"{key}_confident_wrong", False) for r in rows)
            )
            for key in ("snap", "snap_msg")
            for what in ("accuracy", "confident_wrong")
        },
        "snap_cases": sum(1 for r in rows if "snap_correct" in r),
        "families": fam,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0-5")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    res = evaluate(parse_seeds(args.seeds), verbose=args.verbose)
    s = summarise(res["rows"])
    if args.json:
        print(json.dumps(s, indent=2))
    else:
        print(f"{'family':26} {'cases':>5} {'accuracy':>9} {'confident-wrong':>16}")
        for f, v in s["families"].items():
            print(f"{f:26} {v['cases']:5} {v['accuracy']:9.0%} {v['confident_wrong']:16}")
        print()

        def pct(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.1%}"

        table = [
            (
                "verdict accuracy",
                pct(s["accuracy"]),
                "≥ 95%",
                s["accuracy"] is not None and s["accuracy"] >= 0.95,
            ),
            ("confident-wrong (all)", str(s["confident_wrong"]), "", True),
            (
                "confident-wrong on hard negatives",
                str(s["confident_wrong_hard_negatives"]),
                "= 0",
                s["confident_wrong_hard_negatives"] == 0,
            ),
            (
                f"leak site exact ({s['leak_cases_with_site']} cases)",
                pct(s["leak_site_exact"]),
                "≥ 95%",
                (s["leak_site_exact"] or 0) >= 0.95,
            ),
            (
                f"max_batch_size within 10% ({s['max_batch_cases']} cases)",
                pct(s["max_batch_within_10pct"]),
                "≥ 90%",
                (s["max_batch_within_10pct"] or 0) >= 0.9,
            ),
            (
                f"  from completed steps ({s['max_batch_from_steps_cases']})",
                pct(s["max_batch_from_steps"]),
                "",
                True,
            ),
            (
                f"  failed before its peak: a ceiling ({s['max_batch_upper_bound_cases']})",
                pct(s["max_batch_upper_bound"]),
                "",
                True,
            ),
            (
                f"message-only confident-wrong ({s['text_only_cases']} cases)",
                str(s["text_only_confident_wrong"]),
                "= 0",
                s["text_only_confident_wrong"] == 0,
            ),
            (
                f"snapshot alone: confident-wrong ({s['snap_cases']} cases)",
                str(s["snap_confident_wrong"]),
                "",
                True,
            ),
            ("snapshot alone: accuracy", pct(s["snap_accuracy"]), "", True),
            ("snapshot + message: confident-wrong", str(s["snap_msg_confident_wrong"]), "", True),
            ("snapshot + message: accuracy", pct(s["snap_msg_accuracy"]), "", True),
        ]
        for name, val, target, ok in table:
            print(f"{name:48} {val:>8} {target:>7} {'ok' if ok else 'MISSED'}")
        print(
            f"\n{s['cases']} cases; generated in {res['generate_seconds']:.1f}s, diagnosed in {res['diagnose_seconds']:.1f}s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
