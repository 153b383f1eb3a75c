"""kernels.cpu_native.copy_kv_slots: the accepted tree nodes' K/V moved in every layer by one op, against
the torch reference actors.model.attention.copy_kv_slots (overlapping moves read every source first), and
a bad slot refused before anything is written."""
from __future__ import annotations

import pytest
import torch

from actors.model.attention import allocate_kv_cache, copy_kv_slots
from kernels import cpu_native as cn

pytestmark = pytest.mark.skipif(not cn.load(), reason=f"CPU kernels not built: {cn.unavailable_reason()}")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copy_kv_slots_matches_the_torch_reference(dtype):
    g = _gen(7)
    ours, ref = allocate_kv_cache(3, 4, 8, 2, 16, dtype), allocate_kv_cache(3, 4, 8, 2, 16, dtype)
    for (k, v), (rk, rv) in zip(ours, ref):
        for a, b in ((k, rk), (v, rv)):
            a.copy_(torch.randn(a.shape, generator=g).to(dtype))
            b.copy_(a)
    # overlapping chains (a slot both read and written: every source read first), a tree's jump, a no-op
    for src, dst in (([5, 6, 7], [6, 7, 8]), ([9, 8], [8, 9]), ([20, 31], [17, 18]), ([3], [3])):
        s, d = torch.tensor(src), torch.tensor(dst)
        cn.copy_kv_slots([k for k, _ in ours], [v for _, v in ours], s, d)
        copy_kv_slots(ref, s, d)
        assert all(torch.equal(a, b) for pair, rpair in zip(ours, ref) for a, b in zip(pair, rpair)), (src, dst)
    cn.copy_kv_slots([k for k, _ in ours], [v for _, v in ours], torch.tensor([], dtype=torch.int64),
                     torch.tensor([], dtype=torch.int64))
    assert all(torch.equal(a, b) for pair, rpair in zip(ours, ref) for a, b in zip(pair, rpair))


def test_copy_kv_slots_refuses_a_slot_outside_the_cache_and_writes_nothing():
    caches = allocate_kv_cache(2, 4, 8, 2, 16)
    for k, v in caches:
        k.normal_(generator=_gen(3)), v.normal_(generator=_gen(4))
    before = [t.clone() for pair in caches for t in pair]
    with pytest.raises(RuntimeError, match=r"slot 2 -> 32 outside the cache's 32 slots"):
        cn.copy_kv_slots([k for k, _ in caches], [v for _, v in caches], torch.tensor([1, 2]), torch.tensor([0, 32]))
    assert all(torch.equal(a, b) for a, b in zip([t for pair in caches for t in pair], before))
    with pytest.raises(RuntimeError, match="equal-length"):
        cn.copy_kv_slots([caches[0][0]], [caches[0][1]], torch.tensor([1, 2]), torch.tensor([0]))
