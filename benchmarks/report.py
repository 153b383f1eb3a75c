"""Bench results as one JSON document and as Markdown tables (what BENCHMARKS.md quotes).

The JSON keeps every figure (seconds, rates as fractions); the Markdown rounds for reading:
TTFT and TPOT in milliseconds, E2E in seconds, speedups as ``1.23x``.
"""
from __future__ import annotations

import platform
import time
from collections import Counter

from benchmarks.prompt_set import BenchPrompt


def machine_info() -> dict:
    import torch

    info = {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def document(rows: list[dict], prompts_path, prompts: list[BenchPrompt], settings: dict, command: str,
             peers: list[dict] | None = None) -> dict:
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "command": command, "machine": machine_info(),
            "prompts": {"path": str(prompts_path), "num_prompts": len(prompts),
                        "categories": dict(sorted(Counter(p.category for p in prompts).items()))},
            "settings": settings, "runs": rows, "peers": peers or []}


def fmt(v, spec: str = "{:.2f}", scale: float = 1.0) -> str:
    """A figure for a table cell; '-' when it does not exist (e.g. acceptance without drafts)."""
    return "-" if v is None else spec.format(v if scale == 1 else v * scale)


def md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _key(r: dict) -> list[str]:
    return [r["method"], r["spec"], f"{r['temperature']:g}", str(r["concurrency"])]


def runs_table(rows: list[dict]) -> str:
    head = ["method", "spec", "T", "conc", "output tokens", "wall s", "tokens/s", "speedup", "decode speedup",
            "TTFT p50/p95 ms",
            "TPOT p50/p95 ms", "E2E p50/p95 s", "acceptance", "mean acc. len", "errors"]
    body = [_key(r) + [str(r["output_tokens"]), fmt(r["wall_s"], "{:.1f}"), fmt(r["tokens_per_s"]),
                       fmt(r["speedup"], "{:.2f}x"), fmt(r.get("decode_speedup"), "{:.2f}x"),
                       f"{fmt(r['ttft_p50_s'], '{:.0f}', 1e3)} / {fmt(r['ttft_p95_s'], '{:.0f}', 1e3)}",
                       f"{fmt(r['tpot_p50_s'], '{:.1f}', 1e3)} / {fmt(r['tpot_p95_s'], '{:.1f}', 1e3)}",
                       f"{fmt(r['e2e_p50_s'])} / {fmt(r['e2e_p95_s'])}", fmt(r["acceptance_rate"]),
                       fmt(r["mean_accepted_length"]), str(r["num_errors"])] for r in rows]
    return md_table(head, body)


def categories_table(rows: list[dict]) -> str:
    head = ["category", "method", "spec", "T", "conc", "requests", "TTFT p50 ms", "TPOT p50 ms", "E2E p50/p95 s",
            "acceptance", "mean acc. len", "speedup"]
    body = [[cat] + _key(r) + [str(c["num_requests"]), fmt(c["ttft_p50_s"], "{:.0f}", 1e3),
                               fmt(c["tpot_p50_s"], "{:.1f}", 1e3), f"{fmt(c['e2e_p50_s'])} / {fmt(c['e2e_p95_s'])}",
                               fmt(c["acceptance_rate"]), fmt(c["mean_accepted_length"]), fmt(c["speedup"], "{:.2f}x")]
            for r in rows for cat, c in r["categories"].items()]
    return md_table(head, sorted(body, key=lambda b: b[0]))


def positions_table(rows: list[dict]) -> str:
    spec = [r for r in rows if r["per_position_acceptance"]]
    head = ["method", "spec", "T", "conc", "acceptance by draft position (1, 2, ...)"]
    return md_table(head, [_key(r) + [", ".join(f"{a:.2f}" for a in r["per_position_acceptance"])] for r in spec])


def peers_table(peers: list[dict]) -> str:
    head = ["peer", "specray counterpart", "K", "output tokens", "tokens/s", "specray tokens/s", "specray/peer", "note"]
    body = [[p["peer"] + (f" (batch {p['batch']})" if p.get("batch", 1) > 1 else ""), p["counterpart"],
             fmt(p["spec_tokens"], "{}"), fmt(p["output_tokens"], "{}"),
             fmt(p["tokens_per_s"]), fmt(p["specray_tokens_per_s"]), fmt(p["ratio"], "{:.2f}x"), p["note"] or ""]
            for p in peers]
    return md_table(head, body)


def markdown(doc: dict) -> str:
    m, pr = doc["machine"], doc["prompts"]
    cats = ", ".join(f"{c} {n}" for c, n in pr["categories"].items())
    parts = [f"# specray bench, {doc['date']}", "",
             f"- Command: `{doc['command']}`",
             f"- Machine: {m['cpu']}{', ' + m['gpu'] if 'gpu' in m else ''}, torch {m['torch']} "
             f"({m['torch_threads']} threads), Python {m['python']}",
             f"- Prompts: `{pr['path']}`, {pr['num_prompts']} ({cats})",
             f"- Settings: {', '.join(f'{k}={v}' for k, v in doc['settings'].items())}",
             "", "## Runs", "", runs_table(doc["runs"]),
             "", "## Per category", "", categories_table(doc["runs"])]
    if any(r["per_position_acceptance"] for r in doc["runs"]):
        parts += ["", "## Per-position acceptance", "", positions_table(doc["runs"])]
    if doc["peers"]:
        parts += ["", "## Peers (transformers generate, greedy; batch 1 unless said)", "", peers_table(doc["peers"])]
    return "\n".join(parts) + "\n"
