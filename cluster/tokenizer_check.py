"""A draft model must speak the target's tokenizer: checked when the draft is configured."""
from __future__ import annotations

SAMPLE_TEXTS = (
    "Hello, world! How are you today?",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)",
    "안녕하세요. 오늘 날씨가 좋네요.",
    '{"name": "specray", "tokens": [1, 2, 3]}',
)


def check_tokenizers_compatible(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Vocab size, special tokens and the encodings of sample texts must match; else ValueError."""
    tv, dv = len(target_tok), len(draft_tok)
    if tv != dv:
        raise ValueError(f"draft {draft_name!r} has a different tokenizer: vocab size {dv} vs the "
                         f"target {target_name!r}'s {tv}; use a draft trained on the target's tokenizer")
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        a, b = getattr(target_tok, attr, None), getattr(draft_tok, attr, None)
        if a != b:
            raise ValueError(f"draft {draft_name!r} has a different tokenizer: {attr} {b} vs the target's {a} "
                             f"(vocab sizes {dv} and {tv})")
    for text in SAMPLE_TEXTS:
        a = target_tok.encode(text, add_special_tokens=False)
        b = draft_tok.encode(text, add_special_tokens=False)
        if a != b:
            raise ValueError(f"draft {draft_name!r} has a different tokenizer: it encodes {text[:30]!r} "
                             f"differently (vocab sizes {dv} and {tv})")


def check_draft_tokenizer(target_tok, target_name: str, draft_model: str | None, draft_tok=None) -> None:
    """Driver-side: the draft model exists and speaks the target's tokenizer; else ValueError naming it."""
    from actors.model.loader import load_tokenizer, resolve_model_dir

    if not draft_model:
        raise ValueError("method 'draft' needs draft_model (a local path or alias)")
    draft_dir = resolve_model_dir(draft_model)  # clear error for a missing path, before any worker starts
    draft_tok = draft_tok or load_tokenizer(draft_dir)
    if draft_tok is None:
        raise ValueError(f"draft model {draft_model!r} has no tokenizer files (tokenizer.json / "
                         "tokenizer_config.json), so it cannot be checked against the target's tokenizer")
    check_tokenizers_compatible(target_tok, draft_tok, target_name, draft_model)
