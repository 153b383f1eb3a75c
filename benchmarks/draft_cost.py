"""What one drafting call of the EAGLE head costs: ops (and, on CUDA, launch calls) and time per
``EagleProposer.propose`` for B sequences in steady state.

    python -m benchmarks.draft_cost [--device cpu|cuda] [--batch 1,8,64] [--context 256] [--reps 20]

Each of B sequences has ``--context`` committed features (random: acceptance plays no part in the
cost); every step commits two more (a root and one accepted draft, as a typical step does), then
drafts K=5 as a greedy chain (``chain``) and as the default dynamic tree of width 3, 15 nodes
(``tree``). The time is the median over ``--reps`` steps (``step_costs.device_median_s``); ops are counted over one step
(benchmarks.op_count's counting: every dispatcher call, nested ones included). On CUDA each case
runs eagerly and with the head's steps as CUDA graphs (``EagleProposer.use_graphs``).
"""
from __future__ import annotations

import argparse
from types import SimpleNamespace

import torch

from benchmarks.op_count import count_ops
from benchmarks.report import md_table
from benchmarks.step_costs import device_median_s
from cluster.config import engine_choices

K, TREE_WIDTH = 5, 3


class DraftLoop:
    """B sequences in one proposer: ``step()`` commits two features each, then drafts once."""

    def __init__(self, proposer, batch: int, context: int, hidden: int, vocab: int, device: torch.device,
                 tree_width: int):
        from actors.proposers.base import DraftRequest
        from actors.sampling_params import SamplingParams

        self.proposer, self.device, self.hidden = proposer, device, hidden
        self.gen = gen = torch.Generator().manual_seed(0)  # the same inputs for every proposer
        nodes = K * tree_width
        self.reqs = [DraftRequest(b, torch.randint(vocab, (context,), generator=gen).tolist(), [1] * K, nodes,
                                  SamplingParams(), None, []) for b in range(batch)]
        for r in self.reqs:
            proposer.observe(r.seq_id, 0, self._features(context - 1))
        proposer.propose(self.reqs)  # catch-up of the whole context: the prefill-like first call

    def _features(self, n: int) -> torch.Tensor:  # [n, H]
        return torch.randn(n, self.hidden, generator=self.gen).to(self.device)

    def step(self):
        for r in self.reqs:
            start = len(r.token_ids) - 1
            r.token_ids += [r.token_ids[-1], r.token_ids[-2]]
            self.proposer.observe(r.seq_id, start, self._features(2))
        return self.proposer.propose(self.reqs)


def measure(proposer_for, batch: int, context: int, hidden: int, vocab: int, device: torch.device,
            reps: int, mode: str) -> list[dict]:
    rows = []
    for shape, width in (("chain", 1), ("tree", TREE_WIDTH)):
        proposer = proposer_for(width)
        if mode == "graphs":
            proposer.use_graphs(max(batch, 1), context + 64)
        loop = DraftLoop(proposer, batch, context, hidden, vocab, device, width)
        for _ in range(3):
            loop.step()
        counted = count_ops(loop.step, SimpleNamespace(layers=[]), cuda=device.type == "cuda")
        seconds = device_median_s(loop.step, device, reps)
        rows.append(dict(batch=batch, shape=shape, mode=mode, ops=counted.all_ops, top_ops=counted.top_ops,
                         launches=counted.launches, ms=1e3 * seconds))
    return rows


def run(model_name: str, device: torch.device, batches: list[int], context: int, reps: int,
        backend: str = "auto") -> list[dict]:
    """Every (batch, chain|tree, eager|graphs) case of the committed head for ``model_name``."""
    from actors.model.attention_backends import set_attention_backend
    from actors.model.loader import load_model
    from actors.proposers.eagle import build_eagle_proposer
    from actors.verifier import Verifier

    model = load_model(model_name, device=device).model
    set_attention_backend(model, backend, device)
    verifier = Verifier(model, 4, 16, device, model.dtype, enforce_eager=True)
    cfg = model.config
    rows = []
    modes = ("eager", "graphs") if device.type == "cuda" else ("eager",)
    for b in batches:
        for mode in modes:
            rows += measure(lambda w: build_eagle_proposer(None, model_name, verifier, w), b, context,
                            cfg.hidden_size, cfg.vocab_size, device, reps, mode)
    return rows


def table(rows: list[dict]) -> str:
    return md_table(["B", "draft", "mode", "ops per propose", "from Python", "launch calls", "ms per propose"],
                    [[str(r["batch"]), r["shape"], r["mode"], str(r["ops"]), str(r["top_ops"]),
                      "-" if r["launches"] is None else str(r["launches"]), f"{r['ms']:.2f}"] for r in rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.draft_cost", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", default="1,8,64")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--attention-backend", default="auto", choices=engine_choices("attention_backend"),
                    help="the target's backend, which the head borrows (auto: as the engine runs)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = run(args.model, device, [int(x) for x in args.batch.split(",")], args.context, args.reps,
               args.attention_backend)
    print(f"{args.model} EAGLE head on {device}, context {args.context}, K={K}, tree width {TREE_WIDTH}\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
