"""A replica's side of the shared KV tier (actors/kv_shared_tier.py): publish and fetch blocks.

Publish (write-through at prefill): after a step, every prompt block that the step's prefill
completed is copied out of the device pool and published (one object per block, owned by the tier
actor). Write-through rather than on eviction: another replica can use a hot prefix (a system
prompt, a shared document) while the publisher still holds it on its device, which eviction-time
publishing would never offer; it needs no host tier; and it costs one copy per computed prompt
block, small beside the prefill that computed it. Blocks served from any cache are not published
again (the publisher of their first computation did that).

Fetch (on a local miss): before a step is scheduled, each waiting sequence about to be considered
for admission is looked up locally (device, host, disk: the allocator's verified lookup); the
blocks after the local hit are asked of the tier, which verifies them against the token ids. The
whole fetch (the tier's answer and the bytes) must arrive within ``timeout_s``, else it counts as
a miss and those tokens are recomputed: a slow tier never holds the step up for long. Fetched
blocks enter the device pool's prefix cache through the allocator's own ask-then-do API (a
temporary sequence: ``allocate`` over the prefix, the blocks written, ``commit`` registers them
with their chain, ``free``), so the admission that follows finds them as verified device hits and
every invariant of the allocator holds (nothing held afterwards, nothing leaked).

Transport: a Ray actor handle (blocks through the object store; the tier actor keeps copies it
owns, so they outlive this replica), or an in-process ``SharedKVTier`` (tests). A tier found by
name that stops answering (its actor died, e.g. with the Serve replica that owned it) is looked up
by name again, so the replicas move to the new tier that a restarted tier host starts.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from time import monotonic

import numpy as np
import torch

log = logging.getLogger("specray.kv_shared")

RESOLVE_EVERY_S = 5.0  # at most one lookup of the tier by name per this many seconds
_TMP_SEQ = -1  # seq id of the temporary sequence that brings fetched blocks in (real ids are >= 0)
_COUNTERS = ("prefix_queries", "prefix_hits")  # host/disk hits of a bring-in stay counted: its loads happened


@dataclass(slots=True)
class Fetched:
    """What one fetch brought in for a sequence: tokens of its prefix found locally before it, and
    tokens fetched after them (block aligned)."""

    local_tokens: int
    shared_tokens: int
    host_tokens: int = 0  # of local_tokens, loaded from the host tier by the bring-in
    disk_tokens: int = 0  # ... and from disk


class SharedKVClient:
    def __init__(self, tier, kv, verifier, block_size: int, timeout_s: float, layout: str, resolve=None):
        """tier: a Ray ActorHandle of the tier, an in-process SharedKVTier, or None with ``resolve``
        (called until it returns the handle, e.g. a lookup by name; at most every few seconds);
        kv: the in-process KVService (its ``allocator`` may be replaced on reset); verifier: owns
        ``kv_caches`` and executes block copies; layout: names the model and the cache's dtype and
        block shape (the tier serves blocks of the same layout only)."""
        self._tier, self._resolve, self._next_resolve = tier, resolve, 0.0
        self.kv, self.verifier, self.block_size, self.timeout_s = kv, verifier, block_size, timeout_s
        self.layout = layout
        self._tried: dict[int, Fetched] = {}  # seq_id -> the fetch made for its admission
        self._tables: dict[int, list[int]] = {}  # this step's prefill chunks: seq_id -> block table
        self._tier_stats: dict = {}
        self._stats_ref = None  # (the handle asked, the ObjectRef of its stats)
        self.stats_ = {"lookups": 0, "hits": 0, "misses": 0, "timeouts": 0, "errors": 0, "blocks_fetched": 0,
                       "bytes_fetched": 0, "blocks_published": 0, "bytes_published": 0}

    # ---- the engine's hooks --------------------------------------------------------------------
    def before_schedule(self, waiting, room: int) -> None:
        """Fetch for up to ``room`` waiting sequences (not swapped out, not tried since they were
        queued) the blocks their local lookup misses."""
        alloc = self.kv.allocator
        if not alloc.enable_prefix_caching:
            return
        if self._tried:  # forget sequences that left the queue without being admitted (aborted)
            queued = {s.seq_id for s in waiting}
            self._tried = {k: v for k, v in self._tried.items() if k in queued}
        for seq in list(waiting)[:room]:
            if seq.seq_id in self._tried or alloc.is_swapped(seq.seq_id):
                continue
            self._tried[seq.seq_id] = self._fetch_into(alloc, seq.token_ids)

    def after_schedule(self, scheduled, block_tables: dict[int, list[int]]) -> None:
        """Sequences admitted this step: which of their cached tokens the shared tier supplied; the
        block tables of the prefill chunks, to publish from (a sequence that finishes in this step
        leaves the scheduler's tables before ``publish``; its blocks are intact until the next plan)."""
        self._tables = {s.seq.seq_id: block_tables[s.seq.seq_id] for s in scheduled if not s.is_decode}
        for s in scheduled:
            f = self._tried.pop(s.seq.seq_id, None)  # tried while waiting, so admitted in this step
            if f is not None:
                seq = s.seq
                seq.num_shared_cached_tokens = max(0, min(seq.num_cached_tokens - f.local_tokens, f.shared_tokens))
                if not (seq.num_host_cached_tokens or seq.num_disk_cached_tokens):  # loaded by the bring-in
                    seq.num_host_cached_tokens = min(f.host_tokens, seq.num_cached_tokens)
                    seq.num_disk_cached_tokens = min(f.disk_tokens, seq.num_cached_tokens - seq.num_host_cached_tokens)

    def publish(self, scheduled) -> None:
        """After the step's commit: publish the prompt blocks its prefill chunks completed."""
        tables, self._tables = self._tables, {}
        tier = self._handle()
        if tier is None:
            return
        bs = self.block_size
        for s in scheduled:
            seq = s.seq
            if s.is_decode or seq.error is not None or seq.seq_id not in tables:
                continue
            end = min(seq.num_computed, seq.num_prompt_tokens) // bs
            start = (seq.num_computed - s.num_query) // bs
            if end > start:
                self._publish(tier, seq.token_ids[:end * bs], start, tables[seq.seq_id][start:end])

    # ---- fetch ---------------------------------------------------------------------------------
    def _fetch_into(self, alloc, token_ids: list[int]) -> Fetched:
        bs = self.block_size
        local = len(alloc._lookup(token_ids)[0])
        want = (len(token_ids) - 1) // bs - local
        if want <= 0:
            return Fetched(local * bs, 0)
        blocks = self._fetch(token_ids, local, want)
        n = len(blocks)
        prefix = token_ids[:(local + n) * bs]
        if not n or not alloc.can_allocate(prefix):
            return Fetched(local * bs, 0)
        saved = {k: getattr(alloc, k) for k in _COUNTERS}  # a bring-in is not a prompt's query
        alloc.allocate(_TMP_SEQ, prefix)
        try:
            copies = alloc.take_copies()  # loads of local lower-tier hits, write-backs of reused blocks
            if copies:
                self.verifier.apply_block_copies(copies)
            self._write(alloc.block_table(_TMP_SEQ)[local:], blocks)
            alloc.commit(_TMP_SEQ, prefix, len(prefix))
            lower = alloc.host_hit_tokens(_TMP_SEQ), alloc.disk_hit_tokens(_TMP_SEQ)
        finally:
            alloc.free(_TMP_SEQ)
            for k, v in saved.items():
                setattr(alloc, k, v)
        return Fetched(local * bs, n * bs, *lower)

    def _fetch(self, token_ids: list[int], start: int, want: int) -> list[np.ndarray]:
        """Verified blocks ``start..`` (up to ``want``) from the tier within the timeout; [] on a
        miss, a timeout or a tier that cannot answer."""
        tier = self._handle()
        if tier is None:
            return []
        self.stats_["lookups"] += 1
        try:
            blocks = self._lookup(tier, token_ids, start, want)
        except TimeoutError:
            self.stats_["timeouts"] += 1
            blocks = []
        except Exception as e:  # noqa: BLE001  the tier is an optimisation: recompute instead
            self.stats_["errors"] += 1
            log.warning("shared KV tier lookup failed (%s: %s); recomputing", type(e).__name__, e)
            self._lost(tier)
            blocks = []
        if any(b.nbytes != self._block_bytes() for b in blocks):  # a layout the key should have kept apart
            self.stats_["errors"] += 1
            log.warning("shared KV tier sent blocks of %s bytes, expected %d; recomputing",
                        sorted({b.nbytes for b in blocks}), self._block_bytes())
            blocks = []
        if blocks:
            self.stats_["hits"] += 1
            self.stats_["blocks_fetched"] += len(blocks)
            self.stats_["bytes_fetched"] += sum(b.nbytes for b in blocks)
        else:
            self.stats_["misses"] += 1
        return blocks

    def _lookup(self, tier, token_ids: list[int], start: int, want: int) -> list[np.ndarray]:
        if not _is_actor(tier):
            return tier.lookup(self.layout, token_ids, start, want)
        import ray

        deadline = monotonic() + self.timeout_s
        try:
            refs = ray.get(tier.lookup.remote(self.layout, token_ids, start, want), timeout=self.timeout_s)
            return ray.get(refs, timeout=max(0.0, deadline - monotonic())) if refs else []
        except ray.exceptions.GetTimeoutError as e:
            raise TimeoutError(str(e)) from None

    def _block_bytes(self) -> int:
        caches = self.verifier.kv_caches
        return 2 * len(caches) * caches[0][0][0].numel() * caches[0][0].element_size()

    def _write(self, block_ids: list[int], blocks: list[np.ndarray]) -> None:
        """blocks[i]: one block's K/V as bytes, [2 * layers, bs, kvh, d] of the cache dtype."""
        caches = self.verifier.kv_caches
        k0 = caches[0][0]
        data = torch.from_numpy(np.stack(blocks))  # [n, 2 * layers, bs, kvh, d * itemsize] bytes (a copy)
        data = data.view(k0.dtype).view(len(blocks), 2 * len(caches), *k0.shape[1:]).to(k0.device)
        ids = torch.tensor(block_ids, dtype=torch.int64, device=k0.device)
        for layer, (k, v) in enumerate(caches):
            k.index_copy_(0, ids, data[:, 2 * layer])
            v.index_copy_(0, ids, data[:, 2 * layer + 1])

    # ---- publish -------------------------------------------------------------------------------
    def _read(self, block_ids: list[int]) -> np.ndarray:
        """[n, 2 * layers, bs, kvh, d] of the device blocks, as bytes on the host."""
        caches = self.verifier.kv_caches
        ids = torch.tensor(block_ids, dtype=torch.int64, device=caches[0][0].device)
        parts = [c.index_select(0, ids) for kv in caches for c in kv]  # each [n, bs, kvh, d]
        out = torch.stack(parts, dim=1).to("cpu").contiguous()
        return out.view(torch.uint8).numpy()

    def _publish(self, tier, prefix: list[int], start: int, block_ids: list[int]) -> None:
        blocks = list(self._read(block_ids))
        sizes = [int(b.nbytes) for b in blocks]
        try:
            if _is_actor(tier):
                import ray

                refs = [ray.put(b) for b in blocks]  # the tier keeps a copy of those it stores
                tier.put.remote(self.layout, prefix, start, refs, sizes)  # not awaited: publishing never waits
            else:
                tier.put(self.layout, prefix, start, [b.copy() for b in blocks], sizes)
        except Exception as e:  # noqa: BLE001
            self.stats_["errors"] += 1
            log.warning("shared KV tier publish failed (%s: %s)", type(e).__name__, e)
            return
        self.stats_["blocks_published"] += len(blocks)
        self.stats_["bytes_published"] += sum(sizes)

    # ---- the tier --------------------------------------------------------------------------------
    def _handle(self):
        if self._tier is None and self._resolve is not None and monotonic() >= self._next_resolve:
            self._next_resolve = monotonic() + RESOLVE_EVERY_S
            try:
                self._tier = self._resolve()
            except Exception as e:  # noqa: BLE001  not up yet: misses until it is
                log.info("shared KV tier not reachable yet: %s", e)
        return self._tier

    def _lost(self, tier) -> None:
        """``tier`` failed to answer (its actor died: the Serve application's tier host was restarted
        and started a new tier, or the tier crashed): with ``resolve``, forget the handle and its
        figures, so that the tier is looked up by name again (a live one comes back as it was);
        a handle given without ``resolve`` is all there is, and is kept."""
        if self._resolve is not None and self._tier is tier:
            self._tier, self._tier_stats = None, {}

    def stats(self) -> dict:
        """This replica's view (lookups, hits, misses, timeouts, blocks and bytes fetched and
        published) and the tier's own figures as last reported (``tier_*``; never waited for)."""
        tier = self._handle()
        if _is_actor(tier):
            import ray

            if self._stats_ref is not None:
                asked, ref = self._stats_ref
                ready, _ = ray.wait([ref], timeout=0)
                if ready:
                    self._stats_ref = None
                    try:
                        self._tier_stats = ray.get(ref)
                    except Exception:  # noqa: BLE001  the tier died: look it up again
                        self._lost(asked)
            if self._stats_ref is None and self._tier is tier:
                self._stats_ref = (tier, tier.stats.remote())
        elif tier is not None:
            self._tier_stats = tier.stats()
        return {**self.stats_, **{f"tier_{k}": v for k, v in self._tier_stats.items()}}


def _is_actor(tier) -> bool:
    return tier is not None and type(tier).__name__ == "ActorHandle"
