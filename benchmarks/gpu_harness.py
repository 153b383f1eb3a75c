"""One-call GPU harness: pack what a lent GPU box lacks, then run the GPU tests and benchmark there.

``prepare`` (dev machine) downloads the wheels the box is missing (pydantic and gguf, pinned to this
environment's versions) and splits the default model's GGUF into parts small enough to carry, one
part per call. ``device`` (GPU box) installs the wheels, stashes the parts under /tmp, reassembles
the model once every part has arrived, runs the ``gpu`` tests and ``benchmarks.gpu_bench`` under one
time budget and writes one results file. Standard library only at import time: the box has no
pydantic until this has run.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

MIB = 1 << 20
CARRY_LIMIT = 64 * MIB  # working tree + carried paths, per call
WHEEL_DISTS = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "gguf")
ON_BOX = {"numpy", "pyyaml", "tqdm", "requests", "sentencepiece", "typing-extensions"}  # present there
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")
STATE = Path("/tmp/specray_gpu")  # survives between calls while the box stays warm
MAX_OUT_FILE = 15 * MIB  # a file under $OUT comes back only under 16 MiB


def _norm(dist: str) -> str:
    return re.sub(r"[-_.]+", "_", dist).lower()


def sha256_file(path: Path, chunk: int = 4 * MIB) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------- model parts and manifest


def split_file(src: Path, out_dir: Path, part_bytes: int) -> list[dict]:
    """Write src as out_dir/part-0, part-1, ... of at most part_bytes each; their names, sizes and sha256."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("part-*"):
        old.unlink()
    parts = []
    with open(src, "rb") as f:
        while block := f.read(part_bytes):
            path = out_dir / f"part-{len(parts)}"
            path.write_bytes(block)
            parts.append({"name": path.name, "size": len(block), "sha256": hashlib.sha256(block).hexdigest()})
    return parts


def write_manifest(out_dir: Path, gguf: Path, package: str, parts: list[dict], wheels: list[str]) -> Path:
    """out_dir/manifest.json: the model file, the package directory it goes in, its parts, the wheels."""
    manifest = {"gguf": gguf.name, "package": package, "size": gguf.stat().st_size,
                "sha256": sha256_file(gguf), "parts": parts, "wheels": wheels}
    path = out_dir / "manifest.json"
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return path


def missing_parts(manifest: dict, parts_dir: Path) -> list[str]:
    return [p["name"] for p in manifest["parts"] if not (parts_dir / p["name"]).is_file()]


def reassemble(manifest: dict, parts_dir: Path, dest: Path) -> Path:
    """Concatenate the manifest's parts into dest, checking each part's and the whole file's sha256."""
    if missing := missing_parts(manifest, parts_dir):
        raise FileNotFoundError(f"parts still missing in {parts_dir}: {', '.join(missing)}; "
                                "carry them in the next call")
    for p in manifest["parts"]:
        if sha256_file(parts_dir / p["name"]) != p["sha256"]:
            raise ValueError(f"part {p['name']} in {parts_dir} is corrupt (sha256 differs from the manifest); "
                             "carry it again")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    with open(tmp, "wb") as out:
        for p in manifest["parts"]:
            with open(parts_dir / p["name"], "rb") as f:
                shutil.copyfileobj(f, out, 4 * MIB)
    if sha256_file(tmp) != manifest["sha256"]:
        tmp.unlink()
        raise ValueError(f"reassembled {dest.name} does not match the manifest's sha256; run prepare again")
    tmp.replace(dest)
    return dest


# ---------------------------------------------------------------- wheels


def wheel_pins(dists: tuple[str, ...] = WHEEL_DISTS) -> dict[str, str]:
    """Versions installed here of the dists to pack; ValueError if one needs something the box lacks."""
    pins = {d: metadata.version(d) for d in dists}
    known = {_norm(d) for d in (*dists, *ON_BOX)}
    for d in dists:
        for req in metadata.requires(d) or []:
            name = re.match(r"[A-Za-z0-9._-]+", req).group(0)
            if "extra ==" not in req and _norm(name) not in known:
                raise ValueError(f"{d} requires {name} ({req!r}), which is neither packed nor known to be on "
                                 "the GPU box; add it to WHEEL_DISTS or ON_BOX in benchmarks/gpu_harness.py")
    return pins


def find_wheel(wheels_dir: Path, dist: str, version: str) -> Path | None:
    hits = sorted(wheels_dir.glob(f"{_norm(dist)}-{version}-*.whl"), key=lambda p: p.name)
    return hits[0] if hits else None


