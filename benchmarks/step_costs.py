"""What one target step costs, measured on the Verifier directly (no engine, no tokenizer, so a
``random:<shape>`` model will do): the device's copy bandwidth and the bandwidth-bound TPOT it
implies, plain decode TPOT at concurrency 1, and the cost of verifying q tokens in one forward
relative to one token (what speculation can buy: q tokens verified for the price of ~1 step).

The sequence is laid out as the engine lays it out (``cluster/engine.py`` ``_plan_forward``):
one prefill chunk of ``context`` random tokens, then decode steps of one token each at positions
context, context+1, ... (slot = block_table[pos // block_size] * block_size + pos % block_size),
each step's next token the argmax of its logits row (one ``.item()``: the step's one device->host
sync, as the engine's sampler has). Verify forwards put a token tree after the committed tokens:
a chain of q nodes (causal [q, q] mask, the engine's tree path) or a branching 16-node tree with
its ancestor mask, logits for every node, positions root + depth; they rewrite only those
speculative slots, never the context.
"""
from __future__ import annotations

import inspect
import statistics
import time
from dataclasses import dataclass, field

import torch

from actors.tree import TokenTree
from actors.verifier import SeqChunk, Verifier

CHAIN_QS = (1, 2, 4, 8, 16, 32, 64)
# a branching tree of 16 nodes, depth 5: 3 candidates at depth 1, then fewer deeper
TREE16_PARENTS = (-1, 0, 0, 0, 1, 1, 2, 3, 4, 4, 5, 6, 8, 9, 10, 12)
BOUND_FORMULA = ("bound TPOT = weight bytes read per step / copy bandwidth (copy bandwidth counts each "
                 "copied byte read once and written once; HBM reads and writes share one bus)")


def copy_bandwidth(nbytes: int, seconds: float) -> float:
    """Bytes/s of a device-to-device copy of ``nbytes``: read + written bytes over its time."""
    return 2 * nbytes / seconds


def bound_tpot_s(weight_bytes: int, copy_bytes_per_s: float) -> float:
    """Bandwidth-bound seconds per decode step: every weight read once per step at the copy rate."""
    return weight_bytes / copy_bytes_per_s


def step_weight_bytes(model) -> tuple[int, int]:
    """(bytes read per decode step, all parameter bytes): all parameters but an untied input
    embedding, of which a step reads only its tokens' rows."""
    total = model.param_bytes()
    embed = model.embed_tokens.weight
    untied = not model.config.tie_word_embeddings
    return total - (embed.numel() * embed.element_size() if untied else 0), total


