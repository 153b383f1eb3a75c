"""`specray tune`: the K sweep of the playbook's Phase 3 for one draft method (optionally a token
tree as one more candidate) at the given concurrencies, in process, and the recommended K.

Recommendation per concurrency: the candidate with the best whole-set tokens/s; candidates within
``--tie-tolerance`` of the best count as tied (run-to-run noise is a few percent) and the smallest
wins, since a shorter chain wastes less draft work. Plain decoding is a candidate (K=0), so a
concurrency where speculation does not pay gets "off". Over all concurrencies the same rule is
applied to the geometric mean of the speedups.
"""
from __future__ import annotations

import json
import math

from benchmarks.options import (add_common_args, check_counts, check_method, check_tree, engine_options,
                                parse_float_list, parse_int_list, sampling_seed, select_prompt_sets)
from benchmarks.report import fmt, md_table
from benchmarks.results import BASELINE, add_speedups, run_row
from benchmarks.sweep import iter_runs, plan_groups

DEFAULT_TIE_TOLERANCE = 0.02


def add_tune_parser(sub) -> None:
    t = sub.add_parser("tune", help="sweep K for one draft method and recommend the best (playbook Phase 3)")
    add_common_args(t, concurrency="1", spec_tokens="1,2,3,4,5,6,7,8")
    t.add_argument("--draft", required=True, help="the method to tune: ngram | layerskip:N | default | eagle:PATH | default:PATH | draft model")
    t.add_argument("--temperature", default="0", help="one sampling temperature (seeded unless --unseeded)")
    t.add_argument("--tie-tolerance", type=float, default=DEFAULT_TIE_TOLERANCE, metavar="FRACTION",
                   help="tokens/s within this fraction of the best count as a tie (smaller K wins)")
    t.set_defaults(func=cmd_tune)


def candidate_size(row: dict) -> int:
    """Draft tokens per step of a candidate: 0 for plain decoding, K, or the tree's node count."""
    from actors.tree import expansion_num_nodes, parse_expansion

    if row["method"] == BASELINE:
        return 0
    return row["spec_tokens"] if row["tree"] is None else expansion_num_nodes(parse_expansion(row["tree"]))


def pick(scored: list[tuple[dict, float]], tolerance: float) -> tuple[dict, float]:
    """(row, score) with the best score; within ``tolerance`` of it the smallest candidate wins."""
    top = max(s for _, s in scored)
    tied = [(r, s) for r, s in scored if s >= top * (1 - tolerance)]
    return min(tied, key=lambda rs: (candidate_size(rs[0]), -rs[1]))


def recommend(rows: list[dict], tolerance: float = DEFAULT_TIE_TOLERANCE) -> dict:
    """{"per_concurrency": {c: row}, "overall": (label, geo-mean speedup)} from tune rows."""
    per_c = {c: pick([(r, r["tokens_per_s"]) for r in rows if r["concurrency"] == c], tolerance)[0]
             for c in sorted({r["concurrency"] for r in rows})}
    by_label: dict[str, list[dict]] = {}
    for r in rows:
        by_label.setdefault(_label(r), []).append(r)
    geo = [(rs[0], math.exp(sum(math.log(r["speedup"] or 1.0) for r in rs) / len(rs))) for rs in by_label.values()]
    best, score = pick(geo, tolerance)
    return {"per_concurrency": per_c, "overall": (_label(best), score)}


def _label(row: dict) -> str:
    return "off (K=0)" if row["method"] == BASELINE else row["spec"]


def tune_table(rows: list[dict]) -> str:
    head = ["conc", "candidate", "tokens/s", "speedup", "acceptance", "mean acc. len", "TPOT p50 ms", "E2E p50 s"]
    body = [[str(r["concurrency"]), _label(r), fmt(r["tokens_per_s"]), fmt(r["speedup"], "{:.2f}x"),
             fmt(r["acceptance_rate"]), fmt(r["mean_accepted_length"]), fmt(r["tpot_p50_s"], "{:.1f}", 1e3),
             fmt(r["e2e_p50_s"])] for r in sorted(rows, key=lambda r: (r["concurrency"], candidate_size(r)))]
    return md_table(head, body)


def cmd_tune(args) -> int:
    from benchmarks.engine_bench import EngineBackend

    check_counts(args)
    method = check_method(args.draft.strip())
    if method == BASELINE:
        raise ValueError("--draft 'none': name the speculative method to tune (ngram, layerskip:N, default, eagle:PATH or a draft model)")
    if not 0 <= args.tie_tolerance < 1:
        raise ValueError(f"--tie-tolerance {args.tie_tolerance}: must be within [0, 1)")
    temps = parse_float_list("--temperature", args.temperature)
    if len(temps) != 1:
        raise ValueError(f"--temperature {args.temperature!r}: tune takes one temperature")
    concurrency = parse_int_list("--concurrency", args.concurrency)
    groups = plan_groups([method], parse_int_list("--spec-tokens", args.spec_tokens), check_tree(args.tree))
    sets = select_prompt_sets(args.prompts, args.sample, args.seed)
    if len(sets) != 1:
        raise ValueError(f"--prompts {args.prompts!r}: tune takes one prompt set")
    prompts = sets[0][2]
    backend = EngineBackend(args.model, args.max_tokens, sampling_seed(args), args.warmup, engine_options(args))
    rows = [run_row(r) for r in iter_runs(backend, groups, prompts, temps, concurrency)]
    add_speedups(rows)
    rec = recommend(rows, args.tie_tolerance)
    if args.json:
        print(json.dumps({"method": method, "temperature": temps[0], "runs": rows,
                          "recommended": {str(c): _label(r) for c, r in rec["per_concurrency"].items()},
                          "recommended_overall": rec["overall"][0]}, indent=2))
        return 0
    print(f"# specray tune --draft {method} (T={temps[0]:g}, {len(prompts)} prompts)\n")
    print(tune_table(rows) + "\n")
    for c, r in rec["per_concurrency"].items():
        print(f"recommended at concurrency {c}: {_label(r)} ({fmt(r['tokens_per_s'])} tok/s, "
              f"{fmt(r['speedup'] or 1.0, '{:.2f}x')})")
    label, score = rec["overall"]
    print(f"recommended over all concurrencies: {label} (geometric-mean speedup {score:.2f}x)")
    return 0