def ensure_wheels(wheels_dir: Path, pins: dict[str, str]) -> list[Path]:
    """The pinned wheels in wheels_dir, downloading (for CPython 3.12, x86-64 Linux) only those absent."""
    wheels_dir.mkdir(parents=True, exist_ok=True)
    absent = [f"{d}=={v}" for d, v in pins.items() if find_wheel(wheels_dir, d, v) is None]
    if absent:
        plats = [a for p in PLATFORMS for a in ("--platform", p)]
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--implementation", "cp", *plats, "-d", str(wheels_dir),
                        *absent], check=True)
    wheels = [find_wheel(wheels_dir, d, v) for d, v in pins.items()]
    if None in wheels:
        raise FileNotFoundError(f"pip download left no wheel for some of {absent} in {wheels_dir}")
    return wheels


# ---------------------------------------------------------------- prepare


def tree_bytes(repo: Path) -> int:
    """Bytes of the working tree a call copies: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                         capture_output=True, check=True).stdout
    paths = (repo / p for p in out.decode().split("\0") if p)
    return sum(p.stat().st_size for p in paths if p.is_file())


def check_carry(repo_bytes: int, calls: list[list[Path]], limit: int = CARRY_LIMIT) -> list[int]:
    """Bytes each call moves (tree + its carried files); ValueError naming the call that is over limit."""
    totals = [repo_bytes + sum(_size(p) for p in carried) for carried in calls]
    for i, total in enumerate(totals, 1):
        if total > limit:
            room = limit - (total - _size(calls[i - 1][-1]))
            raise ValueError(f"call {i} would move {total / MIB:.1f} MiB (working tree {repo_bytes / MIB:.1f} "
                             f"MiB + carried), over the {limit / MIB:.0f} MiB limit; rerun prepare with "
                             f"--part-mb {max(room // MIB, 0)} or less, or shrink the working tree")
    return totals


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def prepare(out: Path, part_mb: float, repo: Path, gguf: Path, package: str) -> str:
    """Pack wheels, model parts and manifest under out; return the listing with each call's carry list."""
    wheels = ensure_wheels(out / "wheels", wheel_pins())
    size, most = gguf.stat().st_size, int(part_mb * MIB)
    parts = split_file(gguf, out, -(-size // -(-size // most)))  # as few parts as fit, of even sizes
    manifest = write_manifest(out, gguf, package, parts, [w.name for w in wheels])
    rel = lambda p: str(p.relative_to(repo)) if p.is_relative_to(repo) else str(p)  # noqa: E731
    calls = [[out / "wheels", manifest, out / p["name"]] for p in parts]
    totals = check_carry(tree_bytes(repo), calls)
    rows = [(f"wheels/{w.name}", w.stat().st_size) for w in wheels] + [(p["name"], p["size"]) for p in parts]
    width = max(len(name) for name, _ in rows)
    lines = [f"packed under {rel(out)}:", *(f"  {name:<{width}} {n / MIB:6.2f} MiB" for name, n in rows)]
    lines.append(f"  model {gguf.name} ({package}): {size / MIB:.2f} MiB in {len(parts)} parts")
    for i, (carried, total) in enumerate(zip(calls, totals), 1):
        stage = "all" if i == len(calls) else "tiny"
        lines.append(f"call {i} of {len(calls)} ({total / MIB:.1f} MiB of {CARRY_LIMIT // MIB}): "
                     f"python3 -m benchmarks.gpu_harness device --stage {stage}")
        lines.append(f"  carry {json.dumps([rel(p) for p in carried])}")
    lines.append("run the calls back to back on the same warm machine: the parts wait in /tmp between calls")
    return "\n".join(lines)


def _default_model() -> tuple[Path, str]:
    from actors.model.registry import DEFAULT_MODEL, get_alias, resolve_alias

    return resolve_alias(DEFAULT_MODEL), get_alias(DEFAULT_MODEL).package


# ---------------------------------------------------------------- device: stages


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

    def markdown(self) -> str:
        rows = [f"| {n} | {s} | {d.replace('|', '/')} | {t:.0f} |".replace("\n", " ") for n, s, d, t in self.stages]
        return "\n\n".join(["# GPU harness results",
                            "| stage | status | detail | s |\n|---|---|---|---|\n" + "\n".join(rows),
                            *self.sections]) + "\n"


def stash_parts(gpu_dir: Path, state: Path) -> str:
    """Copy the manifest and any carried parts to state/, which outlives this call; stale parts go."""
    if not (gpu_dir / "manifest.json").is_file():
        raise Skip(f"no {gpu_dir.name}/manifest.json here: using the packages installed on this machine")
    manifest = json.loads((gpu_dir / "manifest.json").read_text())
    parts, kept = state / "parts", state / "manifest.json"
    if kept.is_file() and json.loads(kept.read_text())["sha256"] != manifest["sha256"]:
        shutil.rmtree(parts, ignore_errors=True)  # parts of another model file
    parts.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(gpu_dir / "manifest.json", kept)
    new = sorted(p.name for p in gpu_dir.glob("part-*"))
    for name in new:
        shutil.copyfile(gpu_dir / name, parts / name)
    return f"carried {', '.join(new) or 'no part'}; stashed: {', '.join(sorted(os.listdir(parts))) or 'none'}"


def install_wheels(wheels_dir: Path, site: Path) -> str:
    """pip install the carried wheels into site/, once per set of wheels."""
    wheels = sorted(wheels_dir.glob("*.whl"))
    if not wheels:
        raise Skip(f"no wheels in {wheels_dir}")
    stamp, names = site / ".specray_wheels.json", json.dumps([w.name for w in wheels])
    if stamp.is_file() and stamp.read_text() == names:
        return f"already installed in {site}"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                          "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, wheels)],
                         capture_output=True, text=True, timeout=300)
    if res.returncode:
        raise RuntimeError(f"pip install --target {site} exit {res.returncode}: {res.stderr.strip()[-1500:]}")
    stamp.write_text(names)
    return f"installed {len(wheels)} wheels into {site}"


def place_model(state: Path, site: Path) -> str:
    """Reassemble the stashed parts into site/<package>/<gguf> once all are here."""
    if not (state / "manifest.json").is_file():
        raise Skip("no manifest stashed")
    manifest = json.loads((state / "manifest.json").read_text())
    pkg = site / manifest["package"]
    dest = pkg / manifest["gguf"]
    if dest.is_file() and dest.stat().st_size == manifest["size"]:
        return f"{dest} already in place"
    if missing := missing_parts(manifest, state / "parts"):
        raise Skip(f"default model not assembled yet: parts still missing: {', '.join(missing)} "
                   "(carry them in the next call)")
    reassemble(manifest, state / "parts", dest)
    (pkg / "__init__.py").touch()
    return f"reassembled {dest} (sha256 checked)"


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
for d in ("torch", "triton", "transformers", "pydantic", "gguf", "accelerate", "ray"):
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
    report.sections.append(f"## Tests: `{' '.join(cmd[1:])}`\n\n{summary}\n\n```\n{block[-6000:]}\n```")
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
    cmd = [sys.executable, "-m", "benchmarks.gpu_bench", "--stage", stage, "--out", str(out_dir), *extra]
    rc = run_logged(cmd, env, timeout, out_dir / "bench.log")
    mds = sorted(out_dir.glob("*.md"))
    body = "\n\n".join(p.read_text(errors="replace") for p in mds) or \
        "```\n" + (out_dir / "bench.log").read_text(errors="replace")[-8000:] + "\n```"
    report.sections.append(f"## Benchmark: `{' '.join(cmd[1:])}`\n\n{body}")
    if rc is None:
        raise TimeoutError(f"killed after {timeout:.0f} s")
    if rc != 0:
        raise RuntimeError(f"exit {rc}; see bench.log")
    return f"{len(mds)} markdown files"


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


def device(args: argparse.Namespace) -> int:
    """Every device stage in order under one time budget; writes the results file. Exit 0 if all ran ok."""
    deadline = time.monotonic() + args.budget_s
    left = lambda: deadline - time.monotonic() - 20  # noqa: E731  20 s kept for writing the results
    state, repo, report = args.state_dir, Path.cwd(), Report()
    site, logs = state / "site", state / f"run-{time.strftime('%Y%m%d-%H%M%S')}"
    logs.mkdir(parents=True, exist_ok=True)
    report.run("stash parts", lambda: stash_parts(repo / ".gpu", state))
    report.run("install wheels", lambda: install_wheels(repo / ".gpu" / "wheels", site))
    report.run("default model", lambda: place_model(state, site))
    sys.path[:0] = [str(repo), str(site)]
    has_default = has_default_model()
    env = sub_env(repo, site, state, has_default)
    stage = args.stage if has_default else "tiny"
    if stage != args.stage:
        report.sections.append(f"Default model absent: the benchmark ran `--stage tiny` instead of `{args.stage}`.")
    report.sections.append(machine_info(env))
    report.run("gpu tests", lambda: run_tests(report, env, min(args.tests_s, left()), logs))
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
    p.add_argument("--part-mb", type=float, default=48.0, help="largest model part, MiB (one part per call)")
    d = sub.add_parser("device", help="GPU machine: install, reassemble, run the gpu tests and benchmark")
    d.add_argument("--stage", choices=("tiny", "default", "all"), default="all")
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
    print(prepare((repo / args.out).resolve(), args.part_mb, repo, gguf.resolve(), package))
    return 0


if __name__ == "__main__":
    sys.exit(main())
