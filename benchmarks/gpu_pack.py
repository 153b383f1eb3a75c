"""Packing for a GPU machine that lacks packages and network: the missing wheels, pinned to this
environment's versions, and a model file split into parts small enough to carry one per call, with a
manifest (sizes, sha256) to reassemble and verify them there. Standard library only.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

MIB = 1 << 20
CARRY_LIMIT = 64 * MIB  # working tree + carried paths, per call
WHEEL_DISTS = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "gguf")
ON_BOX = {"numpy", "pyyaml", "tqdm", "requests", "sentencepiece", "typing-extensions"}  # present there
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")


def dist_key(dist: str) -> str:
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
    known = {dist_key(d) for d in (*dists, *ON_BOX)}
    for d in dists:
        for req in metadata.requires(d) or []:
            name = re.match(r"[A-Za-z0-9._-]+", req).group(0)
            if "extra ==" not in req and dist_key(name) not in known:
                raise ValueError(f"{d} requires {name} ({req!r}), which is neither packed nor known to be on "
                                 "the GPU box; add it to WHEEL_DISTS or ON_BOX in benchmarks/gpu_harness.py")
    return pins


def find_wheel(wheels_dir: Path, dist: str, version: str) -> Path | None:
    hits = sorted(wheels_dir.glob(f"{dist_key(dist)}-{version}-*.whl"), key=lambda p: p.name)
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
            fix = f"rerun prepare with --part-mb {room // MIB}" if room >= MIB else "carry less"
            raise ValueError(f"call {i} would move {total / MIB:.1f} MiB (working tree {repo_bytes / MIB:.1f} "
                             f"MiB + carried), over the {limit / MIB:.0f} MiB limit; {fix} or shrink the "
                             "working tree (untracked files not ignored travel too)")
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
        stage = "default" if i == len(calls) else "8b"
        lines.append(f"call {i} of {len(calls)} ({total / MIB:.1f} MiB of {CARRY_LIMIT // MIB}): "
                     f"python3 -m benchmarks.gpu_harness device --stage {stage}")
        lines.append(f"  carry {json.dumps([rel(p) for p in carried])}")
    lines.append("run the calls back to back on the same warm machine: the parts wait in /tmp between calls")
    return "\n".join(lines)
