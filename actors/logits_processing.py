"""Per-request logits processing: logit_bias, min_tokens, repetition, frequency and presence penalties.

Each changes the target's distribution of the next token depending on the tokens generated before
it. Under speculation a token tree holds several hypothetical continuations at once, so the rows
of one verification step are processed each with its own history: node i's row (the distribution
of the token after node i) counts the tokens generated so far plus the draft tokens on the path
from the root to node i, and min_tokens looks at that node's depth. Verification then compares the
drafts against these processed distributions (greedy argmax, speculative sampling or the seeded
race), so the output is exactly what plain decoding with the same processing gives: lossless.

Definitions (as OpenAI and vLLM, in vLLM's order): ``logit_bias`` adds to each listed token's
logit; ``min_tokens`` masks the EOS tokens (and ``stop_token_ids``) until that many tokens are generated; then
``repetition_penalty`` r divides a positive logit by r and multiplies a negative one by r for every
token seen in the prompt or generated so far; then ``frequency_penalty`` subtracts itself times
the token's count among the generated tokens and ``presence_penalty`` once for a token generated
at least once. Temperature, top-k and top-p come after, on the processed logits.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from actors.sampling_params import SamplingParams


def path_counts(parents: Sequence[int], tokens: Sequence[int], vocab: int, base: torch.Tensor) -> torch.Tensor:
    """Counts [n, V] of generated tokens before each node's next token: ``base`` [V] (the
    sequence's own generated tokens) plus the tokens on the path from the root (excluded: it is
    already generated) to node i (included)."""
    n = len(parents)
    rows, cols = [], []
    paths: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        paths[i] = paths[parents[i]] + [int(tokens[i])]
        rows += [i] * len(paths[i])
        cols += paths[i]
    counts = base.to(torch.float32).unsqueeze(0).repeat(n, 1)
    if rows:
        idx = (torch.tensor(rows, device=counts.device), torch.tensor(cols, device=counts.device))
        counts.index_put_(idx, torch.ones(len(rows), device=counts.device), accumulate=True)
    return counts


def node_depths(parents: Sequence[int]) -> list[int]:
    depths = [0] * len(parents)
    for i in range(1, len(parents)):
        depths[i] = depths[parents[i]] + 1
    return depths


def process_logits(logits: torch.Tensor, params: SamplingParams, prompt_ids: Sequence[int],
                   output_ids: Sequence[int], parents: Sequence[int], tokens: Sequence[int],
                   eos_ids: Collection[int]) -> torch.Tensor:
    """logits [n, V] of the n nodes of a token tree (``parents``, ``tokens``; one root-only node for
    plain decoding) -> processed logits [n, V] (float32, a new tensor). ``output_ids``: the tokens
    the sequence generated so far (the root is the last of prompt + output)."""
    n, vocab = logits.shape
    out = logits.to(torch.float32).clone()
    device = out.device
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias], device=device)
        out[:, ids] += torch.tensor([b for _, b in params.logit_bias], device=device)
    if params.min_tokens:
        depths = torch.tensor(node_depths(parents), device=device)
        early = (len(output_ids) + depths) < params.min_tokens  # [n]: the next token would come too soon
        eos = torch.tensor(sorted(set(eos_ids) | set(params.stop_token_ids)), dtype=torch.long, device=device)
        if early.any() and len(eos):
            out[early.nonzero().unsqueeze(1), eos.unsqueeze(0)] = float("-inf")
    if params.repetition_penalty == 1.0 and not params.presence_penalty and not params.frequency_penalty:
        return out
    base = torch.bincount(torch.tensor(list(output_ids), dtype=torch.long), minlength=vocab)[:vocab]
    counts = path_counts(parents, tokens, vocab, base.to(device))
    if params.repetition_penalty != 1.0:
        r = params.repetition_penalty
        seen = counts > 0
        if len(prompt_ids):
            in_prompt = torch.zeros(vocab, dtype=torch.bool, device=device)
            in_prompt[torch.tensor(list(prompt_ids), dtype=torch.long, device=device)] = True
            seen |= in_prompt
        out = torch.where(seen, torch.where(out > 0, out / r, out * r), out)
    if params.frequency_penalty:
        out -= params.frequency_penalty * counts
    if params.presence_penalty:
        out -= params.presence_penalty * (counts > 0).to(out.dtype)
    return out


def reference_process(logits: torch.Tensor, params: SamplingParams, prompt_ids: Sequence[int],
                      generated: Sequence[int], eos_ids: Collection[int]) -> torch.Tensor:
    """The oracle for one row: logits [V] after ``prompt_ids`` and ``generated`` (what plain
    decoding sees), written out token by token. Tests compare ``process_logits`` with it."""
    out = [float(x) for x in logits.to(torch.float64)]
    for t, b in params.logit_bias:
        out[t] += b
    if len(generated) < params.min_tokens:
        for t in set(eos_ids) | set(params.stop_token_ids):
            out[t] = float("-inf")
    seen = set(prompt_ids) | set(generated)
    for t in range(len(out)):
        if params.repetition_penalty != 1.0 and t in seen:
            out[t] = out[t] / params.repetition_penalty if out[t] > 0 else out[t] * params.repetition_penalty
        count = sum(1 for g in generated if g == t)
        out[t] -= params.frequency_penalty * count + (params.presence_penalty if count else 0.0)
    return torch.tensor(out, dtype=torch.float64)
