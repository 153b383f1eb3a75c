"""Parsing and checking of the bench/tune list options, before anything is loaded.

Lists are parsed here rather than by argparse ``type=`` so that a bad value gets the project's
one-line error (``specray: error: --concurrency 'x': ...``, exit 2) instead of argparse's usage
dump, and so that a typo fails in a second, not after the model has loaded.
"""
from __future__ import annotations

from pathlib import Path

from benchmarks.prompt_set import BenchPrompt, default_prompts_path, load_prompt_set, stratified_sample
from benchmarks.results import BASELINE
from cluster.config import engine_choices

BUILTIN_METHODS = ("none", "ngram", "layerskip:N", "default", "default-chain", "eagle", "eagle:PATH", "default:PATH")


def parse_int_list(flag: str, text: str, minimum: int = 1) -> list[int]:
    """'1,2,4' -> [1, 2, 4]: integers >= minimum, no duplicates, order kept."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected comma-separated integers, e.g. 1,2,4") from None
    bad = [v for v in values if v < minimum]
    if bad:
        raise ValueError(f"{flag} {text!r}: {bad[0]} is below {minimum}")
    return list(dict.fromkeys(values))


def parse_spec_tokens(text: str) -> tuple[list[int], bool]:
    """'1,3,5,auto' -> ([1, 3, 5], True): fixed chain lengths, plus whether to also run the
    engine's adaptive policy (up to the largest K). 'auto' alone -> ([], True): only the adaptive
    run, up to DEFAULT_MAX_K."""
    parts = [x.strip() for x in text.split(",")]
    adaptive = "auto" in parts
    numbers = ",".join(x for x in parts if x != "auto")
    return (parse_int_list("--spec-tokens", numbers) if numbers or not adaptive else []), adaptive


DEFAULT_MAX_K = 5  # the adaptive policy's depth limit when --spec-tokens lists no K


def parse_float_list(flag: str, text: str, minimum: float = 0.0) -> list[float]:
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected comma-separated numbers, e.g. 0,0.3,0.7") from None
    bad = [v for v in values if not v >= minimum]  # also rejects nan
    if bad:
        raise ValueError(f"{flag} {text!r}: {bad[0]} is below {minimum}")
    return list(dict.fromkeys(values))


def _parsed_by_config(method: str) -> bool:
    """Built-in names that SpeculativeConfig.from_draft_arg parses (and validates) itself."""
    from cluster.config import is_eagle_draft

    return is_eagle_draft(method) or method.startswith("layerskip")


def is_draft_model(method: str) -> bool:
    """A draft model alias or an existing local path (HF directory or .gguf)."""
    from actors.model import registry

    return method not in ("none", "ngram") and not _parsed_by_config(method) and (
        registry.is_alias(method) or Path(method).expanduser().exists())


def check_method(method: str) -> str:
    from cluster.config import SpeculativeConfig

    if method in ("none", "ngram") or is_draft_model(method):
        return method
    if _parsed_by_config(method):
        SpeculativeConfig.from_draft_arg(method)  # raises naming the value
        return method
    raise ValueError(f"--draft {method!r}: unknown method; use one of {', '.join(BUILTIN_METHODS)} "
                     "or a draft model (an alias or a local path)")


def parse_methods(text: str) -> list[str]:
    """Speculative methods to measure; the baseline ``none`` is always measured anyway."""
    methods = [check_method(m.strip()) for m in text.split(",") if m.strip()]
    if not methods:
        raise ValueError(f"--draft {text!r}: name at least one method")
    return [m for m in dict.fromkeys(methods) if m != BASELINE]


def check_tree(tree: str | None) -> str | None:
    from actors.tree import parse_expansion

    if tree is None:
        return None
    try:
        return ",".join(str(b) for b in parse_expansion(tree))
    except ValueError as e:
        raise ValueError(f"--tree {tree!r}: {e}") from None


def select_prompts(path: str | None, sample: int | None, seed: int) -> tuple[Path, list[BenchPrompt]]:
    """The prompt file (default: bench500 when present) and the stratified sample of it."""
    p = Path(path) if path else default_prompts_path()
    items = load_prompt_set(p)
    return p, (items if sample is None else stratified_sample(items, sample, seed))


# named prompt sets for --prompts (None: the default set); `heldout` is the set training never sees
PROMPT_SETS = {"bench500": None, "heldout": str(Path(__file__).parent / "prompts" / "heldout_magpie.jsonl")}


def select_prompt_sets(spec: str | None, sample: int | None, seed: int) -> list[tuple[str, Path, list[BenchPrompt]]]:
    """``--prompts`` as one or more comma-separated sets (files or names of PROMPT_SETS) -> per set its
    label, file and stratified sample. Several sets run side by side: one smaller than ``sample`` is
    then taken whole (alone, a ``sample`` beyond the set is an error)."""
    names = [s for s in (spec or "").split(",") if s] or [None]
    bad = [n for n in names if n is not None and n not in PROMPT_SETS and not Path(n).is_file()]
    if bad:
        raise ValueError(f"--prompts {spec!r}: {', '.join(bad)} is neither a prompt file nor one of "
                         f"{', '.join(PROMPT_SETS)}")
    out = []
    for name in names:
        path = PROMPT_SETS.get(name, name) if name else None
        p, items = select_prompts(path, None if len(names) > 1 else sample, seed)
        if len(names) > 1 and sample is not None and sample < len(items):
            p, items = select_prompts(path, sample, seed)
        out.append((name if name in PROMPT_SETS else p.stem, p, items))
    labels = [label for label, _, _ in out]
    if len(set(labels)) < len(labels):
        raise ValueError(f"--prompts {spec!r}: two sets named alike ({', '.join(labels)}); give each set once")
    return out


def add_common_args(p, concurrency: str, spec_tokens: str) -> None:
    """Options shared by ``bench`` and ``tune`` (lists stay strings here; see the module doc)."""
    from cluster.config import DEFAULT_MODEL

    p.add_argument("--model", default=DEFAULT_MODEL, help="target: alias, local HF dir or .gguf file")
    p.add_argument("--prompts", default=None,
                   help="JSONL set (default: prompts/bench500.jsonl when present, else prompts/chat20.jsonl); "
                        "several comma-separated (files, `bench500`, `heldout`) run side by side")
    p.add_argument("--sample", type=int, default=None, metavar="N",
                   help="N prompts, stratified by category (deterministic for a --seed)")
    p.add_argument("--seed", type=int, default=0, help="sample choice and per-request sampling seeds")
    p.add_argument("--unseeded", action="store_true",
                   help="sampled requests carry no seed, as most API clients send: fresh randomness and "
                        "multi-step speculative sampling (outputs differ between runs); default: seeded, "
                        "every variant emits the same tokens")
    p.add_argument("--concurrency", default=concurrency, metavar="C1,C2,...", help="requests in flight")
    p.add_argument("--spec-tokens", default=spec_tokens, metavar="K1,K2,...[,auto]",
                   help="draft tokens per step (chain); `auto` adds a run of the adaptive policy up to the largest K")
    p.add_argument("--tree", default=None, help="also measure this token tree (expansion config, e.g. 1,1,3,1,1)")
    p.add_argument("--max-tokens", type=int, default=None, metavar="N",
                   help="cap per prompt (default: each prompt's own max_tokens)")
    p.add_argument("--warmup", type=int, default=1, metavar="N", help="warm-up requests per engine")
    p.add_argument("--warmup-batch", action="store_true",
                   help="in-process: before each measured run, one unmeasured batch at its concurrency (compiles "
                        "what its shapes need; the adaptive policy measures costs at that load); on by default "
                        "in gpu_bench")
    p.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    p.add_argument("--device", default="auto", help="the in-process target's device: auto (CUDA when present), "
                   "cpu, cuda or cuda:N; the transformers peers run there too")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="the in-process target's dtype (auto: the engine's default for the device)")
    p.add_argument("--kv-cache-gb", type=float, default=None, metavar="GB",
                   help="KV cache size of the in-process engine (default: the engine's); high concurrency "
                        "with long prompts needs more, or the scheduler holds requests back")
    p.add_argument("--attention-backend", default="auto", choices=engine_choices("attention_backend"),
                   help="the in-process target's attention and fused ops (auto: triton on CUDA, native on CPU)")
    p.add_argument("--cpu-activations", default="auto", choices=engine_choices("cpu_activations"),
                   help="the in-process target's CPU products over GGUF blocks (auto: SPECRAY_CPU_ACTIVATIONS, "
                        "default int16; int8: faster verification, other logits)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=engine_choices("kv_cache_dtype"),
                   help="the in-process target's KV cache dtype (auto: the model's; bfloat16 under a float32 "
                        "model: half the bytes decode attention reads, other logits)")
    p.add_argument("--offload-layers", type=int, default=0, metavar="N",
                   help="the in-process target's last N decoder layers stream from host memory per forward "
                        "(weight offload; default 0)")
    p.add_argument("--json", action="store_true", help="print the JSON document instead of Markdown tables")


def sampling_seed(args) -> int | None:
    """The first prompt's sampling seed (None with --unseeded)."""
    return None if args.unseeded else args.seed


def check_counts(args) -> None:
    if args.max_tokens is not None and args.max_tokens < 1:
        raise ValueError(f"--max-tokens {args.max_tokens}: must be at least 1")
    if args.warmup < 0:
        raise ValueError(f"--warmup {args.warmup}: must be 0 or more")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads {args.threads}: must be at least 1")
    if args.kv_cache_gb is not None and not args.kv_cache_gb > 0:
        raise ValueError(f"--kv-cache-gb {args.kv_cache_gb}: must be above 0")


def engine_options(args) -> dict:
    """EngineConfig fields set from the command line (None: the engine's default)."""
    return {"num_threads": args.threads, "kv_cache_gb": args.kv_cache_gb, "dtype": args.dtype,
            "device": getattr(args, "device", "auto"),
            "attention_backend": getattr(args, "attention_backend", "auto"),
            "kv_cache_dtype": getattr(args, "kv_cache_dtype", "auto"),
            "cpu_activations": getattr(args, "cpu_activations", "auto"),
            "offload": {"layers": args.offload_layers} if getattr(args, "offload_layers", 0) else None}
