"""Packing for a GPU machine that lacks packages and network and takes at most 64 MiB (working tree +
carried paths) per call. Every large file it needs (the wheels it lacks, pinned to this environment's
versions: benchmarks/gpu_wheels.py; the default model's GGUF) is a *blob* in one stream of parts, cut
so that as few calls as possible carry it, in even shares; call N's parts lie in one folder
(``.gpu/call-N``), and ``.gpu/manifest.json`` names every blob, its parts (size, sha256, the call
that carries it) and the sha256 of the whole, to reassemble and verify them there. Standard library
only.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from benchmarks.gpu_wheels import BASE_DISTS, HTTP_DISTS, ensure_wheels, parse_dist, wheel_pins

MIB = 1 << 20
CARRY_LIMIT = 64 * MIB  # working tree + carried paths, per call
MANIFEST_ROOM = MIB // 4  # kept free in every call for manifest.json (a few KiB per 10 blobs)


def sha256_file(path: Path, chunk: int = 4 * MIB) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------- the parts stream


@dataclass(frozen=True)
class Blob:
    """A file to carry in parts. kind: 'wheel' (installed there) or 'model' (placed in a package
    directory, ``package``); group: what needs it there ('base': everything, 'model', 'http')."""
    path: Path
    kind: str
    group: str
    package: str | None = None


def plan_stream(sizes: list[int], per_call: int) -> list[list[tuple[int, int, int]]]:
    """Cut the files of these sizes, one after another, into as few calls as carry at most per_call
    bytes each, of even shares: per call its pieces as (file index, offset, length)."""
    total = sum(sizes)
    n = max(1, -(-total // per_call))
    share = -(-total // n)
    calls: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
    pos = 0  # position in the stream
    for i, size in enumerate(sizes):
        off = 0
        while off < size:
            call = pos // share
            length = min(size - off, (call + 1) * share - pos)
            calls[call].append((i, off, length))
            off, pos = off + length, pos + length
    return calls


def write_parts(blobs: list[Blob], out: Path, per_call: int) -> list[dict]:
    """Write the stream as out/call-N/<blob>.part-K (N from 1); the manifest's blob entries."""
    for old in [*out.glob("call-*"), *out.glob("part-*")]:  # part-*: the one-model layout before blobs
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    entries = [{"name": b.path.name, "kind": b.kind, "group": b.group, **({"package": b.package} if b.package else {}),
                "size": b.path.stat().st_size, "sha256": sha256_file(b.path), "parts": []} for b in blobs]
    for call, pieces in enumerate(plan_stream([e["size"] for e in entries], per_call), 1):
        folder = out / f"call-{call}"
        folder.mkdir(parents=True)
        for i, off, length in pieces:
            entry = entries[i]
            name = f"{entry['name']}.part-{len(entry['parts'])}"
            with open(blobs[i].path, "rb") as f:
                f.seek(off)
                block = f.read(length)
            (folder / name).write_bytes(block)
            entry["parts"].append({"name": name, "size": length, "sha256": hashlib.sha256(block).hexdigest(),
                                   "call": call})
    return entries


def write_manifest(out: Path, blobs: list[dict], dists: dict[str, list[str]]) -> Path:
    """out/manifest.json: the blobs (with their parts), the dists each group installs, the calls."""
    calls = max((p["call"] for b in blobs for p in b["parts"]), default=0)
    path = out / "manifest.json"
    path.write_text(json.dumps({"format": 2, "calls": calls, "dists": dists, "blobs": blobs}, indent=1) + "\n")
    return path


def missing_parts(manifest: dict, parts_dir: Path, group: str | None = None) -> list[dict]:
    """Parts (manifest entries) of the blobs of ``group`` (all groups: None) not in parts_dir."""
    return [p for b in manifest["blobs"] if group in (None, b["group"]) for p in b["parts"]
            if not (parts_dir / p["name"]).is_file()]


def waiting_text(missing: list[dict], shown: int = 3) -> str:
    """'a.part-1, b.part-0 (+4 more), carried by call 3 (.gpu/call-3)': what has still to come."""
    names = ", ".join(p["name"] for p in missing[:shown]) + (f" (+{len(missing) - shown} more)"
                                                              if len(missing) > shown else "")
    calls = sorted({p["call"] for p in missing})
    return (f"{names}, carried by call{'s' if len(calls) > 1 else ''} {', '.join(map(str, calls))} "
            f"({', '.join(f'.gpu/call-{c}' for c in calls)})")


def reassemble(blob: dict, parts_dir: Path, dest: Path) -> Path:
    """Concatenate the blob's parts into dest, checking each part's and the whole file's sha256."""
    if missing := [p for p in blob["parts"] if not (parts_dir / p["name"]).is_file()]:
        raise FileNotFoundError(f"parts still missing in {parts_dir}: {waiting_text(missing)}; "
                                "carry them in the next call")
    for p in blob["parts"]:
        if sha256_file(parts_dir / p["name"]) != p["sha256"]:
            raise ValueError(f"part {p['name']} in {parts_dir} is corrupt (sha256 differs from the manifest); "
                             f"carry .gpu/call-{p['call']} again")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    with open(tmp, "wb") as out:
        for p in blob["parts"]:
            with open(parts_dir / p["name"], "rb") as f:
                shutil.copyfileobj(f, out, 4 * MIB)
    if sha256_file(tmp) != blob["sha256"]:
        tmp.unlink()
        raise ValueError(f"reassembled {dest.name} does not match the manifest's sha256; run prepare again")
    tmp.replace(dest)
    return dest


# ---------------------------------------------------------------- carry sizes


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


