"""What each CPU product mode (``SPECRAY_CPU_ACTIVATIONS``: float32, int16, int8) does to the default
model's outputs: ``python -m benchmarks.activation_quality --sample 24``.

The reference is float32 (the fp32 model's bits). For each mode, on the same stratified prompts
(bench500 and the held-out set): how many greedy answers are the reference's token for token (and
where the others turn), and, teacher-forced on the reference's answers, the mean negative
log-likelihood per answer token and how often the mode's argmax is the reference's. The modes switch
in this process (``kernels.cpu_native.activations``); the prompts and answers are each mode's own
engine run (prefix caching off: each mode computes its own prompts' KV), plain greedy decoding, so
speculation plays no part."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks.report import md_table

MODES = ("float32", "int16", "int8")


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (the shorter one's length if one is a prefix of
    the other), or None when they are equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@torch.inference_mode()
def teacher_forced(model, convs: list[list[int]], starts: list[int], device) -> tuple[float, list[list[int]]]:
    """Summed NLL of each conversation's tokens from ``starts[i]`` on, and the argmax at those positions."""
    from training.data import packed_hidden, token_batches

    nll, argmax = 0.0, [None] * len(convs)
    for batch in token_batches(convs, 2048):
        hidden = packed_hidden(model, [convs[i] for i in batch], device)  # [N, H]
        offset = 0
        for i in batch:
            n, s = len(convs[i]), starts[i]
            logp = torch.log_softmax(model.compute_logits(hidden[offset + s - 1:offset + n - 1]).float(), -1)
            target = torch.tensor(convs[i][s:], device=logp.device)
            nll -= float(logp.gather(1, target[:, None]).sum())
            argmax[i] = logp.argmax(-1).tolist()
            offset += n
    return nll, argmax


def run(sample: int, seed: int, threads: int) -> list[dict]:
    from actors.sampling_params import SamplingParams
    from benchmarks.options import select_prompt_sets
    from cluster.config import EngineConfig, SpeculativeConfig
    from cluster.engine import LLMEngine
    from kernels import cpu_native

    if not cpu_native.load():
        raise SystemExit(f"the CPU kernels are not built: {cpu_native.unavailable_reason()}")
    prompts = [p for _, _, items in select_prompt_sets("bench500,heldout", sample, seed) for p in items]
    engine = LLMEngine(EngineConfig(speculative=SpeculativeConfig.from_draft_arg("none", 0, None),
                                    num_threads=threads, max_num_seqs=16,
                                    enable_prefix_caching=False))  # no mode reads KV another one wrote
    model = engine.verifier.model
    ids = [engine.prompts.encode(p.messages, chat=True) for p in prompts]
    params = [SamplingParams(max_tokens=p.budget(None)) for p in prompts]
    answers = {}
    for mode in MODES:
        with cpu_native.activations(mode):
            answers[mode] = [o.token_ids for o in engine.generate(ids, params, concurrency=16)]
    ref = answers["float32"]
    convs, starts = [i + a for i, a in zip(ids, ref)], [len(i) for i in ids]
    tokens = sum(len(a) for a in ref)
    forced = {}
    for mode in MODES:
        with cpu_native.activations(mode):
            forced[mode] = teacher_forced(model, convs, starts, engine.device)
    rows = []
    for mode in MODES:
        turns = [(d, len(r)) for a, r in zip(answers[mode], ref) if (d := first_difference(a, r)) is not None]
        same_top1 = sum(x == y for a, r in zip(forced[mode][1], forced["float32"][1]) for x, y in zip(a, r))
        rows.append(dict(mode=mode, prompts=len(prompts), same_answers=len(prompts) - len(turns),
                         turns=turns, tokens=sum(len(a) for a in answers[mode]), ref_tokens=tokens,
                         nll=forced[mode][0] / tokens, top1_agreement=same_top1 / tokens))
    engine.shutdown()
    return rows


def table(rows: list[dict]) -> str:
    head = ["mode", "greedy answers = float32's", "answer tokens", "first turn (token of answer)",
            "NLL / token on float32's answers", "argmax = float32's"]
    return md_table(head, [[r["mode"], f"{r['same_answers']}/{r['prompts']}", str(r["tokens"]),
                            ", ".join(f"{d}/{n}" for d, n in sorted(r["turns"])[:6]) + (" ..." if len(r["turns"]) > 6 else ""),
                            f"{r['nll']:.4f}", f"{100 * r['top1_agreement']:.2f}%"] for r in rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.activation_quality", description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=24, help="prompts per set (bench500 and held-out), stratified")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="also write activation_quality.{md,json} here")
    args = ap.parse_args(argv)
    if args.sample < 1:
        ap.error(f"--sample {args.sample}: must be at least 1")
    rows = run(args.sample, args.seed, args.threads)
    md = table(rows)
    print(md)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "activation_quality.md").write_text(md + "\n")
        (args.out / "activation_quality.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
