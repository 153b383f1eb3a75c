"""Swap preemption (actors/kv_swap.py): the allocator state machines of test_kv_allocator_stateful
with swap-out / swap-in / free-while-swapped rules (no leak, no double free, held slots within the
host tier's capacity and never evicted, spilled or overwritten while their sequence waits, every
swapped-in block holding the KV it left with), the plan's preempt/admit path, and the cost policy."""
from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from actors.kv_allocator import KVBlockAllocator, OutOfBlocksError
from actors.kv_service import KVEntry, KVService
from actors.kv_swap import RECOMPUTE, SWAP, SwapPolicy, can_swap_in, can_swap_out, swap_in, swap_out
from tests.test_kv_allocator_stateful import (DiskTierMachine, HostTierMachine, _ceil_div, _machine_settings,
                                              _WeakHashAllocator)


class _SwapRules:
    """Mixed into an allocator machine with a host tier. ``swapped``: sid -> (the KV each of its
    committed blocks held when it left, its tokens, num_tokens, num_committed)."""

    def __init__(self):
        super().__init__()
        self.swapped: dict[int, tuple[list[tuple[int, ...]], list[int], int, int]] = {}

    def _record_commit(self, sid: int, toks: list[int], n: int) -> None:
        """Also the partial last block: a swap copies it out and back like the full ones."""
        for i in range(self.ncommit[sid] // self.bs, _ceil_div(n, self.bs)):
            self.content[self.tables[sid][i]] = tuple(toks[:min((i + 1) * self.bs, n)])
        self.ncommit[sid] = n

    def _num_held(self) -> int:
        return sum(len(v[0]) for v in self.swapped.values())

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def swap_out(self, data):
        sid = self._pick(data)
        n = _ceil_div(self.ncommit[sid], self.bs)
        fits = n > 0 and self._num_held() + n <= self.nhost
        assert can_swap_out(self.a, sid) == fits
        if not fits:
            with pytest.raises(OutOfBlocksError):
                swap_out(self.a, sid)
            assert self.a.has_seq(sid) and self.a.take_copies() == []
            return
        toks, nc = self.tokens[sid], self.ncommit[sid]
        kept = [self.content[b] for b in self.tables[sid][:n]]
        assert kept == [tuple(toks[:min((i + 1) * self.bs, nc)]) for i in range(n)]
        assert swap_out(self.a, sid) == n
        self._apply_copies()
        assert not self.a.has_seq(sid) and self.a.is_swapped(sid)
        assert [self.host_content[s] for s in self.a.swapped[sid].slots] == kept
        self.swapped[sid] = (kept, toks, self.ntok[sid], nc)
        self._forget(sid)

    @precondition(lambda self: self.swapped)
    @rule(data=st.data(), grow=st.integers(0, 3))
    def swap_in(self, data, grow):
        sid = data.draw(st.sampled_from(sorted(self.swapped)), label="swapped")
        kept, toks, ntok, nc = self.swapped[sid]
        want = ntok + grow
        fits = _ceil_div(want, self.bs) <= self._model_free()
        assert can_swap_in(self.a, sid, want) == fits
        if not fits:
            with pytest.raises(OutOfBlocksError):
                swap_in(self.a, sid, want)
            assert self.a.is_swapped(sid) and self.a.take_copies() == []
            return
        used = self._used()
        assert swap_in(self.a, sid, want) == nc
        self._apply_copies()
        table = self.a.block_table(sid)
        assert len(table) == _ceil_div(want, self.bs) and len(set(table)) == len(table) and not set(table) & used
        assert [self.content[b] for b in table[:len(kept)]] == kept  # the KV it left with
        for b in table[len(kept):]:
            self.content.pop(b, None)
        assert (self.a.num_tokens(sid), self.a.num_committed(sid)) == (want, nc)
        del self.swapped[sid]
        self.tables[sid], self.tokens[sid], self.ntok[sid], self.ncommit[sid] = table, toks, want, nc

    @precondition(lambda self: self.swapped)
    @rule(data=st.data())
    def free_swapped(self, data):
        """Aborted while swapped out: its slots go back, nothing is copied."""
        sid = data.draw(st.sampled_from(sorted(self.swapped)), label="swapped")
        held = self.a.host.num_held
        self.a.free(sid)
        assert not self.a.is_swapped(sid) and self.a.take_copies() == []
        assert self.a.host.num_held == held - len(self.swapped[sid][0])
        kept, toks, _, nc = self.swapped.pop(sid)
        self.gone.append(toks[:nc])

    @invariant()
    def swapped_blocks_intact(self):
        """Held slots: within capacity with the cache entries, never evicted, spilled or overwritten."""
        if not hasattr(self, "a"):
            return
        host = self.a.host
        assert host.num_held == self._num_held() and host.num_held + host.num_blocks <= self.nhost
        assert sorted(self.a.swapped) == sorted(self.swapped)
        for sid, (kept, *_) in self.swapped.items():
            assert [self.host_content[s] for s in self.a.swapped[sid].slots] == kept

    def teardown(self):
        if hasattr(self, "a"):
            for sid in list(self.swapped):
                self.a.free(sid)
            assert self.a.host.num_held == 0
        super().teardown()


class SwapMachine(_SwapRules, HostTierMachine):
    pass


class WeakHashSwapMachine(_SwapRules, HostTierMachine):
    allocator_cls = _WeakHashAllocator


class SwapDiskMachine(_SwapRules, DiskTierMachine):
    """Swap-outs push host cache entries to disk to make room; held slots never spill."""


TestSwapMachine = SwapMachine.TestCase
TestSwapMachine.settings = _machine_settings
TestWeakHashSwapMachine = WeakHashSwapMachine.TestCase
TestWeakHashSwapMachine.settings = settings(_machine_settings, max_examples=100)
TestSwapDiskMachine = SwapDiskMachine.TestCase
TestSwapDiskMachine.settings = _machine_settings


# ---- the step plan ----------------------------------------------------------------------------------
def _service(mode: str | None, num_blocks: int = 6, host: int = 8) -> KVService:
    kv = KVService(num_blocks, 4, num_host_blocks=host, block_bytes=64)
    kv.swap = SwapPolicy(mode) if mode else None
    return kv


def _prefill(kv: KVService, sid: int, tokens: list[int]) -> None:
    """Admit sid, compute its prompt and one output token (decoding from then on)."""
    plan = kv.plan([], [KVEntry(sid, 0, len(tokens), 0, tokens)], 8, 64)
    assert [g.seq_id for g in plan.granted] == [sid]
    kv.allocator.commit(sid, tokens, len(tokens))


@pytest.mark.parametrize("mode", ["swap", "recompute", None])
def test_plan_preempts_by_swap_and_swaps_back_in(mode):
    kv = _service(mode)
    a, b = list(range(10, 19)), list(range(30, 39))  # 9 tokens: 3 blocks of 4 each, 6 blocks in all
    _prefill(kv, 1, a)
    _prefill(kv, 2, b)
    # both grow: seq 1 needs a 4th block, so seq 2 (lowest priority) is preempted
    plan = kv.plan([KVEntry(1, 9, 13), KVEntry(2, 9, 13)], [], 8, 64)
    assert plan.preempted == [2] and plan.swapped == ([2] if mode == "swap" else [])
    if mode != "swap":
        assert not kv.allocator.is_swapped(2) and plan.copies == []
        return
    assert [c.kind for c in plan.copies] == ["evict"] * 3  # 9 committed tokens: 3 blocks out
    kv.settle([kv_settle(1, a + [1, 2, 3, 4], 13)])
    kv.settle([kv_settle(1, free=True)])
    # seq 2 comes back: its 3 blocks are loaded, it resumes at 9 computed tokens
    plan = kv.plan([], [KVEntry(2, 0, 10, 0, b + [7])], 8, 64)
    (g,) = plan.granted
    assert (g.seq_id, g.swapped_in, g.num_computed, g.num_query) == (2, True, 9, 1)
    assert [c.kind for c in plan.copies].count("load") == 3
    assert kv.allocator.num_committed(2) == 9 and kv.stats()["host_swapped_blocks"] == 0
    assert kv.stats()["host_blocks_swapped_out"] == kv.stats()["host_blocks_swapped_in"] == 3
    kv.settle([kv_settle(2, free=True)])
    kv.allocator.check_invariants()
    assert kv.allocator.num_free_blocks == 6 and kv.allocator.host.num_held == 0


def kv_settle(sid: int, tokens: list[int] | None = None, n: int = 0, free: bool = False):
    from actors.kv_service import Settle

    return Settle(sid, free=True) if free else Settle(sid, token_ids=tokens, num_committed=n, num_tokens=n)


def test_swap_falls_back_to_recompute_when_the_host_tier_has_no_room():
    kv = _service("swap", host=2)  # 3 blocks to swap, 2 host slots
    _prefill(kv, 1, list(range(10, 19)))
    _prefill(kv, 2, list(range(30, 39)))
    plan = kv.plan([KVEntry(1, 9, 13), KVEntry(2, 9, 13)], [], 8, 64)
    assert plan.preempted == [2] and plan.swapped == [] and not kv.allocator.is_swapped(2)


def test_free_while_swapped_releases_the_host_slots():
    kv = _service("swap")
    _prefill(kv, 1, list(range(10, 19)))
    _prefill(kv, 2, list(range(30, 39)))
    kv.plan([KVEntry(1, 9, 13), KVEntry(2, 9, 13)], [], 8, 64)
    assert kv.allocator.host.num_held == 3
    kv.settle([kv_settle(2, free=True)])  # aborted while waiting
    assert kv.allocator.host.num_held == 0 and not kv.allocator.is_swapped(2)
    kv.allocator.check_invariants()


# ---- the cost policy ------------------------------------------------------------------------------
def _costs(out: tuple[int, float], back: tuple[int, float]):
    return lambda: {"device_to_host": out, "host_to_device": back}


def test_policy_compares_copy_and_prefill_costs():
    p = SwapPolicy("auto", block_bytes=100, copy_stats=_costs((1000, 0.01), (1000, 0.03)))
    assert p.copy_s_per_block() == pytest.approx(0.004)  # (1e-5 + 3e-5) s/B x 100 B
    assert p.swap_is_cheaper(1, 1)  # nothing known of prefill yet: swap, and measure
    p.observe_prefill(100, 0.1)  # 1 ms per token
    assert p.prefill_s_per_token == pytest.approx(1e-3)
    assert p.swap_is_cheaper(1, 5) and not p.swap_is_cheaper(1, 3)  # 4 ms of copies vs 5 / 3 ms
    p.observe_prefill(100, 0.6)  # moving average: 1 ms + 0.2 x (6 - 1) ms
    assert p.prefill_s_per_token == pytest.approx(2e-3)
    p.observe_prefill(0, 1.0)  # nothing prefilled: ignored
    assert p.prefill_s_per_token == pytest.approx(2e-3)


def test_policy_takes_one_measured_direction_for_both():
    p = SwapPolicy("auto", block_bytes=10, copy_stats=_costs((100, 0.5), (0, 0.0)))
    assert p.copy_s_per_block() == pytest.approx(0.1)
    assert SwapPolicy("auto", 10, _costs((0, 0.0), (0, 0.0))).copy_s_per_block() is None


def test_policy_modes_choose():
    alloc = KVBlockAllocator(8, 4, num_host_blocks=4)
    alloc.allocate(1, list(range(9)))
    alloc.commit(1, list(range(9)), 9)  # 3 blocks of committed KV
    slow_copy = _costs((1, 1.0), (1, 1.0))
    assert SwapPolicy("swap", 1, slow_copy).choose(alloc, 1) == SWAP
    assert SwapPolicy("recompute").choose(alloc, 1) == RECOMPUTE
    auto = SwapPolicy("auto", 1, slow_copy)
    assert auto.choose(alloc, 1) == SWAP  # prefill not measured yet
    auto.observe_prefill(10, 0.01)
    assert auto.choose(alloc, 1) == RECOMPUTE  # 3 blocks x 2 s vs 9 tokens x 1 ms
    small = KVBlockAllocator(8, 4, num_host_blocks=2)
    small.allocate(1, list(range(9)))
    small.commit(1, list(range(9)), 9)
    assert SwapPolicy("swap").choose(small, 1) == RECOMPUTE  # 3 blocks, 2 host slots


def test_unknown_mode_is_refused_naming_it():
    with pytest.raises(ValueError, match="'sideways'"):
        SwapPolicy("sideways")
