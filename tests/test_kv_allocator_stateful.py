"""A Hypothesis state machine that checks actors.kv_allocator against an independent model of
block ownership (random allocate/append/truncate/commit/free/preempt), also with a hash
function that collides all the time, and with host and disk tiers below the device pool (the
model executes every planned copy, so a hit from any tier is checked against the KV it holds)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from actors.kv_allocator import KVBlockAllocator, OutOfBlocksError


def _ceil_div(n: int, d: int) -> int:
    return -(-n // d)


# Tiny vocabulary and a few shared prompt heads, so that prefix hits (and evictions) are frequent.
_HEADS = ((), (0, 1, 0, 1, 1, 0, 1, 1), (0, 1, 0, 1, 0, 0), (1, 1, 1, 1, 1, 1, 1, 1))
_tokens = st.builds(lambda head, tail: list(head) + tail, st.sampled_from(_HEADS),
                    st.lists(st.integers(0, 1), max_size=5)).filter(bool)
_MAX_SEQS = 5  # keeps the pool from being full most of the time


class AllocatorMachine(RuleBasedStateMachine):
    """Random allocate/append/truncate/commit/free/preempt. The model tracks each table,
    the tokens whose KV each committed full block holds (`content`, the whole prefix through that
    block), and derives ref counts and free counts on its own."""

    allocator_cls = KVBlockAllocator

    num_blocks = st.integers(8, 32)
    num_host_blocks = st.just(0)
    num_disk_blocks = st.just(0)

    @initialize(block_size=st.integers(2, 4), caching=st.sampled_from([True, True, True, False]),
                data=st.data())
    def setup(self, block_size, caching, data):
        num_blocks = data.draw(self.num_blocks, label="num_blocks")
        self.nhost = data.draw(self.num_host_blocks, label="num_host_blocks")
        self.ndisk = data.draw(self.num_disk_blocks, label="num_disk_blocks")
        self.a = self.allocator_cls(num_blocks, block_size, enable_prefix_caching=caching,
                                    num_host_blocks=self.nhost, num_disk_blocks=self.ndisk)
        self.nb, self.bs, self.caching = num_blocks, block_size, caching
        self.tables: dict[int, list[int]] = {}
        self.tokens: dict[int, list[int]] = {}  # known tokens of each sequence
        self.ntok: dict[int, int] = {}
        self.ncommit: dict[int, int] = {}
        self.content: dict[int, tuple[int, ...]] = {}
        self.host_content: dict[int, tuple[int, ...]] = {}  # host slot -> prefix whose KV it holds
        self.disk_content: dict[int, tuple[int, ...]] = {}  # disk slot -> prefix whose KV it holds
        self.gone: list[list[int]] = []  # committed tokens of freed sequences
        self.next_id = 0

    # -- model helpers
    def _used(self) -> set[int]:
        return {b for t in self.tables.values() for b in t}

    def _model_free(self) -> int:
        return self.nb - len(self._used())

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _check_fresh(self, blocks: list[int], used_before: set[int]) -> None:
        assert len(set(blocks)) == len(blocks) and not set(blocks) & used_before
        for b in blocks:
            self.content.pop(b, None)  # handed out for writing: old KV is gone

    def _allocate(self, sid: int, tokens: list[int], extra: int) -> None:
        if not self.a.can_allocate(tokens, extra):
            free_before = self.a.num_free_blocks
            with pytest.raises(OutOfBlocksError):
                self.a.allocate(sid, tokens, extra)
            assert not self.a.has_seq(sid) and self.a.num_free_blocks == free_before
            assert self.a.take_copies() == []
            return
        used = self._used()
        hit = self.a.allocate(sid, tokens, extra)
        self._apply_copies()
        table = self.a.block_table(sid)
        total = len(tokens) + extra
        assert len(table) == _ceil_div(total, self.bs)
        assert hit % self.bs == 0 and hit <= (len(tokens) - 1) // self.bs * self.bs
        assert self.caching or hit == 0
        for i in range(hit // self.bs):  # every hit block holds KV of exactly this prefix
            assert self.content.get(table[i]) == tuple(tokens[:(i + 1) * self.bs])
        self._check_fresh(table[hit // self.bs:], used)
        self.tables[sid], self.tokens[sid] = table, list(tokens)
        self.ntok[sid], self.ncommit[sid] = total, hit

    def _apply_copies(self) -> None:
        """Execute the allocator's tier moves on the model's contents, in order (no tier: none)."""
        for c in self.a.take_copies():
            assert self.a.host is not None, c
            if c.kind in ("spill", "disk_load"):
                assert self.a.disk is not None, c
            if c.kind == "evict":
                assert c.device_block in self.content, f"evicting block {c.device_block} without KV"
                self.host_content[c.host_slot] = self.content[c.device_block]
            elif c.kind == "load":
                assert c.host_slot in self.host_content, f"loading empty host slot {c.host_slot}"
                self.content[c.device_block] = self.host_content[c.host_slot]
            elif c.kind == "spill":
                assert c.host_slot in self.host_content, f"spilling empty host slot {c.host_slot}"
                assert 0 <= c.disk_slot < self.ndisk
                self.disk_content[c.disk_slot] = self.host_content[c.host_slot]
            else:
                assert c.disk_slot in self.disk_content, f"loading empty disk slot {c.disk_slot}"
                self.content[c.device_block] = self.disk_content[c.disk_slot]

    def _forget(self, sid: int) -> None:
        for d in (self.tables, self.tokens, self.ntok, self.ncommit):
            del d[sid]

    def _pick(self, data) -> int:
        return data.draw(st.sampled_from(sorted(self.tables)), label="seq")

    # -- rules
    @precondition(lambda self: len(self.tables) < _MAX_SEQS)
    @rule(tokens=_tokens, extra=st.integers(0, 3))
    def allocate(self, tokens, extra):
        self._allocate(self._new_id(), tokens, extra)

    @precondition(lambda self: len(self.tables) < _MAX_SEQS)
    @rule(tokens=_tokens, over=st.integers(-1, 2))
    def allocate_to_fill(self, tokens, over):
        """Ask for about as many blocks as are free plus what a prefix hit could save: exercises
        can_allocate at the boundary, where free-but-cached hits must be paid for."""
        blocks = self._model_free() + (len(tokens) - 1) // self.bs + over
        self._allocate(self._new_id(), tokens, max(0, blocks * self.bs - len(tokens)))

    def _prefill(self, tokens) -> int | None:
        """A new sequence allocated for ``tokens`` and all of them committed; None if it did not fit."""
        sid = self._new_id()
        self._allocate(sid, tokens, 0)
        if sid not in self.tables:
            return None
        self.a.commit(sid, tokens, len(tokens))
        self._record_commit(sid, tokens, len(tokens))
        return sid

    @precondition(lambda self: len(self.tables) < _MAX_SEQS)
    @rule(tokens=_tokens)
    def allocate_and_prefill(self, tokens):
        self._prefill(tokens)

    @precondition(lambda self: len(self.tables) < _MAX_SEQS)
    @rule(tokens=_tokens)
    def prefill_and_finish(self, tokens):
        """A short request that leaves only cached blocks behind: fills the LRU that evicts."""
        sid = self._prefill(tokens)
        if sid is not None:
            self.gone.append(list(tokens))
            self.a.free(sid)
            self._forget(sid)

    @precondition(lambda self: self.tables)
    @rule(data=st.data(), grow=st.integers(-2, 6))
    def append(self, data, grow):
        sid = self._pick(data)
        n = max(0, self.ntok[sid] + grow)  # grow <= 0: a no-op
        expected = _ceil_div(n, self.bs) - len(self.tables[sid]) <= self._model_free()
        assert self.a.can_append(sid, n) == expected
        if not expected:
            with pytest.raises(OutOfBlocksError):
                self.a.append(sid, n)
            return
        used, old = self._used(), self.tables[sid]
        self.a.append(sid, n)
        self._apply_copies()
        table = self.a.block_table(sid)
        assert table[:len(old)] == old
        self._check_fresh(table[len(old):], used)
        self.tables[sid], self.ntok[sid] = table, max(n, self.ntok[sid])

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def truncate(self, data):
        sid = self._pick(data)
        n = data.draw(st.integers(self.ncommit[sid], self.ntok[sid]), label="n")
        self.a.truncate(sid, n)
        self.tables[sid] = self.tables[sid][:_ceil_div(n, self.bs)]
        self.ntok[sid], self.tokens[sid] = n, self.tokens[sid][:n]

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def commit(self, data):
        sid = self._pick(data)
        n = data.draw(st.integers(self.ncommit[sid], self.ntok[sid]), label="n")
        toks = self.tokens[sid]
        if len(toks) < n:  # generated tokens become known when committed
            toks += data.draw(st.lists(st.integers(0, 1), min_size=n - len(toks),
                                       max_size=n - len(toks)), label="generated")
        self.a.commit(sid, toks, n)
        self._record_commit(sid, toks, n)

    def _record_commit(self, sid: int, toks: list[int], n: int) -> None:
        for i in range(self.ncommit[sid] // self.bs, n // self.bs):
            self.content[self.tables[sid][i]] = tuple(toks[:(i + 1) * self.bs])
        self.ncommit[sid] = n

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def free(self, data):
        sid = self._pick(data)
        self.gone.append(self.tokens[sid][:self.ncommit[sid]])
        self.a.free(sid)
        self._forget(sid)

    @precondition(lambda self: len(self.tables) < _MAX_SEQS and any(self.gone))
    @rule(data=st.data(), tail=st.lists(st.integers(0, 1), min_size=1, max_size=3))
    def allocate_earlier_prefix(self, data, tail):
        """A new prompt extending a freed sequence's committed tokens (a multi-turn follow-up):
        its prefix sits on the device, in the host tier, or is gone."""
        head = data.draw(st.sampled_from([g for g in self.gone if g]), label="earlier")
        self._allocate(self._new_id(), head + tail, 0)

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def preempt(self, data):
        sid = self._pick(data)
        tokens = self.tokens[sid]
        self.a.free(sid)
        self._forget(sid)
        if tokens:
            self._allocate(sid, tokens, 0)

    @rule(sid=st.integers(-3, 0))
    def free_unknown(self, sid):
        with pytest.raises(KeyError, match=str(sid)):
            self.a.free(sid)

    # -- checks
    @invariant()
    def consistent(self):
        if not hasattr(self, "a"):
            return
        self.a.check_invariants()
        refs = [0] * self.nb
        for sid, table in self.tables.items():
            assert self.a.block_table(sid) == table
            assert (self.a.num_tokens(sid), self.a.num_committed(sid)) == (self.ntok[sid],
                                                                          self.ncommit[sid])
            for b in table:
                refs[b] += 1
        assert [self.a.ref_count(b) for b in range(self.nb)] == refs
        assert self.a.num_free_blocks == refs.count(0)
        # capacity, and every lower-tier entry's slot holds KV of its own tokens
        for tier, n, content in ((self.a.host, self.nhost, self.host_content),
                                 (self.a.disk, self.ndisk, self.disk_content)):
            if tier is None:
                continue
            assert tier.num_blocks <= n
            for e in tier._entries.values():
                assert 0 <= e.slot < n
                assert content[e.slot][-self.bs:] == e.token_ids

    def teardown(self):
        if not hasattr(self, "a"):
            return
        for sid in list(self.tables):
            self.a.free(sid)
        self.a.check_invariants()
        assert self.a.num_free_blocks == self.nb and self.a.num_used_blocks == 0


class _WeakHashAllocator(KVBlockAllocator):
    def _hash(self, prev_hash, toks):
        return sum(toks) % 3  # ignores the chain and collides all the time


class WeakHashMachine(AllocatorMachine):
    allocator_cls = _WeakHashAllocator


_machine_settings = settings(max_examples=200, stateful_step_count=40, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])
class HostTierMachine(AllocatorMachine):
    """The same, with a host tier of 1..8 blocks under a smaller device pool (evictions are
    frequent): evictions write back, lookups load back."""

    num_blocks = st.integers(6, 16)
    num_host_blocks = st.integers(1, 8)


class WeakHashHostMachine(HostTierMachine):
    allocator_cls = _WeakHashAllocator


class DiskTierMachine(HostTierMachine):
    """Host tier of 1..4 blocks over a disk tier of 1..8: the host LRU spills to disk, lookups
    load from either, disk LRU drops."""

    num_blocks = st.integers(6, 10)
    num_host_blocks = st.integers(1, 4)
    num_disk_blocks = st.integers(1, 8)


class WeakHashDiskMachine(DiskTierMachine):
    allocator_cls = _WeakHashAllocator


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = _machine_settings
TestWeakHashMachine = WeakHashMachine.TestCase
TestWeakHashMachine.settings = settings(_machine_settings, max_examples=100)
TestHostTierMachine = HostTierMachine.TestCase
TestHostTierMachine.settings = _machine_settings
TestWeakHashHostMachine = WeakHashHostMachine.TestCase
TestWeakHashHostMachine.settings = settings(_machine_settings, max_examples=100)
TestDiskTierMachine = DiskTierMachine.TestCase
TestDiskTierMachine.settings = _machine_settings
TestWeakHashDiskMachine = WeakHashDiskMachine.TestCase
TestWeakHashDiskMachine.settings = settings(_machine_settings, max_examples=100)
