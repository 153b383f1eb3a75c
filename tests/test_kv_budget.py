"""cluster.runtime.kv_blocks_for: the KV pool's size and the context it allows."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cluster.runtime import kv_blocks_for


def _model(max_pos=2048, window=None):
    return SimpleNamespace(max_position_embeddings=max_pos, sliding_window=window, num_layers=2, num_kv_heads=2,
                           head_dim=8)


def _config(max_model_len=None, blocks=1000, block_size=16):
    return SimpleNamespace(block_size=block_size, num_kv_blocks=blocks, kv_cache_gb=1.0, max_model_len=max_model_len)


def test_context_is_the_smallest_of_model_request_and_pool():
    assert kv_blocks_for(_config(), _model(), torch.float32, 6) == (1000, 2048)
    assert kv_blocks_for(_config(max_model_len=300), _model(), torch.float32, 6) == (1000, 300)
    assert kv_blocks_for(_config(blocks=40), _model(), torch.float32, 6)[1] == 40 * 16 - 6 - 16


def test_sliding_window_model_stops_at_its_window():
    """Attention does not apply a window: sequences never outgrow it, so full attention is exact."""
    assert kv_blocks_for(_config(), _model(max_pos=32768, window=1024), torch.float32, 6)[1] == 1024
    with pytest.raises(ValueError, match=r"max_model_len=4096 exceeds the model's context 1024 \(its sliding"):
        kv_blocks_for(_config(max_model_len=4096), _model(max_pos=32768, window=1024), torch.float32, 6)
    with pytest.raises(ValueError, match=r"max_model_len=4096 exceeds the model's context 2048$"):
        kv_blocks_for(_config(max_model_len=4096), _model(), torch.float32, 6)
