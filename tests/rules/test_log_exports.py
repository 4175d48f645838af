"""Logs as log pipelines export them: turned back into the job's lines, in time order, before they are read.

The record layouts follow each tool's documented export: Google Cloud Logging's LogEntry (``textPayload``,
``timestamp``), Docker's json-file driver (``log`` with its newline, ``stream``, ``time``; lines over 16 KiB
split across records), Loki's ``query_range`` answer (``data.result[].values`` of ``[ns, line]``),
Elasticsearch's search answer (``hits.hits[]._source``), Datadog's logs API (``data[].attributes``) and its
CSV download. No pipeline runs here.
"""

from __future__ import annotations

import json

from triage.logsource import plain_text
from triage.pipeline import diagnose_text

LINES = [
    "step 100 | loss 2.31 | mem_allocated 20.10 GiB",
    "step 200 | loss 2.20 | mem_allocated 24.30 GiB",
    "step 300 | loss 2.12 | mem_allocated 28.50 GiB",
    "step 400 | loss 2.05 | mem_allocated 32.70 GiB",
    "step 500 | loss 1.98 | mem_allocated 36.90 GiB",
    "step 600 | loss 1.93 | mem_allocated 41.10 GiB",
    "step 700 | loss 1.90 | mem_allocated 45.30 GiB",
    "step 800 | loss 1.86 | mem_allocated 49.50 GiB",
    "Traceback (most recent call last):",
    '  File "/app/train.py", line 96, in train_step',
    "    logits = model(x)",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.20 GiB. GPU 0 has a total capacity of 79.11 "
    "GiB of which 650.00 MiB is free. Including non-PyTorch memory, this process has 78.45 GiB memory in use. Of "
    "the allocated memory 77.10 GiB is allocated by PyTorch, and 820.00 MiB is reserved by PyTorch but "
    "unallocated.",
]
PLAIN = "\n".join(LINES) + "\n"


def _iso(k: int) -> str:
    return f"2024-09-12T03:{14 + k // 60:02d}:{k % 60:02d}.123456789Z"


def test_cloud_logging_json_lines_and_a_newest_first_download() -> None:
    recs = [
        {
            "insertId": f"{k:04x}",
            "resource": {"type": "k8s_container"},
            "textPayload": ln,
            "timestamp": _iso(k),
        }
        for k, ln in enumerate(LINES)
    ]
    jsonl = "\n".join(json.dumps(r) for r in recs)
    assert plain_text(jsonl) == PLAIN
    assert plain_text(json.dumps(recs[::-1], indent=2)) == PLAIN  # the console's download, newest first
    d, ev = diagnose_text(jsonl)
    assert len(ev.steps) == 8 and d.verdict == "tensor_leak", d.headline
    # the same lines as they came: diagnosed the same
    assert diagnose_text(PLAIN)[0].verdict == "tensor_leak"


def test_docker_json_file_with_a_line_split_at_16_kib() -> None:
    recs = [{"log": ln + "\n", "stream": "stdout", "time": _iso(k)} for k, ln in enumerate(LINES[:-1])]
    last = LINES[-1]
    recs += [
        {"log": last[:100], "stream": "stderr", "time": _iso(20)},
        {"log": last[100:] + "\n", "stream": "stderr", "time": _iso(20)},
    ]
    assert plain_text("\n".join(json.dumps(r) for r in recs)) == PLAIN


