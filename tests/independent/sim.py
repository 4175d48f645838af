"""A small, independent model of the CUDA caching allocator (written from SNAPSHOT_FORMAT.md §1-§4 only).

It exists so that the hand-written incident bundles are internally consistent: segments are exactly the sum
of their blocks, allocated = sum of active blocks, trace entries match the blocks, memory_stats match both.
"""

from __future__ import annotations

MiB = 1 << 20
GiB = 1 << 30


def fmt(n: int) -> str:
    """torch's format_size."""
    if n <= 1024:
        return f"{n} bytes"
    if n <= 1048576:
        return f"{n / 1024:.2f} KiB"
    if n <= 1073741824:
        return f"{n / 1048576:.2f} MiB"
    return f"{n / 1073741824:.2f} GiB"


class OOM(Exception):
    def __init__(self, rounded, segsize, rejected_by_cap, device_free, stream):
        super().__init__(f"OOM {segsize}")
        self.rounded = rounded
        self.segsize = segsize
        self.rejected_by_cap = rejected_by_cap
        self.device_free = device_free
        self.stream = stream


class Block:
    __slots__ = ("addr", "frames", "req", "seg", "size", "state")

    def __init__(self, addr, size, req, state, frames, seg):
        self.addr, self.size, self.req, self.state, self.frames, self.seg = (
            addr,
            size,
            req,
            state,
            frames,
            seg,
        )


class Seg:
    def __init__(self, addr, size, stream, pool, frames):
        self.addr, self.size, self.stream, self.pool, self.frames = addr, size, stream, pool, frames
        self.blocks: list[Block] = []


POOLS = ("all", "small_pool", "large_pool")


