"""Shared steps of the KV allocator tests."""
from __future__ import annotations

from actors.kv_allocator import KVBlockAllocator


def committed(alloc: KVBlockAllocator, seq_id: int, tokens: list[int], extra: int = 0) -> int:
    """Allocate and commit all of `tokens` (as after a prefill); return the prefix hit."""
    hit = alloc.allocate(seq_id, tokens, extra)
    alloc.commit(seq_id, tokens, len(tokens))
    return hit
