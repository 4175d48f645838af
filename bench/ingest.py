"""Ingest benchmark of the triage service, on loopback, against a real `triage serve` process.

For each store (SQLite file; PostgreSQL at 127.0.0.1:5432 in a fresh `triage_bench_<random>` database,
dropped after) it prints:

1. small-bundle ingest: throughput and p50/p99 latency of `POST /api/v1/incidents` with 32 concurrent
   clients (gzip'd bundles of a few kB, each a distinct incident; the worker off, so only ingest is timed);
2. the server's RSS growth while a 500 MB bundle (decompressed; a snapshot of random-looking segments,
   gzip'd ~6x like real ones) streams in and is validated (target < 50 MB);
3. 512 ranks of one job posting at once → the time until one ticket shows 512 incidents (the in-process
   worker analysing in its child process; the 512 × analysis is the bulk of it).

Usage: python bench/ingest.py [--stores sqlite,postgresql] [--requests 2000] [--big-mb 500] [--ranks 512]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import random
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOKEN = "bench-ingest-token-0123456789"
HEADERS = {"Content-Type": "application/json", "Content-Encoding": "gzip", "Authorization": f"Bearer {TOKEN}"}
PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=3"
RSS_TARGET_MB = 50


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, data: Path, url: str, *, worker: bool) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRIAGE_")}
        env.update(
            PYTHONPATH=str(ROOT),
            TRIAGE_DATA_DIR=str(data),
            TRIAGE_DATABASE_URL=url,
            TRIAGE_INGEST_TOKENS=f"bench={TOKEN}",
            TRIAGE_WORKER="true" if worker else "false",
            TRIAGE_WORKER_CONCURRENCY="2",
            TRIAGE_WORKER_POLL_SECONDS="0.05",
            TRIAGE_LOG_LEVEL="WARNING",
            TRIAGE_DB_POOL_SIZE="40",
        )
        self.log = (data / "server.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "triage.cli", "serve", "--port", str(self.port)],
            env=env,
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"triage serve exited: see {data / 'server.log'}")
            try:
                if httpx.get(self.base + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise SystemExit("triage serve did not become ready")

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def small_bundle() -> dict[str, Any]:
    from triage.simulate.scenarios import run_scenario

    return run_scenario("shm_exhausted", 1).bundle


def with_identity(base: dict[str, Any], *, job: str, rank: int) -> bytes:
    b = dict(base)
    b["incident_id"] = str(uuid.uuid4())
    w = dict(b.get("workload") or {})
    w.update(
        job=job,
        owner_name=job,
        rank=rank,
        local_rank=rank % 8,
        pod=f"{job}-worker-{rank // 8}",
        world_size=512,
    )
    b["workload"] = w
    return gzip.compress(json.dumps(b).encode(), compresslevel=1)


async def post_all(
    base_url: str, bodies: list[bytes], concurrency: int
) -> tuple[list[float], float, dict[int, int]]:
    latencies: list[float] = []
    codes: dict[int, int] = {}
    queue = list(reversed(bodies))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as client:

        async def run() -> None:
            while queue:
                body = queue.pop()
                t = time.perf_counter()
                r = await client.post("/api/v1/incidents", content=body, headers=HEADERS)
                latencies.append(time.perf_counter() - t)
                codes[r.status_code] = codes.get(r.status_code, 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(run() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return latencies, elapsed, codes


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def write_big_bundle(path: Path, mb: int) -> int:
    """A gzip'd bundle whose snapshot makes it `mb` MB decompressed; random-looking so it compresses
    like a real snapshot (repeats are further apart than gzip's 32 kB window)."""
    rng = random.Random(0)
    pool = []
    for _ in range(2000):
        frames = ", ".join(
            json.dumps(
                {
                    "filename": f"/workspace/src/{secrets.token_hex(6)}.py",
                    "line": rng.randrange(9999),
                    "name": secrets.token_hex(5),
                }
            )
            for _ in range(8)
        )
        pool.append(
            json.dumps(
                {"address": rng.getrandbits(47), "size": rng.getrandbits(24), "state": "active_allocated"}
            )[:-1]
            + f', "frames": [{frames}]}}'
        )
    header = dict(small_bundle(), incident_id=str(uuid.uuid4()))
    header.pop("snapshot", None)
    head = json.dumps(header)[:-1].encode() + b', "snapshot": {"segments": ['
    target = mb * 1024 * 1024
    size = 0
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(head)
        size += len(head)
        first = True
        while size < target:
            blocks = ", ".join(rng.choice(pool) for _ in range(64))
            seg = (
                "" if first else ", "
            ) + f'{{"address": {rng.getrandbits(47)}, "total_size": 2097152, "blocks": [{blocks}]}}'
            data = seg.encode()
            f.write(data)
            size += len(data)
            first = False
        tail = b'], "device_traces": [[]]}}'
        f.write(tail)
        size += len(tail)
    return size


def stream_file(path: Path, chunk: int = 1 << 20) -> Iterator[bytes]:
    with path.open("rb") as f:
        while data := f.read(chunk):
            yield data


def measure_big(server: Server, path: Path) -> tuple[float, float, float, int]:
    """(baseline RSS MB, peak growth MB, seconds, status)."""
    baseline = server.rss_mb()
    peak = [baseline]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], server.rss_mb())
            time.sleep(0.02)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    started = time.perf_counter()
    with httpx.Client(base_url=server.base, timeout=600) as client:
        r = client.post("/api/v1/incidents", content=stream_file(path), headers=HEADERS)
    elapsed = time.perf_counter() - started
    done.set()
    t.join()
    return baseline, peak[0] - baseline, elapsed, r.status_code