def test_loki_streams_merged_by_time_and_elasticsearch_and_datadog() -> None:
    ns = [1_739_865_600_000_000_000 + k * 1_000_000_000 for k in range(len(LINES))]
    out = [
        [str(t), ln] for t, ln in zip(ns, LINES, strict=True) if not ln.startswith(("Trace", " ", "torch"))
    ]
    err = [[str(t), ln] for t, ln in zip(ns, LINES, strict=True) if ln.startswith(("Trace", " ", "torch"))]
    loki = {
        "status": "success",
        "data": {
            "resultType": "streams",
            "result": [
                {"stream": {"stream": "stderr"}, "values": err[::-1]},
                {"stream": {"stream": "stdout"}, "values": out[::-1]},
            ],
        },
    }
    assert plain_text(json.dumps(loki)) == PLAIN
    es = {
        "hits": {
            "hits": [{"_source": {"log": ln + "\n", "@timestamp": _iso(k)}} for k, ln in enumerate(LINES)][
                ::-1
            ]
        }
    }
    assert plain_text(json.dumps(es)) == PLAIN
    dd = {
        "data": [
            {"type": "log", "attributes": {"message": ln, "timestamp": _iso(k), "service": "ft"}}
            for k, ln in enumerate(LINES)
        ]
    }
    assert plain_text(json.dumps(dd)).splitlines()[0].startswith("step 100 | loss 2.31")


def test_a_datadog_csv_and_a_structured_loggers_fields() -> None:
    rows = ['"Date","Host","Service","Status","Message"']
    rows += [
        f'"{_iso(k)}","gpu-node-31","train","info","{ln.replace(chr(34), chr(34) * 2)}"'
        for k, ln in enumerate(LINES)
    ]
    assert plain_text("\n".join(rows) + "\n") == PLAIN
    structured = "\n".join(
        json.dumps(
            {
                "ts": _iso(k),
                "level": "INFO",
                "msg": "train step",
                "step": 100 * (k + 1),
                "alloc_gib": f"{20.1 + 4.2 * k:.2f}GiB",
            }
        )
        for k in range(8)
    )
    text = plain_text(structured)
    assert text.splitlines()[0] == f"train step ts={_iso(0)} level=INFO step=100 alloc_gib=20.10GiB"


def test_plain_logs_and_json_that_is_not_an_export_come_back_as_they_are() -> None:
    assert plain_text(PLAIN) is PLAIN
    brace = '{"config": "not an export"}\nstep 1 loss 2.0\n'
    assert plain_text(brace) is brace
    hf = "{'loss': 1.15, 'learning_rate': 4.6e-05, 'epoch': 0.05}\n{'loss': 1.1, 'epoch': 0.1}\n"
    assert plain_text(hf) is hf


def test_several_files_as_tail_prints_them_are_read_rank_by_rank() -> None:
    """``tail -n +1 out/*.log``: each file after its ``==> name <==`` header. The failing rank's prints are its
    own file's; the other rank's flat prints are not mixed into its steps (they were read as 19 samples
    rising in 78% of steps)."""
    text = ["==> out/rank0.log <=="]
    text += [f"iter {k * 50} | loss 1.{90 - k} | gpu_mem_allocated 20.{k % 3}GB" for k in range(1, 13)]
    text += ["", "==> out/rank1.log <=="]
    text += [f"iter {k * 50} | loss 1.{90 - k} | gpu_mem_allocated {20 + k * 7}.0GB" for k in range(1, 8)]
    text += LINES[8:]
    plain = plain_text("\n".join(text) + "\n")
    assert plain.count("[rank1]: iter") == 7 and plain.count("[rank0]: iter") == 12
    assert "\n==> out/rank1.log <==\n" in plain
    d, ev = diagnose_text(plain)
    assert ev.trend is not None and ev.trend.steps == 7
    assert d.verdict == "tensor_leak"


def test_file_names_give_the_rank_and_a_lines_own_prefix_still_decides() -> None:
    text = "==> logs/worker-3.out <==\nstep 1\n[rank5]: step 2\n\n==> logs/eval.log <==\nloss 1\n"
    plain = plain_text(text)
    assert "[rank3]: step 1" in plain and "[rank3]: [rank5]: step 2" in plain
    assert "[rank1]: loss 1" in plain  # no number in the name: the file's place
    one = "==> logs/worker-3.out <==\nstep 1\n"
    assert plain_text(one) == one
