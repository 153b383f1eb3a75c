"""The head's draft temperature: how much to sharpen its distribution for sampled requests.

A sampled request at temperature T drafts from q = softmax(head logits / (T * s)). Any q keeps
verification lossless (multi-step speculative sampling is told the q each draft came from; seeded
requests are decided by the target's own race, q only picks the guesses), but how often a draft is
accepted depends on how close q is to the target's p = softmax(target logits / T): rejection
sampling accepts with probability sum_v min(p_v, q_v), and the race coupling of seeded requests
tracks the same overlap. A head trained with soft cross-entropy on noisy features comes out flatter
than the target, so the best s is below 1. ``s`` is fitted on held-out conversations at the end of
training (``actors/eagle/fit.py``) and stored in the head file; a file without it drafts at s = 1.

    python -m actors.eagle.calibrate HEAD.safetensors --data DIR[,DIR...] [--write]

prints the overlap per scale on the conversations under DIR (features from ``actors.eagle.train``)
and, with ``--write``, stores the best scale in the head file.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

SCALES = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2)  # candidate s
TEMPERATURES = (0.7, 1.0)  # the overlap is averaged over these request temperatures
INFO_KEY = "draft_temperature_scale"


def overlap(target_logits: torch.Tensor, head_logits: torch.Tensor, vocab: torch.Tensor, temperature: float,
            scale: float) -> torch.Tensor:
    """target_logits [N, V], head_logits [N, Vd] over the draft vocabulary ``vocab`` [Vd] (token
    ids) -> [N] sum_v min(p_v, q_v): the acceptance probability of a draft sampled from
    q = softmax(head / (T * scale)) against p = softmax(target / T)."""
    if temperature <= 0 or scale <= 0:
        raise ValueError(f"temperature={temperature} and scale={scale} must both be positive")
    p = torch.softmax(target_logits.float() / temperature, dim=-1)[:, vocab]  # [N, Vd]: q is 0 elsewhere
    q = torch.softmax(head_logits.float() / (temperature * scale), dim=-1)
    return torch.minimum(p, q).sum(-1)


def best_scale(target_logits: torch.Tensor, head_logits: torch.Tensor, vocab: torch.Tensor,
               scales=SCALES, temperatures=TEMPERATURES) -> tuple[float, dict[float, float]]:
    """The scale with the highest mean overlap over ``temperatures``, and each scale's mean."""
    means = {s: float(sum(overlap(target_logits, head_logits, vocab, t, s).mean() for t in temperatures))
             / len(temperatures) for s in scales}
    return max(means, key=means.get), means


@torch.no_grad()
def first_draft_logits(head, examples, lm_head: torch.Tensor, max_positions: int = 4000
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced first drafts over the answers of ``examples``: (target logits [N, V] at the
    positions the head predicts, head logits [N, Vd]), at most ``max_positions`` rows.
    lm_head [V, H]: the target's output matrix (features are final-normed)."""
    from actors.eagle.fit import _attend, _qkv

    targets, heads, n = [], [], 0
    dev, lm_head = head.fc.weight.device, lm_head.float()
    for ex in examples:
        toks = ex.tokens.view(1, -1).to(dev)
        feats = ex.features.float().view(1, len(ex.tokens), -1).to(dev)  # [1, L, H]
        L = feats.shape[1]
        if L < 3:
            continue
        origins = torch.arange(L - 1, device=dev)
        h = head.entry(toks[:, 1:], feats[:, :-1].to(head.fc.weight.dtype))
        q, k, v = _qkv(head, h, origins)
        out = head.finish(h, _attend(head, q, k, v, [], [], origins))  # [1, L-1, H] ~ f_{t+1}
        first = max(0, ex.num_prompt - 2)  # origin t drafts the token after position t + 1
        heads.append(head.logits(out[0, first:]).float())
        targets.append(feats[0, 1 + first:] @ lm_head.T)
        n += len(heads[-1])
        if n >= max_positions:
            break
    if not heads:
        raise ValueError("no conversation long enough to calibrate on")
    return torch.cat(targets)[:max_positions].cpu(), torch.cat(heads)[:max_positions].cpu()


def calibrate(head, examples, lm_head: torch.Tensor) -> tuple[float, dict[float, float]]:
    """The head's best draft temperature scale on ``examples`` (held-out answers) and the table."""
    tl, hl = first_draft_logits(head, examples, lm_head)
    return best_scale(tl, hl, head.draft_vocab.cpu())


def held_out(examples: list, seed: int) -> list:
    """The conversations ``actors.eagle.fit`` held out of training with this seed."""
    from actors.eagle.fit import split_held_out

    return split_held_out(examples, seed)[1]


def rewrite_scale(path: Path, scale: float) -> None:
    """Store ``scale`` in the head file's info, keeping its weights and the rest of its info."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
        state = {k: f.get_tensor(k) for k in f.keys()}
    info = json.loads(meta.get("info", "{}"))
    info[INFO_KEY] = scale
    meta["info"] = json.dumps(info)
    save_file(state, str(path), metadata=meta)


def main(argv: list[str] | None = None) -> int:
    from actors.eagle.data import load_examples
    from actors.eagle.head import load_head
    from actors.model.loader import load_model

    ap = argparse.ArgumentParser(prog="python -m actors.eagle.calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("head", type=Path)
    ap.add_argument("--data", required=True, help="comma-separated directories with features/ (train.py --out)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--source", default="gen", choices=["gen", "text", "all"])
    ap.add_argument("--held-out-seed", type=int, default=None,
                    help="keep only the conversations train.py held out with this --seed (list --data as train.py "
                         "read it: its --out first, then its --data)")
    ap.add_argument("--write", action="store_true", help="store the best scale in the head file")
    args = ap.parse_args(argv)
    examples = [e for d in args.data.split(",") if d for e in load_examples(Path(d))]
    if args.held_out_seed is not None:
        examples = held_out(examples, args.held_out_seed)
    examples = [e for e in examples if args.source == "all" or e.source == args.source]
    if not examples:
        ap.error(f"--data {args.data!r}: no {args.source} conversations with features there")
    target = load_model(args.model).model
    head = load_head(args.head).attach(target, f"target {args.model!r}")
    scale, table = calibrate(head, examples, target.lm_head.weight.detach())
    for s, m in table.items():
        print(f"scale {s:4.2f}: mean overlap {m:.4f}{'  <- best' if s == scale else ''}")
    if args.write:
        rewrite_scale(args.head, scale)
        print(f"wrote {INFO_KEY}={scale} into {args.head}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