def wait_ticket(base_url: str, job: str, n: int, timeout: float) -> float | None:
    started = time.perf_counter()
    with httpx.Client(base_url=base_url, timeout=30) as client:
        while time.perf_counter() - started < timeout:
            items = client.get("/api/v1/tickets", params={"limit": 50}).json()["items"]
            mine = [t for t in items if t["job"] == job]
            if mine and mine[0]["incident_count"] >= n:
                assert len(mine) == 1, mine
                return time.perf_counter() - started
            time.sleep(0.2)
    return None


def bench_store(
    name: str, url: str, work: Path, args: argparse.Namespace, big: Path | None
) -> dict[str, Any]:
    out: dict[str, Any] = {"store": name}
    base = small_bundle()
    data = work / name
    data.mkdir()
    server = Server(data, url, worker=False)
    try:
        bodies = [with_identity(base, job="bench-ingest", rank=i % 512) for i in range(args.requests)]
        asyncio.run(post_all(server.base, bodies[:64], args.concurrency))  # warm up
        bodies = [with_identity(base, job="bench-ingest", rank=i % 512) for i in range(args.requests)]
        lat, elapsed, codes = asyncio.run(post_all(server.base, bodies, args.concurrency))
        out.update(
            requests=len(bodies),
            rate=len(bodies) / elapsed,
            p50_ms=pct(lat, 50) * 1000,
            p99_ms=pct(lat, 99) * 1000,
            mean_ms=statistics.fmean(lat) * 1000,
            codes=codes,
        )
        if big is not None:
            baseline, growth, secs, status = measure_big(server, big)
            out.update(big_baseline_mb=baseline, big_growth_mb=growth, big_seconds=secs, big_status=status)
    finally:
        server.stop()
    server = Server(data, url, worker=True)
    try:
        job = f"bench-ranks-{secrets.token_hex(3)}"
        bodies = [with_identity(base, job=job, rank=r) for r in range(args.ranks)]
        started = time.perf_counter()
        _lat, posted, codes = asyncio.run(post_all(server.base, bodies, len(bodies)))
        ticket = wait_ticket(server.base, job, args.ranks, timeout=600)
        out.update(
            ranks=args.ranks,
            ranks_posted_s=posted,
            ranks_ticket_s=None if ticket is None else time.perf_counter() - started,
            ranks_codes=codes,
        )
    finally:
        server.stop()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stores", default="sqlite,postgresql")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--big-mb", type=int, default=500, help="0 skips the large bundle")
    p.add_argument("--ranks", type=int, default=512)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="triage-bench-"))
    results: list[dict[str, Any]] = []
    try:
        big = None
        if args.big_mb:
            big = work / "big.json.gz"
            t = time.perf_counter()
            size = write_big_bundle(big, args.big_mb)
            print(
                f"large bundle: {size / 2**20:.0f} MB decompressed, {big.stat().st_size / 2**20:.0f} MB gzip'd "
                f"(written in {time.perf_counter() - t:.1f} s)",
                file=sys.stderr,
            )
        for store in args.stores.split(","):
            if store == "sqlite":
                results.append(
                    bench_store("sqlite", f"sqlite:///{work / 'sqlite' / 'triage.db'}", work, args, big)
                )
            elif store == "postgresql":
                import psycopg

                try:
                    admin = psycopg.connect(PG_ADMIN, autocommit=True)
                except psycopg.OperationalError as exc:
                    print(f"postgresql: skipped ({exc})", file=sys.stderr)
                    continue
                db = f"triage_bench_{secrets.token_hex(4)}"
                admin.execute(f'CREATE DATABASE "{db}"')
                try:
                    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{db}"
                    results.append(bench_store("postgresql", url, work, args, big))
                finally:
                    admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
                    admin.close()
            else:
                raise SystemExit(f"unknown store {store!r}")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"\ningest benchmark on loopback ({os.cpu_count()} CPUs), {args.concurrency} concurrent clients")
    for r in results:
        print(f"\n[{r['store']}]")
        print(
            f"  small bundles: {r['requests']} posts, {r['rate']:.0f}/s, p50 {r['p50_ms']:.1f} ms, "
            f"p99 {r['p99_ms']:.1f} ms (statuses {r['codes']})"
        )
        if "big_growth_mb" in r:
            verdict = "ok" if r["big_growth_mb"] < RSS_TARGET_MB else "OVER TARGET"
            print(
                f"  {args.big_mb} MB bundle: RSS growth {r['big_growth_mb']:.1f} MB (target < {RSS_TARGET_MB} MB: "
                f"{verdict}) from {r['big_baseline_mb']:.0f} MB, {r['big_seconds']:.1f} s, HTTP {r['big_status']}"
            )
        ticket = r["ranks_ticket_s"]
        print(
            f"  {r['ranks']} ranks at once: all stored in {r['ranks_posted_s']:.1f} s, one ticket with "
            f"{r['ranks']} incidents after "
            + (f"{ticket:.1f} s" if ticket is not None else "TIMEOUT")
            + f" (statuses {r['ranks_codes']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
