"""The GPU figures of issue 26 in one command, one Markdown table per section:

    python -m benchmarks.gpu_bench --stage tiny|8b|attention|default|host|draft|offload|http|all --out DIR
                                   [--device cuda]

- ``8b``: ``random:llama-3-8b`` (bf16) on the Verifier directly: the device's copy bandwidth and the
  bandwidth-bound TPOT it implies, plain decode TPOT at c=1 and the cost of verifying q tokens
  relative to one (``benchmarks/step_costs.py``), eager and CUDA graphs when the Verifier has the
  switch, else its default;
- ``tiny``: the same on ``random:tiny`` (a smoke run: proves the path works, seconds on a CPU);
- ``attention`` (CUDA): ``benchmarks/attention_bench.py``'s cases (8B's attention shape, decode at
  contexts 512/4k/16k and batches 1/16/64, a 64-node tree) against the torch reference and dense
  SDPA, and the kernel at each ``--segments`` split-K count beside the backend's choice;
- ``default``: the default model through the bench machinery (``specray bench``'s sweep and
  peers): plain vs ``--draft default`` (K=5 and adaptive) at c=1, plain vs adaptive at c=8 and 64,
  and transformers peers (eager generate, prompt lookup; on CUDA also static cache + compile,
  batch 1 and batch 64);
- ``host``: host time per engine step by phase (``benchmarks/host_profile.py``);
- ``draft``: what one drafting call of the default EAGLE head costs, eagerly and with its steps as
  CUDA graphs (``benchmarks/draft_cost.py``; ``--context``/``--reps`` apply);
- ``offload``: weight offload (issue 27, ``benchmarks/offload_bench.py``): the SpecInfer curve of
  ``random:llama-3-8b``, 16 of 32 layers offloaded vs none (CPU: ``random:tiny-8l``, 4 of 8); the
  default model half offloaded at c=1, plain vs ``--draft default`` trees and transformers with
  accelerate's CPU offload; a table of the issue's goals. ``--budget-s``: parts of ``default`` and
  ``offload`` that would start after it are skipped (the GPU harness passes what its budget leaves);
- ``http``: c=1 greedy TPOT through ``specray serve --config`` (Ray Serve, HTTP, the openai client) vs
  the in-process engine on the same prompts, and their ratio (goal <= 1.5x; ``benchmarks/gpu_http.py``;
  ``--http-draft``, ``--http-start-s`` apply). Needs ``ray[serve]`` and ``openai`` (a table says so
  otherwise).

Each section is written when done (the ``default`` one after each part) to DIR/gpu_bench_<stage>.md
and .json, and DIR/gpu_bench.md / .json gather every section present, so separate invocations (or
one cut short by a time limit) still leave every finished table. A section that fails is a table
saying why; the others still run.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

from benchmarks.report import machine_info, md_table

STAGES = ("tiny", "8b", "attention", "default", "host", "draft", "offload", "http")
RANDOM_SPECS = {"tiny": "random:tiny", "8b": "random:llama-3-8b"}
TITLES = {"tiny": "tiny: random:tiny on the Verifier (smoke)",
          "8b": "8b: random:llama-3-8b on the Verifier",
          "attention": "attention: the paged-attention kernel vs the torch reference and dense SDPA, and per "
                       "split-K count (benchmarks.attention_bench, 8B's attention shape)",
          "default": "default: the engine vs transformers on the default model",
          "host": "host: host time per engine step by phase, default model (benchmarks.host_profile)",
          "draft": "draft: one drafting call of the default EAGLE head (benchmarks.draft_cost)",
          "offload": "offload: weight offload, the SpecInfer curve and the default model half offloaded "
                     "(benchmarks.offload_bench)",
          "http": "http: c=1 TPOT over HTTP (specray serve, Ray Serve) vs in-process, default model "
                  "(benchmarks.gpu_http)"}


# ---------------------------------------------------------------- output


def write_section(out: Path, name: str, table: str, data: dict, notes: list[str] = ()) -> str:
    """Write one section (Markdown + JSON) and refresh the gathered files; returns its Markdown."""
    md = f"## {TITLES[name]}\n\n" + "".join(f"- {n}\n" for n in notes) + ("\n" if notes else "") + table + "\n"
    (out / f"gpu_bench_{name}.md").write_text(md, encoding="utf-8")
    (out / f"gpu_bench_{name}.json").write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    gather(out)
    return md


def gather(out: Path) -> None:
    m = machine_info()
    head = [f"# specray GPU bench, {time.strftime('%Y-%m-%d %H:%M')}", "",
            f"- Machine: {m.get('gpu', 'no GPU')}, {m['cpu']}, torch {m['torch']}, Python {m['python']}", ""]
    names = [n for n in STAGES if (out / f"gpu_bench_{n}.md").is_file()]
    md = "\n".join(head + [(out / f"gpu_bench_{n}.md").read_text(encoding="utf-8") for n in names])
    (out / "gpu_bench.md").write_text(md, encoding="utf-8")
    doc = {"machine": m, **{n: json.loads((out / f"gpu_bench_{n}.json").read_text(encoding="utf-8")) for n in names}}
    (out / "gpu_bench.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


# ---------------------------------------------------------------- tiny / 8b: the Verifier


def model_rows(bw: dict, costs: list, context: int) -> list[list[str]]:
    """The section's rows: bandwidth, weight bytes, the bound (with its formula), then per mode the
    decode TPOT and every verify shape relative to its q=1 forward. ``bw``: copy_mb, copy_s,
    bandwidth (bytes/s), read_bytes, total_bytes, bound_s, reps, timer, dtype."""
    from benchmarks.step_costs import BOUND_FORMULA, trees

    rows = [["device copy bandwidth", "-", f"{bw['bandwidth'] / 1e9:.1f} GB/s", "", "",
             f"2 x {bw['copy_mb']} MiB (read + written) / median of {bw['reps']} copies ({bw['timer']})"],
            ["weight bytes read per step", "-", f"{bw['read_bytes'] / 1e9:.4g} GB", "", "",
             f"{bw['total_bytes'] / 1e9:.4g} GB of {bw['dtype']} parameters minus the untied input embedding "
             "(a step reads only its tokens' rows)"],
            ["bandwidth-bound TPOT", "-", _ms(bw["bound_s"]), f"{1 / bw['bound_s']:.1f}", "100% of bound",
             BOUND_FORMULA]]
    shapes = trees(0, 2)
    for c in costs:
        rows.append([f"plain decode TPOT, c=1, context {context}", c.mode, _ms(c.decode_s), f"{1 / c.decode_s:.1f}",
                     f"{100 * bw['bound_s'] / c.decode_s:.0f}% of bound",
                     f"median of {c.decode_steps} steps of 1 token, argmax .item() each (wall clock)"])
        if c.launches:
            n = c.launches
            rows.append(["kernels per decode step", c.mode, str(n["kernels"]), "", f"{n['launch_calls']} launch calls",
                         f"torch.profiler over one step: device kernels; host kernel-launch calls "
                         f"({n['graph_launches']} graph replays)"])
        q1 = c.verify_s.get("chain q=1")
        for label, s in c.verify_s.items():
            best = shapes[label].max_depth + 1  # tokens a step emits when every draft is accepted
            rows.append([f"verify {label}", c.mode, _ms(s), f"{best / s:.1f}",
                         f"{s / q1:.2f}x q=1" if q1 else "",
                         f"one forward, logits for all nodes, median of {c.verify_reps}; tokens/s if all "
                         f"{best} accepted"])
    return rows


MODEL_HEAD = ["quantity", "mode", "value", "tokens/s", "relative", "how"]


def model_section(name: str, args, device: torch.device, out: Path) -> str:
    from actors.model.attention_backends import set_attention_backend
    from actors.model.loader import load_model
    from benchmarks.step_costs import (bound_tpot_s, copy_bandwidth, measure_copy_s, measure_steps,
                                       step_weight_bytes, verifier_modes)

    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    t0 = time.perf_counter()
    loaded = load_model(RANDOM_SPECS[name], dtype=dtype, device=device)
    _sync(device)
    init_s = time.perf_counter() - t0
    backend = set_attention_backend(loaded.model, "auto")
    cfg = loaded.config
    read_bytes, total_bytes = step_weight_bytes(loaded.model)
    copy_mb = args.copy_mb or (2048 if device.type == "cuda" else 64)
    copy_s = measure_copy_s(device, copy_mb << 20, args.reps)
    bandwidth = copy_bandwidth(copy_mb << 20, copy_s)
    bw = dict(copy_mb=copy_mb, copy_s=copy_s, bandwidth=bandwidth, read_bytes=read_bytes, total_bytes=total_bytes,
              bound_s=bound_tpot_s(read_bytes, bandwidth), reps=args.reps,
              timer="CUDA events" if device.type == "cuda" else "clock", dtype=str(dtype).removeprefix("torch."))
    costs, failed = [], []
    for mode, kw in verifier_modes(device):
        try:
            costs.append(measure_steps(loaded.model, device, dtype, mode, kw, args.context, args.decode_steps,
                                       args.reps))
        except Exception as e:  # noqa: BLE001  one mode failing leaves the others' rows
            traceback.print_exc()
            failed.append(f"mode {mode} failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    del loaded
    if device.type == "cuda":
        torch.cuda.empty_cache()
    notes = [f"{RANDOM_SPECS[name]}, {bw['dtype']} on {device}, attention backend {backend}; weights filled "
             f"on the device in {init_s:.1f} s", *failed]
    data = {"model": RANDOM_SPECS[name], "device": str(device), "context": args.context, "init_s": init_s,
            "bandwidth": bw, "modes": [{"mode": c.mode, "decode_s": c.decode_s, "verify_s": c.verify_s, "launches": c.launches,
                                        "decode_steps": c.decode_steps, "verify_reps": c.verify_reps} for c in costs],
            "failed": failed}
    rows = model_rows(bw, costs, args.context) + tp_rows(costs, cfg, dtype)
    return write_section(out, name, md_table(MODEL_HEAD, rows), data, notes)


NVLINK_A100 = (300e9, 10e-6)  # one GPU's NVLink 3 bandwidth in one direction; a small NCCL all-reduce's latency


def tp_rows(costs: list, cfg, dtype: torch.dtype) -> list[list[str]]:
    """TP=4 over NVLink, estimated from the fastest measured one-GPU decode step (benchmarks.tp_estimate)."""
    from benchmarks.tp_estimate import tp_step_estimate

    if not costs:
        return []
    best = min(costs, key=lambda c: c.decode_s)
    e = tp_step_estimate(best.decode_s, cfg.num_layers, cfg.hidden_size, 1, torch.finfo(dtype).bits // 8, 4,
                         *NVLINK_A100)
    return [["TP=4 decode step (estimate)", best.mode, _ms(e.step_s), f"{1 / e.step_s:.1f}",
             f"{e.comm_s * 1e3:.2f} ms all-reduce",
             f"measured one-GPU step / 4 + {e.allreduces} all-reduces of {e.allreduce_bytes // e.allreduces} B "
             f"(ring over NVLink {NVLINK_A100[0] / 1e9:.0f} GB/s per direction + {NVLINK_A100[1] * 1e6:.0f} us each)"]]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- the other stages


def default_section(args, device: torch.device, out: Path) -> str:
    from benchmarks import gpu_engine_stages

    return gpu_engine_stages.default_section(args, device, out)


def offload_section(args, device: torch.device, out: Path) -> str:
    from benchmarks import gpu_engine_stages

    return gpu_engine_stages.offload_section(args, device, out)


def host_section(args, device: torch.device, out: Path) -> str:
    from benchmarks import host_profile

    rows = host_profile.run(str(device), ["none", "default"], [1, 64], args.sample, args.max_tokens)
    notes = [f"{args.sample} stratified bench prompts, max tokens {args.max_tokens}, greedy; "
             "adaptive speculation (auto K<=5); phase shares from cProfile scaled to the unprofiled step time"]
    return write_section(out, "host", host_profile.table(rows), {"rows": rows}, notes)


def attention_section(args, device: torch.device, out: Path) -> str:
    from benchmarks import attention_bench as ab

    segments = ab.parse_segments(args.segments)
    rows = [ab.measure(b, c, None, device, args.reps, segments=segments)
            for c in (512, 4096, 16384) for b in (1, 16, 64)]
    rows.append(ab.measure(1, 4096, 64, device, args.reps, segments=segments))
    notes = ["32 query / 8 KV heads, head dim 128, bf16, KV blocks of 16 shuffled through the pool; decode at each "
             "context and batch, then a 64-node tree at 4,096; median of CUDA-graph replays"]
    table = ab.table(rows) + ("\n\nSplit-K: the kernel per number of key segments S (* the backend's choice, "
                              "fastest in bold)\n\n" + ab.split_table(rows) if segments else "")
    return write_section(out, "attention", table, {"rows": rows}, notes)


def draft_section(args, device: torch.device, out: Path) -> str:
    from benchmarks import draft_cost

    rows = draft_cost.run("smollm2-135m", device, [1, 8, 64], args.context, args.reps)
    notes = [f"the default model's EAGLE head, {args.context} committed positions per sequence, K={draft_cost.K}; "
             f"tree width {draft_cost.TREE_WIDTH}; eager vs the head's steps as CUDA graphs"]
    return write_section(out, "draft", draft_cost.table(rows), {"rows": rows}, notes)


def http_section(args, device: torch.device, out: Path) -> str:
    from benchmarks import gpu_http

    return gpu_http.http_section(args, device, out)


# ---------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--stage", default="all", help=f"one or more of {', '.join(STAGES)} (comma-separated), or all")
    ap.add_argument("--out", required=True, metavar="DIR", help="writes gpu_bench.md/.json and one pair per stage")
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N")
    ap.add_argument("--context", type=int, default=512, help="tiny/8b: tokens prefilled before decoding")
    ap.add_argument("--decode-steps", type=int, default=32, help="tiny/8b: timed decode steps (after 3 warm-up)")
    ap.add_argument("--reps", type=int, default=10, help="tiny/8b: timed repeats of each copy and verify shape")
    ap.add_argument("--copy-mb", type=int, default=None,
                    help="tiny/8b: copied buffer (default 2048 on CUDA, 64 on CPU)")
    ap.add_argument("--segments", default="1,2,4,8,16,32",
                    help="attention: split-K counts the kernel is also timed at (empty: none)")
    ap.add_argument("--sample", type=int, default=12, help="default, http: prompts at c=1 (and the batch-1 peers)")
    ap.add_argument("--batch-sample", type=int, default=64, help="default: prompts at c=8 and 64 (and batch 64)")
    ap.add_argument("--max-tokens", type=int, default=128, help="default, http: output cap per prompt")
    ap.add_argument("--kv-cache-gb", type=float, default=8.0, help="default, http: the engine's KV cache on CUDA")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="default/offload: skip the parts that would start after this many seconds")
    ap.add_argument("--http-draft", default="default",
                    help="http: the draft of the engine config both sides run (plain is spec_tokens 0 on it)")
    ap.add_argument("--http-start-s", type=float, default=300.0,
                    help="http: most seconds the server (Ray, Serve, the replica's model) may take to come up")
    ap.add_argument("--peers", choices=("all", "eager", "none"), default="all",
                    help="default: transformers peers: all (eager, prompt lookup and, on CUDA, static cache + "
                         "compile), eager, or none")
    return ap


def parse_stages(text: str) -> tuple[str, ...]:
    """'all' or comma-separated stage names -> the stages in the order given."""
    if text == "all":
        return STAGES
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [n for n in names if n not in STAGES]
    if bad or not names:
        raise ValueError(f"--stage {text!r}: use one or more of {', '.join(STAGES)} (comma-separated), or all")
    return names


def _check(args) -> None:
    for flag in ("context", "decode_steps", "reps", "sample", "batch_sample", "max_tokens"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be at least 1")
    from benchmarks.attention_bench import parse_segments

    parse_segments(args.segments)  # ValueError naming the bad count
    if args.copy_mb is not None and args.copy_mb < 1:
        raise ValueError(f"--copy-mb {args.copy_mb}: must be at least 1")
    for flag in ("budget_s", "http_start_s"):
        if getattr(args, flag) is not None and not getattr(args, flag) > 0:
            raise ValueError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be above 0")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _check(args)
        from cluster.runtime import resolve_device_dtype

        device = resolve_device_dtype(args.device, "auto")[0]
        stages = parse_stages(args.stage)
        if stages in (("8b",), ("attention",)) and device.type != "cuda":
            raise ValueError(f"--stage {stages[0]} needs CUDA; on {device} run --stage tiny "
                             "(attention on CPU: python -m benchmarks.attention_bench --device cpu)")
    except ValueError as e:
        print(f"gpu_bench: error: {e}", file=sys.stderr)
        return 2
    args.deadline = time.monotonic() + args.budget_s if args.budget_s else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in stages:
        t0 = time.perf_counter()
        print(f"# gpu_bench: stage {name} on {device} ...", file=sys.stderr, flush=True)
        if name in ("8b", "attention") and device.type != "cuda":
            md = write_section(out, name, md_table(["stage", "status"], [[name, f"skipped: needs CUDA, not {device}"]]),
                               {"skipped": f"needs CUDA, not {device}"})
        else:
            try:
                sections = {"default": default_section, "host": host_section, "draft": draft_section,
                            "attention": attention_section,
                            "offload": offload_section, "http": http_section}
                md = (sections[name](args, device, out) if name in sections else model_section(name, args, device, out))
            except Exception as e:  # noqa: BLE001  a failed stage is a table saying why; the next still runs
                traceback.print_exc()
                msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                table = md_table(["stage", "status"], [[name, f"failed: {msg}"]])
                md = write_section(out, name, table, {"failed": msg})
        print(md, flush=True)
        print(f"# gpu_bench: stage {name} took {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    print(f"# gpu_bench: wrote {out / 'gpu_bench.md'} and {out / 'gpu_bench.json'}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
