"""The default target through its alias against transformers' own GGUF load (one per session)."""
from __future__ import annotations

import pytest
import torch

from actors.model.loader import load_model
from actors.model.registry import DEFAULT_MODEL, resolve_alias
from tests.model import Chunk, make_batch

pytestmark = pytest.mark.model


@pytest.fixture(scope="session")
def hf_gguf_model():
    """transformers' model loaded straight from the GGUF file (the reference; ~20 s, once per session)."""
    from transformers import AutoModelForCausalLM

    gguf = resolve_alias(DEFAULT_MODEL)
    return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()


def _prompt_ids(tokenizer) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours."}],
                                        tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    return list(ids)


def test_default_model_matches_transformers_gguf(default_model, hf_gguf_model):
    model, tok = default_model.model, default_model.tokenizer
    assert tok is not None and tok.chat_template
    ids = _prompt_ids(tok)
    bs, table = 16, [7, 2, 5, 0]
    kv = model.allocate_kv_cache(8, bs)
    with torch.inference_mode():
        ours = model.compute_logits(model(make_batch([Chunk(ids, 0, table)], bs), kv))
        ref = hf_gguf_model(torch.tensor([ids])).logits[0].float()
        torch.testing.assert_close(ours, ref, atol=2e-3, rtol=0)
        # greedy decode through the paged cache = transformers' greedy generate
        want = hf_gguf_model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)[0, len(ids):]
        got, nxt = [], int(ours[-1].argmax())
        for step in range(6):
            got.append(nxt)
            batch = make_batch([Chunk([nxt], len(ids) + step, table)], bs)
            nxt = int(model.compute_logits(model(batch, kv))[0].argmax())
    assert got == want.tolist()


def test_second_load_reuses_the_conversion(default_model, monkeypatch):
    """The GGUF is converted once (what made a first load slow); a later load reads the cached
    directory. (A wall-clock bound here failed whenever the machine was busy.)"""
    from actors.model import loader

    def no_conversion(*args):
        raise AssertionError("the GGUF was converted again")

    monkeypatch.setattr(loader, "export_gguf", no_conversion)
    again = load_model(DEFAULT_MODEL)
    assert again.model_dir == default_model.model_dir
    assert again.config == default_model.config