# ---------------------------------------------------------------- prepare


def call_command(call: int, calls: int, model_call: int, http: bool) -> str:
    """The device command of one call. Default plan: the 8b stage until the model is in, then the
    default stage. --http plan: calls that only carry parts run nothing (seconds), the last the
    http stage (the tests ran, or can run, in calls of their own)."""
    if http:
        stage = "http --tests-s 0" if call == calls else "none --tests-s 0"
    else:
        stage = "8b" if call < model_call else "default"
    return f"python3 -m benchmarks.gpu_harness device --stage {stage}"


def describe_call(blobs: list[dict], call: int) -> str:
    """What one call carries: split blobs as 'name i-j/n', whole files counted by group."""
    split, whole = [], {}
    for b in blobs:
        mine = [k for k, p in enumerate(b["parts"]) if p["call"] == call]
        if not mine:
            continue
        size = sum(b["parts"][k]["size"] for k in mine)
        if len(b["parts"]) == 1:
            n, s = whole.get(b["group"], (0, 0))
            whole[b["group"]] = (n + 1, s + size)
        else:
            ks = f"{mine[0] + 1}" if len(mine) == 1 else f"{mine[0] + 1}-{mine[-1] + 1}"
            split.append(f"{b['name']} part {ks} of {len(b['parts'])} ({size / MIB:.1f} MiB)")
    counted = [f"{n} {g} {'wheels' if g != 'model' else 'files'} whole ({s / MIB:.1f} MiB)"
               for g, (n, s) in whole.items()]
    return "; ".join(split + counted)


def pinned(dist: str, pins: dict[str, str]) -> str:
    """'uvicorn[standard]' -> 'uvicorn[standard]==0.54.0' (the requirement the box checks)."""
    name, extras = parse_dist(dist)
    return f"{name}{'[' + ','.join(extras) + ']' if extras else ''}=={pins[name]}"


def prepare(out: Path, repo: Path, gguf: Path, package: str, http: bool = False, also: tuple[str, ...] = (),
            part_mb: float | None = None) -> str:
    """Pack wheels and model into call folders under out with the manifest; return the listing with
    each call's carry list and command. also: dists the box has, to carry at this venv's version."""
    groups = {"base": BASE_DISTS + tuple(also), **({"http": HTTP_DISTS} if http else {})}
    pins = wheel_pins(tuple(d for ds in groups.values() for d in ds))
    wheels = dict(zip(pins, ensure_wheels(out / "wheels", pins)))
    blobs = [Blob(wheels[parse_dist(d)[0]], "wheel", "base") for d in groups["base"]]
    blobs.append(Blob(gguf, "model", "model", package))
    blobs += [Blob(wheels[parse_dist(d)[0]], "wheel", "http") for d in groups.get("http", ())]
    repo_bytes = tree_bytes(repo)
    per_call = CARRY_LIMIT - repo_bytes - MANIFEST_ROOM
    if part_mb:
        per_call = min(per_call, int(part_mb * MIB))
    if per_call < MIB:
        raise ValueError(f"the working tree ({repo_bytes / MIB:.1f} MiB) leaves no room under the "
                         f"{CARRY_LIMIT // MIB} MiB limit per call; shrink it")
    entries = write_parts(blobs, out, per_call)
    manifest = write_manifest(out, entries, {g: [pinned(d, pins) for d in ds] for g, ds in groups.items()})
    n_calls = json.loads(manifest.read_text())["calls"]
    carried = [[manifest, out / f"call-{c}"] for c in range(1, n_calls + 1)]
    totals = check_carry(repo_bytes, carried)
    rel = lambda p: str(p.relative_to(repo)) if p.is_relative_to(repo) else str(p)  # noqa: E731
    return listing(entries, [[rel(p) for p in c] for c in carried], totals, repo_bytes, http, rel(out))


def listing(entries: list[dict], carried: list[list[str]], totals: list[int], repo_bytes: int, http: bool,
            out: str) -> str:
    """What prepare packed, then per call its size, command, carry list and parts."""
    by_group: dict[str, tuple[int, int]] = {}
    for e in entries:
        n, s = by_group.get(e["group"], (0, 0))
        by_group[e["group"]] = (n + 1, s + e["size"])
    model = next(e for e in entries if e["kind"] == "model")
    groups = ", ".join(f"{g}: {n} files, {s / MIB:.2f} MiB" for g, (n, s) in by_group.items())
    lines = [f"packed under {out} ({groups}):",
             f"  model {model['name']} ({model['package']}) {model['size'] / MIB:.2f} MiB",
             *(f"  {e['name']} {e['size'] / MIB:.2f} MiB" for e in entries
               if e["size"] >= 2 * MIB and e["kind"] == "wheel"),
             f"  stream {sum(s for _, s in by_group.values()) / MIB:.1f} MiB in {len(carried)} calls; working tree "
             f"{repo_bytes / MIB:.1f} MiB per call"]
    model_call = max(p["call"] for p in model["parts"])
    for c, (files, total) in enumerate(zip(carried, totals), 1):
        lines.append(f"call {c} of {len(carried)} ({total / MIB:.1f} MiB of {CARRY_LIMIT // MIB}): "
                     f"{call_command(c, len(carried), model_call, http)}")
        lines.append(f"  carry {json.dumps(files)}")
        lines.append(f"  parts: {describe_call(entries, c)}")
    lines.append("run the calls back to back on the same warm machine: the parts wait in /tmp/specray_gpu between "
                 "calls, each blob is reassembled (sha256 checked) once all its parts are there")
    return "\n".join(lines)
