"""Speedup plots (PNG, matplotlib's Agg backend: no display needed): speedup over the
no-speculation baseline vs concurrency, vs temperature and vs K. Concurrency and temperature
not on the x axis are fixed at their lowest measured value (where speculation pays most); one line
per method and shape (per method on the K plot)."""
from __future__ import annotations

from pathlib import Path

from benchmarks.results import BASELINE

PLOTS = {"concurrency": "speedup_vs_concurrency.png", "temperature": "speedup_vs_temperature.png",
         "spec_tokens": "speedup_vs_k.png"}
_XLABEL = {"concurrency": "concurrency (requests in flight)", "temperature": "temperature",
           "spec_tokens": "K (draft tokens per step)"}


def _series(rows: list[dict], x: str) -> dict[str, list[tuple[float, float]]]:
    """label -> sorted (x, speedup) points."""
    spec = [r for r in rows if r["method"] != BASELINE and r["speedup"] is not None]
    if x == "spec_tokens":
        spec = [r for r in spec if r["spec_tokens"] is not None]
    fixed = [a for a in ("concurrency", "temperature") if a != x]
    lowest = {a: min((r[a] for r in spec), default=None) for a in fixed}
    out: dict[str, list[tuple[float, float]]] = {}
    for r in spec:
        if all(r[a] == lowest[a] for a in fixed):
            label = r["method"] if x == "spec_tokens" else f"{r['method']} {r['spec']}"
            out.setdefault(label, []).append((r[x], r["speedup"]))
    return {k: sorted(v) for k, v in out.items()}


def write_plots(rows: list[dict], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for x, name in PLOTS.items():
        fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
        series = _series(rows, x)
        for label, pts in series.items():
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="no speculation")
        xs = sorted({p[0] for pts in series.values() for p in pts})
        if x == "concurrency":
            ax.set_xscale("log", base=2)
        if xs and x != "temperature":
            ax.set_xticks(xs, [f"{v:g}" for v in xs])
        ax.set_xlabel(_XLABEL[x])
        ax.set_ylabel("speedup (output tokens/s vs none)")
        ax.set_title(f"speedup vs {x.replace('spec_tokens', 'K')}")
        ax.legend(fontsize="small")
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths
