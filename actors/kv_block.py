"""A KV block and a sequence's table of them, as the block allocator (actors/kv_allocator.py) keeps
them: a block's reference count and prefix-cache identity (its chained hash, its tokens, the chain
id of the verified token prefix it ends and its parent's), and per sequence its block ids, how many
positions they cover and how many are committed, with the hash state of the committed prefix.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

ROOT_CHAIN = 0  # chain id of the empty prefix
BROKEN_CHAIN = -1  # chain state after a hash collision: nothing further of that sequence is registered


def block_hash(prev_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """Chained hash of one full block: hash of (previous block's hash, this block's tokens)."""
    return hash((prev_hash, token_ids))


@dataclass(slots=True)
class Block:
    tier: ClassVar[str] = "device"
    id: int
    ref_count: int = 0
    hash: int | None = None  # not None iff the block is registered in the prefix cache
    token_ids: tuple[int, ...] | None = None  # the block's tokens while registered
    chain_id: int = ROOT_CHAIN  # unique id of the verified token prefix ending with this block
    parent_chain_id: int = ROOT_CHAIN

    def clear(self) -> None:
        self.hash = None
        self.token_ids = None
        self.chain_id = self.parent_chain_id = ROOT_CHAIN


@dataclass(slots=True)
class SeqTable:
    blocks: list[int]
    num_tokens: int
    num_committed: int
    prev_hash: int | None = None  # hash state after block num_committed // block_size - 1
    prev_chain_id: int = ROOT_CHAIN
    host_hit_tokens: int = 0  # of the prefix hit at allocate, tokens loaded from the host tier
    disk_hit_tokens: int = 0  # ... and from the disk tier
