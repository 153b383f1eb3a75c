"""Benchmark prompt sets: JSONL lines ``{"id", "category", "messages" | "prompt", "max_tokens"}``.

Loading validates every line once (bad lines are named by file and line number), and a
stratified sample keeps each category's share of the set, so a small ``--sample`` still looks like
the production mix the methodology asks for instead of whatever comes first in the file.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from cluster.prompt_file import PromptLine, read_prompt_file

PROMPTS_DIR = Path(__file__).parent / "prompts"
BENCH500_PROMPTS = PROMPTS_DIR / "bench500.jsonl"
CHAT20_PROMPTS = PROMPTS_DIR / "chat20.jsonl"
DEFAULT_MAX_TOKENS = 128  # for lines that carry no max_tokens of their own
UNCATEGORIZED = "uncategorized"


@dataclass(frozen=True, slots=True)
class BenchPrompt:
    id: str
    category: str
    prompt: list[dict] | str  # chat messages, or a plain text sent as one user message
    max_tokens: int | None = None  # the line's own budget, if it has one

    @property
    def messages(self) -> list[dict]:
        return self.prompt if isinstance(self.prompt, list) else [{"role": "user", "content": self.prompt}]

    def budget(self, cap: int | None) -> int:
        """Output tokens to ask for: the line's own max_tokens, capped by ``--max-tokens``."""
        if self.max_tokens is None:
            return cap or DEFAULT_MAX_TOKENS
        return min(self.max_tokens, cap) if cap else self.max_tokens


def default_prompts_path() -> Path:
    """bench500.jsonl (the production-mix set) when present, else the 20-prompt chat set."""
    return BENCH500_PROMPTS if BENCH500_PROMPTS.is_file() else CHAT20_PROMPTS


def load_prompt_set(path: str | Path) -> list[BenchPrompt]:
    """Every line of the set (``cluster.prompt_file``), checked: a bad line is named by file and number."""
    return [_bench_prompt(path, line) for line in read_prompt_file(path, "--prompts")]


def _bench_prompt(path: str | Path, line: PromptLine) -> BenchPrompt:
    where, obj, prompt = f"{path}:{line.number}", line.fields, line.prompt
    if not (isinstance(prompt, str) and prompt) and not (isinstance(prompt, list) and prompt):
        raise ValueError(f"{where}: 'messages' must be a non-empty list (or 'prompt' a non-empty string)")
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError(f"{where}: max_tokens={max_tokens!r} must be a positive integer")
    category = obj.get("category") or UNCATEGORIZED
    return BenchPrompt(str(obj.get("id", line.number)), str(category), prompt, max_tokens)


def allocate(counts: dict[str, int], n: int) -> dict[str, int]:
    """Split ``n`` over categories in proportion to ``counts`` (largest remainder: each category
    gets floor or ceil of its exact share; leftover seats go to the largest remainders, then to
    the larger category, then by name, so the split is deterministic)."""
    total = sum(counts.values())
    if not 0 <= n <= total:
        raise ValueError(f"cannot take {n} of {total} prompts")
    exact = {c: n * k / total for c, k in counts.items()}
    out = {c: int(v) for c, v in exact.items()}
    order = sorted(counts, key=lambda c: (-(exact[c] - out[c]), -counts[c], c))
    for c in order[: n - sum(out.values())]:
        out[c] += 1
    return out


def stratified_sample(items: list[BenchPrompt], n: int, seed: int = 0) -> list[BenchPrompt]:
    """``n`` prompts keeping each category's share; the same seed picks the same prompts. The
    sample keeps the file order."""
    if n < 1 or n > len(items):
        raise ValueError(f"--sample {n}: must be between 1 and the {len(items)} prompts of the set")
    by_cat: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        by_cat.setdefault(it.category, []).append(i)
    quota = allocate({c: len(ix) for c, ix in by_cat.items()}, n)
    rng = random.Random(seed)
    chosen = [i for c in sorted(by_cat) for i in rng.sample(by_cat[c], quota[c])]
    return [items[i] for i in sorted(chosen)]