def device_median_s(fn, device: torch.device, reps: int) -> float:
    """Median seconds of ``reps`` calls of ``fn`` on the device's own clock (CUDA events around each
    call; the wall clock on CPU). No warm-up: the caller's."""
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_copy_s(device: torch.device, nbytes: int, reps: int) -> float:
    """Median seconds of one ``nbytes`` device-to-device copy (CUDA events; the clock on CPU)."""
    a = torch.ones(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    b.copy_(a)  # warm-up
    seconds = device_median_s(lambda: b.copy_(a), device, reps)
    del a, b
    return seconds


def verifier_modes(device: torch.device) -> list[tuple[str, dict]]:
    """(label, Verifier keywords) to measure: on CUDA eager and CUDA graphs when the Verifier has a
    switch (``enforce_eager`` or ``cuda_graphs``), eager only elsewhere (graphs need CUDA), its
    default when it has none. Graph buckets are sized for the one sequence measured
    (``max_num_seqs=1``, when the Verifier takes it: fewer captures)."""
    params = inspect.signature(Verifier).parameters
    extra = {"max_num_seqs": 1} if "max_num_seqs" in params else {}
    if "enforce_eager" in params:
        modes = [("eager", {"enforce_eager": True}), ("graphs", {"enforce_eager": False, **extra})]
    elif "cuda_graphs" in params:
        modes = [("eager", {"cuda_graphs": False}), ("graphs", {"cuda_graphs": True, **extra})]
    else:
        return [("default", extra)]
    return modes if torch.device(device).type == "cuda" else modes[:1]


@dataclass(slots=True)
class StepCosts:
    mode: str
    decode_s: float  # median seconds of one plain decode step (c=1)
    verify_s: dict[str, float] = field(default_factory=dict)  # tree label -> median seconds of its forward
    decode_steps: int = 0
    verify_reps: int = 0
    launches: dict[str, int] = field(default_factory=dict)  # one decode step: device kernels, launch API calls


def count_launches(fn, model) -> dict[str, int]:
    """One call of ``fn`` (a step over ``model``) counted by ``benchmarks.op_count`` on CUDA:
    kernels run on the device, launch calls made by the host (a CUDA graph replay is one
    ``cudaGraphLaunch`` running many kernels)."""
    from benchmarks.op_count import count_ops

    c = count_ops(fn, model, cuda=True)
    return {"kernels": c.device_kernels, "launch_calls": c.launches, "graph_launches": c.graph_launches}


class OneSequence:
    """One sequence's KV in a Verifier of its own: prefill, decode steps, trial verify forwards."""

    def __init__(self, model, device: torch.device, dtype: torch.dtype, positions: int, block_size: int = 16,
                 **verifier_kw):
        self.block_size = block_size
        num_blocks = -(-positions // block_size) + 1
        self.table = list(range(num_blocks))
        self.verifier = Verifier(model, num_blocks, block_size, device, dtype, **verifier_kw)
        self.vocab = model.config.vocab_size
        self.pos, self.last = 0, 0  # committed positions; the last token (not yet in the KV)

    def _chunk(self, ids: list[int], positions: list[int], mask: torch.Tensor | None = None) -> SeqChunk:
        bs, start, end = self.block_size, self.pos, self.pos + len(ids)
        slots = [self.table[p // bs] * bs + p % bs for p in range(start, end)]
        return SeqChunk(ids, positions, slots, end, self.table[: -(-end // bs)], mask)

    def prefill(self, n: int, seed: int = 0, ids: list[int] | None = None) -> torch.Tensor:
        """Commit ``ids`` (default: ``n`` random tokens) from position 0; returns the last row's logits [V]."""
        if ids is None:
            ids = torch.randint(self.vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
        logits = self.verifier.forward_logits([self._chunk(ids, list(range(len(ids))))], [len(ids) - 1])
        self.pos, self.last = len(ids), int(logits[0].argmax().item())
        return logits[0]

    def decode_step(self) -> torch.Tensor:
        """Commit the last token and take the argmax as the next; returns its logits [V]."""
        logits = self.verifier.forward_logits([self._chunk([self.last], [self.pos])], [0])
        self.pos, self.last = self.pos + 1, int(logits[0].argmax().item())
        return logits[0]

    def verify(self, tree: TokenTree) -> torch.Tensor:
        """One forward over ``tree`` (root = the last token) after the committed tokens; commits
        nothing. Returns the logits of every node [n, V] (their argmax read back: one sync)."""
        mask = tree.ancestor_mask() if tree.size > 1 else None
        chunk = self._chunk(tree.tokens, tree.positions(self.pos), mask)
        logits = self.verifier.forward_logits([chunk], list(range(tree.size)))
        logits.argmax(-1).tolist()
        return logits


def trees(root: int, vocab: int) -> dict[str, TokenTree]:
    """The verify shapes: chains of q nodes (root included) and the 16-node branching tree."""
    out = {f"chain q={q}": TokenTree.chain(root, [(root + i) % vocab for i in range(1, q)]) for q in CHAIN_QS}
    tree = TokenTree.root(root)
    for i, parent in enumerate(TREE16_PARENTS[1:], start=1):
        tree.add(parent, (root + i) % vocab)
    out["tree 16 nodes"] = tree
    return out


def _median_s(fn, reps: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()  # ends in a device->host copy: the clock sees the whole step
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_steps(model, device: torch.device, dtype: torch.dtype, mode: str, verifier_kw: dict, context: int,
                  decode_steps: int, reps: int, warmup: int = 3) -> StepCosts:
    """Prefill ``context`` tokens, time ``decode_steps`` plain steps and every verify shape."""
    seq = OneSequence(model, device, dtype, context + warmup + decode_steps + max(CHAIN_QS) + 1, **verifier_kw)
    seq.prefill(context)
    decode_s = _median_s(seq.decode_step, decode_steps, warmup)
    verify_s = {label: _median_s(lambda t=t: seq.verify(t), reps, 2) for label, t in trees(seq.last, seq.vocab).items()}
    launches = count_launches(seq.decode_step, model) if device.type == "cuda" else {}
    del seq
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return StepCosts(mode, decode_s, verify_s, decode_steps, reps, launches)