class Sim:
    def __init__(
        self,
        total,
        ctx=512 * MiB,
        others=0,
        cap=None,
        frames=True,
        device=0,
        t0=1_715_000_000_000_000,
        max_entries=None,
        time_us=True,
        base_addr=0x7F3A00000000,
    ):
        self.total, self.ctx, self.others, self.cap = total, ctx, others, cap
        self.record_frames = frames
        self.device = device
        self.t = t0
        self.max_entries = max_entries
        self.time_us = time_us
        self.next_addr = base_addr
        self.segments: list[Seg] = []
        self.trace: list[dict] = []
        self.cur = {}
        self.peak = {}
        self.cum_alloc = {}
        self.cum_freed = {}
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.num_oom_rejections = 0
        self.timeline: list[dict] = []
        self.observer = None
        # bookkeeping only (no effect on behaviour): running reserved total and the inactive blocks per
        # (pool, stream), so best fit need not scan every block of every segment
        self._reserved = 0
        self._free: dict[tuple[str, int], set[Block]] = {}

    def _free_set(self, seg):
        return self._free.setdefault((seg.pool, seg.stream), set())

    # ---- bookkeeping
    def _add(self, metric, pool, delta):
        for p in ("all", pool + "_pool"):
            k = (metric, p)
            self.cur[k] = self.cur.get(k, 0) + delta
            if self.cur[k] > self.peak.get(k, 0):
                self.peak[k] = self.cur[k]
            if delta > 0:
                self.cum_alloc[k] = self.cum_alloc.get(k, 0) + delta
            else:
                self.cum_freed[k] = self.cum_freed.get(k, 0) - delta

    def _tick(self, dt=37):
        self.t += dt
        return self.t

    def _trace(self, action, frames=None, **kw):
        e = {"action": action}
        e.update(kw)
        if self.time_us:
            e["time_us"] = self._tick()
        else:
            self._tick()
        if self.record_frames and frames is not None:
            e["frames"] = frames
        e["compile_context"] = "N/A"
        e["user_metadata"] = ""
        self.trace.append(e)

    @property
    def reserved(self):
        return self._reserved

    @property
    def allocated(self):
        return sum(b.size for s in self.segments for b in s.blocks if b.state == "active_allocated")

    def nvml_used(self):
        return self.reserved + self.ctx

    def dev_free(self):
        return self.total - self.ctx - self.others - self.reserved

    # ---- allocator
    def _best_fit(self, rounded, pool, stream):
        best = None
        for b in self._free.get((pool, stream), ()):
            if b.size >= rounded and (best is None or (b.size, b.addr) < (best.size, best.addr)):
                best = b
        return best

    def _can_get(self, segsize):
        if self.cap is not None and self.reserved + segsize > self.cap:
            return False, True
        if segsize > self.dev_free():
            return False, False
        return True, False

    def release_cached(self):
        keep = []
        for s in self.segments:
            if len(s.blocks) == 1 and s.blocks[0].state == "inactive":
                self._trace("segment_free", frames=[], addr=s.addr, size=s.size, stream=s.stream)
                self._add("reserved_bytes", s.pool, -s.size)
                self._add("segment", s.pool, -1)
                self.num_device_free += 1
                self._reserved -= s.size
                self._free_set(s).discard(s.blocks[0])
            else:
                keep.append(s)
        self.segments = keep

    def malloc(self, n, frames=None, stream=0):
        frames = list(frames or []) if self.record_frames else []
        rounded = 512 if n < 512 else -(-n // 512) * 512
        small = rounded <= MiB
        pool = "small" if small else "large"
        blk = self._best_fit(rounded, pool, stream)
        if blk is None:
            if small:
                segsize = 2 * MiB
            elif rounded < 10 * MiB:
                segsize = 20 * MiB
            else:
                segsize = -(-rounded // (2 * MiB)) * (2 * MiB)
            ok, by_cap = self._can_get(segsize)
            if not ok:
                self.release_cached()
                self.num_alloc_retries += 1
                ok, by_cap = self._can_get(segsize)
                if not ok:
                    free = self.dev_free()
                    self._trace("oom", frames=frames, size=rounded, device_free=free, stream=stream)
                    self.num_ooms += 1
                    if by_cap:
                        self.num_oom_rejections += 1
                    self.observer = {
                        "device": self.device,
                        "alloc_size": segsize,
                        "device_total_or_cap": self.cap if self.cap is not None else self.total,
                        "device_free": free,
                    }
                    raise OOM(rounded, segsize, by_cap, free, stream)
            seg = Seg(self.next_addr, segsize, stream, pool, frames)
            self.next_addr += segsize + 2 * MiB  # keep segments apart like separate cudaMalloc ranges
            seg.blocks.append(Block(seg.addr, segsize, 0, "inactive", [], seg))
            self.segments.append(seg)  # addresses only grow: the list stays sorted by address
            self._reserved += segsize
            self._free_set(seg).add(seg.blocks[0])
            self._trace("segment_alloc", frames=frames, addr=seg.addr, size=segsize, stream=stream)
            self._add("reserved_bytes", pool, segsize)
            self._add("segment", pool, 1)
            self.num_device_alloc += 1
            blk = seg.blocks[0]
        seg = blk.seg
        rem = blk.size - rounded
        if (small and rem >= 512) or (not small and rem > MiB):
            i = seg.blocks.index(blk)
            rest = Block(blk.addr + rounded, rem, 0, "inactive", [], seg)
            seg.blocks.insert(i + 1, rest)
            self._free_set(seg).add(rest)
            blk.size = rounded
        self._free_set(seg).discard(blk)
        blk.state = "active_allocated"
        blk.req = n
        blk.frames = frames
        self._add("allocated_bytes", pool, blk.size)
        self._add("active_bytes", pool, blk.size)
        self._add("requested_bytes", pool, n)
        self._add("allocation", pool, 1)
        self._add("active", pool, 1)
        self._trace("alloc", frames=frames, addr=blk.addr, size=n, stream=stream)
        return blk

    def free(self, blk, frames=None, pending=False):
        frames = list(frames or []) if self.record_frames else []
        assert blk.state == "active_allocated", blk.state
        pool = blk.seg.pool
        self._trace("free_requested", frames=frames, addr=blk.addr, size=blk.req, stream=blk.seg.stream)
        self._add("allocated_bytes", pool, -blk.size)
        self._add("requested_bytes", pool, -blk.req)
        self._add("allocation", pool, -1)
        if pending:
            blk.state = "active_pending_free"
            return
        self._complete(blk, frames)

    def complete_pending(self, blk, frames=None):
        assert blk.state == "active_pending_free"
        self._complete(blk, list(frames or []) if self.record_frames else [])

    def _complete(self, blk, frames):
        pool = blk.seg.pool
        self._trace("free_completed", frames=frames, addr=blk.addr, size=blk.req, stream=blk.seg.stream)
        self._add("active_bytes", pool, -blk.size)
        self._add("active", pool, -1)
        blk.state = "inactive"
        blk.frames = []
        seg = blk.seg
        free = self._free_set(seg)
        free.add(blk)
        i = seg.blocks.index(blk)
        if i + 1 < len(seg.blocks) and seg.blocks[i + 1].state == "inactive":
            nb = seg.blocks.pop(i + 1)
            free.discard(nb)
            blk.size += nb.size
            blk.req = 0
        if i > 0 and seg.blocks[i - 1].state == "inactive":
            pb = seg.blocks[i - 1]
            pb.size += blk.size
            pb.req = 0
            seg.blocks.pop(i)
            free.discard(blk)

    # ---- per-step sample (what the collector's optimizer post-hook records)
    def sample(self, step, batch_size):
        self.timeline.append(
            {
                "step": step,
                "allocated_bytes": self.cur.get(("allocated_bytes", "all"), 0),
                "reserved_bytes": self.cur.get(("reserved_bytes", "all"), 0),
                "peak_allocated_bytes": self.peak.get(("allocated_bytes", "all"), 0),
                "time_us": self._tick(1000),
                "batch_size": batch_size,
            }
        )

    # ---- outputs
    def check(self):
        assert [s.addr for s in self.segments] == sorted(s.addr for s in self.segments)
        assert self._reserved == sum(s.size for s in self.segments)
        for key, free in self._free.items():
            want = {
                b
                for s in self.segments
                if (s.pool, s.stream) == key
                for b in s.blocks
                if b.state == "inactive"
            }
            assert free == want, key
        for s in self.segments:
            assert sum(b.size for b in s.blocks) == s.size
            a = s.addr
            for b in s.blocks:
                assert b.addr == a
                a += b.size
        assert self.allocated == self.cur.get(("allocated_bytes", "all"), 0)
        assert self.reserved == self.cur.get(("reserved_bytes", "all"), 0)

    def snapshot(self, legacy=False, settings=None):
        self.check()
        segs = []
        for s in sorted(self.segments, key=lambda s: s.addr):
            blocks = []
            for b in s.blocks:
                if legacy:
                    d = {
                        "size": b.size,
                        "requested_size": b.req if b.state != "inactive" else 0,
                        "state": b.state,
                    }
                    if b.state != "inactive":
                        d["history"] = [{"addr": b.addr, "real_size": b.req, "frames": b.frames}]
                    blocks.append(d)
                else:
                    blocks.append(
                        {
                            "address": b.addr,
                            "size": b.size,
                            "requested_size": b.req,
                            "state": b.state,
                            "frames": b.frames,
                        }
                    )
            d = {
                "device": self.device,
                "address": s.addr,
                "total_size": s.size,
                "allocated_size": sum(b.size for b in s.blocks if b.state == "active_allocated"),
                "active_size": sum(b.size for b in s.blocks if b.state != "inactive"),
                "requested_size": sum(b.req for b in s.blocks if b.state == "active_allocated"),
                "stream": s.stream,
            }
            if not legacy:
                d.update(
                    {
                        "segment_type": s.pool,
                        "segment_pool_id": [0, 0],
                        "is_expandable": False,
                        "frames": s.frames,
                    }
                )
            d["blocks"] = blocks
            segs.append(d)
        trace = self.trace if self.max_entries is None else self.trace[-self.max_entries :]
        out = {"segments": segs, "device_traces": [trace]}
        if settings is not None:
            out["allocator_settings"] = settings
        return out

    def memory_stats(self):
        st = {}
        metrics = [
            "allocated_bytes",
            "reserved_bytes",
            "active_bytes",
            "requested_bytes",
            "allocation",
            "segment",
            "active",
        ]
        for m in metrics:
            for p in POOLS:
                k = (m, p)
                st[f"{m}.{p}.current"] = self.cur.get(k, 0)
                st[f"{m}.{p}.peak"] = self.peak.get(k, 0)
                st[f"{m}.{p}.allocated"] = self.cum_alloc.get(k, 0)
                st[f"{m}.{p}.freed"] = self.cum_freed.get(k, 0)
        for p in POOLS:
            want = None if p == "all" else p.split("_")[0]
            split_b = [
                b
                for s in self.segments
                if (want is None or s.pool == want) and len(s.blocks) > 1
                for b in s.blocks
                if b.state == "inactive"
            ]
            st[f"inactive_split.{p}.current"] = len(split_b)
            st[f"inactive_split_bytes.{p}.current"] = sum(b.size for b in split_b)
        st.update(
            {
                "num_alloc_retries": self.num_alloc_retries,
                "num_ooms": self.num_ooms,
                "num_device_alloc": self.num_device_alloc,
                "num_device_free": self.num_device_free,
                "num_oom_rejections": self.num_oom_rejections,
                "num_sync_all_streams": 0,
                "max_split_size": -1,
            }
        )
        return st
