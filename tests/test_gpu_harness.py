"""benchmarks.gpu_pack, gpu_wheels and gpu_harness on the CPU: the parts stream over several blobs (a fake
GGUF and fake wheels), the manifest, reassembly, the device side over several calls (stash, reassemble once
all parts are in, the http stage skipped while it waits), the prepare listing, the requirement checks on
this environment's real metadata, and the carry-size check (no network)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from benchmarks import gpu_harness as gh
from benchmarks import gpu_pack as gp
from benchmarks import gpu_wheels as gw

MIB = gp.MIB
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def blobs(tmp_path: Path) -> list[gp.Blob]:
    """A base wheel, a 2 MiB model, a 1.5 MiB and a small http wheel."""
    files = {"base-1.0-py3-none-any.whl": 1000, "pkg/model.gguf": 2 * MIB + 123,
             "ray-9.0-py3-none-any.whl": MIB + MIB // 2, "tiny-1.0-py3-none-any.whl": 10}
    for name, size in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(os.urandom(size))
    return [gp.Blob(tmp_path / "base-1.0-py3-none-any.whl", "wheel", "base"),
            gp.Blob(tmp_path / "pkg/model.gguf", "model", "model", "pkg"),
            gp.Blob(tmp_path / "ray-9.0-py3-none-any.whl", "wheel", "http"),
            gp.Blob(tmp_path / "tiny-1.0-py3-none-any.whl", "wheel", "http")]


def _pack(tmp_path: Path, blobs: list[gp.Blob], per_call: int = MIB + MIB // 4,
          dists: dict | None = None) -> tuple[Path, dict]:
    out = tmp_path / "gpu"
    entries = gp.write_parts(blobs, out, per_call)
    dists = dists or {"base": ["pydantic"], "http": ["ray[serve]", "openai"]}  # as installed here
    return out, json.loads(gp.write_manifest(out, entries, dists).read_text())


def test_plan_stream_cuts_few_even_calls():
    assert gp.plan_stream([3, 10, 2], 6) == [[(0, 0, 3), (1, 0, 2)], [(1, 2, 5)], [(1, 7, 3), (2, 0, 2)]]
    assert gp.plan_stream([10], 10) == [[(0, 0, 10)]]
    assert gp.plan_stream([10], 9) == [[(0, 0, 5)], [(0, 5, 5)]]  # even shares, not 9 + 1
    sizes = [7, 1, 30, 4, 4, 9]
    calls = gp.plan_stream(sizes, 12)
    assert len(calls) == -(-sum(sizes) // 12) and all(sum(n for *_, n in c) <= 12 for c in calls)
    pieces = [p for c in calls for p in c]  # every byte once, in order
    assert [(i, off) for i, off, _ in pieces] == sorted((i, off) for i, off, _ in pieces)
    assert [sum(n for j, _, n in pieces if j == i) for i in range(len(sizes))] == sizes


def test_parts_of_several_blobs_reassemble(tmp_path, blobs):
    out, manifest = _pack(tmp_path, blobs)
    assert manifest["calls"] == 3 and sorted(p.name for p in out.iterdir()) == ["call-1", "call-2", "call-3",
                                                                                "manifest.json"]
    model = manifest["blobs"][1]
    assert [p["name"] for p in model["parts"]] == ["model.gguf.part-0", "model.gguf.part-1"]
    assert [p["call"] for b in manifest["blobs"] for p in b["parts"]] == [1, 1, 2, 2, 3, 3]
    for call in (1, 2, 3):
        assert sum(f.stat().st_size for f in (out / f"call-{call}").iterdir()) <= MIB + MIB // 4
    parts = tmp_path / "stash"
    parts.mkdir()
    for f in out.glob("call-*/*"):
        f.rename(parts / f.name)
    for blob, entry in zip(blobs, manifest["blobs"]):
        dest = gp.reassemble(entry, parts, tmp_path / "dest" / entry["name"])
        assert dest.read_bytes() == blob.path.read_bytes() and entry["sha256"] == gp.sha256_file(blob.path)


def test_reassemble_names_missing_and_corrupt_parts(tmp_path, blobs):
    out, manifest = _pack(tmp_path, blobs)
    ray = manifest["blobs"][2]
    (out / "call-2" / "ray-9.0-py3-none-any.whl.part-0").unlink()
    assert [p["name"] for p in gp.missing_parts(manifest, out / "call-3", "http")] == [
        "ray-9.0-py3-none-any.whl.part-0"]
    with pytest.raises(FileNotFoundError, match=r"missing .*: ray-9.0-py3-none-any.whl.part-0, carried by call 2 "
                                                r"\(.gpu/call-2\)"):
        gp.reassemble(ray, out / "call-3", tmp_path / "dest.whl")
    (out / "call-3" / "ray-9.0-py3-none-any.whl.part-0").write_bytes(b"\0" * 100)
    with pytest.raises(ValueError, match="part ray-9.0-py3-none-any.whl.part-0 .* corrupt .* carry .gpu/call-2"):
        gp.reassemble(ray, out / "call-3", tmp_path / "dest.whl")
    assert not (tmp_path / "dest.whl").exists()


def _carried(tmp_path: Path, out: Path, call: int) -> Path:
    """What one call's checkout holds: .gpu/manifest.json and .gpu/call-N."""
    gpu = tmp_path / f"checkout-{call}" / ".gpu"
    (gpu / f"call-{call}").mkdir(parents=True)
    (gpu / "manifest.json").write_bytes((out / "manifest.json").read_bytes())
    for f in (out / f"call-{call}").iterdir():
        (gpu / f"call-{call}" / f.name).write_bytes(f.read_bytes())
    return gpu


def test_device_calls_stash_wait_then_reassemble(tmp_path, blobs):
    """Three calls: each stashes its parts; a blob is reassembled once all its parts are in; the
    http stage is skipped, naming the parts and the call that brings them, until the last."""
    out, _ = _pack(tmp_path, blobs)
    state, site = tmp_path / "state", tmp_path / "state" / "site"
    assert "carried 2 parts" in gh.stash_parts(_carried(tmp_path, out, 1), state)
    text = gh.assemble(state, site)
    assert "reassembled 1 (sha256 checked): base-1.0-py3-none-any.whl; 0 already" in text and "calls 2, 3" in text
    block = gh.http_blocker(state)
    assert block.startswith("waiting for parts ray-9.0-py3-none-any.whl.part-0, ray-9.0-py3-none-any.whl.part-1, "
                            "tiny-1.0-py3-none-any.whl.part-0, carried by calls 2, 3 (.gpu/call-2, .gpu/call-3)")
    assert gh.plan_bench("http", True, block) == (None, [("bench http", block)])
    gh.stash_parts(_carried(tmp_path, out, 2), state)
    assert "reassembled 1 (sha256 checked): model.gguf; 1 already in place" in gh.assemble(state, site)
    assert (site / "pkg" / "model.gguf").read_bytes() == blobs[1].path.read_bytes()
    assert (site / "pkg" / "__init__.py").is_file()
    assert "carried by call 3 (.gpu/call-3)" in gh.http_blocker(state)
    gh.stash_parts(_carried(tmp_path, out, 3), state)
    assert gh.assemble(state, site).endswith("2 already in place; all blobs in place")
    for b in (blobs[0], blobs[2], blobs[3]):
        assert (state / "wheels" / b.path.name).read_bytes() == b.path.read_bytes()
    assert gh.http_blocker(state) is None  # ray is installed in this environment
    assert re.fullmatch(r"3 carried dists \(base, http\) and \d+ of specray's: requirements met",
                        gh.check_requirements(state, REPO))
    assert gh.assemble(state, site) == "reassembled 0 (sha256 checked); 4 already in place; all blobs in place"


def test_stash_drops_parts_of_another_manifest(tmp_path, blobs):
    out, _ = _pack(tmp_path, blobs)
    state = tmp_path / "state"
    gh.stash_parts(_carried(tmp_path, out, 1), state)
    assert (state / "parts" / "model.gguf.part-0").is_file()
    blobs[1].path.write_bytes(os.urandom(2 * MIB + 123))  # a new model file: its parts' sha256 change
    out2, _ = _pack(tmp_path / "again", blobs)
    checkout = tmp_path / "c2" / ".gpu"
    checkout.mkdir(parents=True)
    (checkout / "manifest.json").write_bytes((out2 / "manifest.json").read_bytes())
    gh.stash_parts(checkout, state)
    assert sorted(os.listdir(state / "parts")) == ["base-1.0-py3-none-any.whl.part-0"]


def test_requirements_row_names_what_the_box_lacks(tmp_path, blobs):
    out, _ = _pack(tmp_path, blobs, dists={"base": ["pydantic>=99"], "http": ["specray-absent-dist"]})
    state = tmp_path / "state"
    gh.stash_parts(_carried(tmp_path, out, 1), state)  # http's parts still to come: not checked
    with pytest.raises(RuntimeError, match=r"1 unmet \(carry the dist with prepare --also NAME\): pydantic>=99: "):
        gh.check_requirements(state, REPO)


def _wheel(path: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel (one module) that pip installs."""
    whl = path / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {f"{name}.py": "X = 1\n", f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(whl, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
    return whl


def test_install_wheels_installs_only_new_ones(tmp_path):
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    wheels.mkdir()
    _wheel(wheels, "specray_fake_a", "1.0")
    assert gh.install_wheels(wheels, site) == f"installed 1 wheels into {site} (1 in all)"
    _wheel(wheels, "specray_fake_b", "2.0")
    assert gh.install_wheels(wheels, site) == f"installed 1 wheels into {site} (2 in all)"
    assert (site / "specray_fake_a.py").is_file() and (site / "specray_fake_b.py").is_file()
    assert gh.install_wheels(wheels, site) == f"all 2 already installed in {site}"
    assert gw.unmet_requirements(["specray_fake_b==2.0"], [str(site)]) == []


def test_unmet_requirements_reads_this_machine(tmp_path):
    info = tmp_path / "specray_probe-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: specray-probe\nVersion: 1.0\n"
                                   "Requires-Dist: pydantic>=99\nRequires-Dist: specray-absent-dist\n"
                                   "Requires-Dist: numpy\nRequires-Dist: nothing-either; extra == 'x'\n")
    path = [str(tmp_path), *sys.path]
    assert gw.unmet_requirements(["specray-probe"], path) == [
        f"specray-probe 1.0 requires pydantic>=99: {gw.installed('pydantic').version} is installed",
        "specray-probe 1.0 requires specray-absent-dist: not installed"]
    assert gw.unmet_requirements(["specray-probe>=2"], path) == ["specray-probe>=2: 1.0 is installed"]
    assert gw.unmet_requirements(["pydantic", "ray[serve]", "openai"]) == []


def test_wheel_pins_checks_the_closure_for_the_box():
    pins = gw.wheel_pins(gw.BASE_DISTS + gw.HTTP_DISTS)
    assert pins["ray"] and pins["uvicorn"] and len(pins) == len(gw.BASE_DISTS + gw.HTTP_DISTS)
    with pytest.raises(ValueError, match=r"ray\[serve\] requires jsonschema .* neither packed nor known to be on "
                                         "the GPU box; add jsonschema to"):
        gw.wheel_pins(tuple(d for d in gw.BASE_DISTS + gw.HTTP_DISTS if d != "jsonschema"))
    with pytest.raises(ValueError, match=r"requires uvicorn\[standard\].*: list uvicorn as uvicorn\[standard\]"):
        gw.wheel_pins(tuple("uvicorn" if d == "uvicorn[standard]" else d for d in gw.BASE_DISTS + gw.HTTP_DISTS))
    with pytest.raises(ValueError, match="specray-no-such-dist is to be packed but is not installed here"):
        gw.wheel_pins(("specray-no-such-dist",))
    assert gw.parse_dist("uvicorn[standard]") == ("uvicorn", ("standard",)) and gw.parse_dist("ray") == ("ray", ())


def _repo_with_wheels(tmp_path: Path, dists: tuple[str, ...]) -> tuple[Path, Path]:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "README.md").write_text("x" * 1000)
    wheels = repo / ".gpu" / "wheels"
    wheels.mkdir(parents=True)
    for dist, version in gw.wheel_pins(dists).items():
        (wheels / f"{gw.dist_key(dist)}-{version}-py3-none-any.whl").write_bytes(b"w" * 1000)
    return repo, repo / ".gpu"


@pytest.fixture
def no_pip(monkeypatch):
    real_run = subprocess.run

    def run(cmd, **kwargs):
        assert "pip" not in cmd, f"downloaded although the wheels are present: {cmd}"
        return real_run(cmd, **kwargs)

    monkeypatch.setattr(gw.subprocess, "run", run)


def test_prepare_default_plan(tmp_path, blobs, no_pip):
    repo, out = _repo_with_wheels(tmp_path, gw.BASE_DISTS)
    (out / "part-0").write_bytes(b"old layout")
    listing = gp.prepare(out, repo, blobs[1].path, "pkg", part_mb=1.0)
    assert "model model.gguf (pkg) 2.00 MiB" in listing and "in 3 calls" in listing
    assert 'carry [".gpu/manifest.json", ".gpu/call-3"]' in listing
    assert "call 1 of 3" in listing and "device --stage 8b\n" in listing
    assert listing.count("device --stage default") == 1  # the call that completes the model
    assert "parts: model.gguf part 1 of 3 (0.7 MiB); 5 base wheels whole (0.0 MiB)\n" in listing  # even shares
    assert not (out / "part-0").exists()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dists"] == {"base": [gp.pinned(d, gw.wheel_pins(gw.BASE_DISTS)) for d in gw.BASE_DISTS]}
    assert [b["kind"] for b in manifest["blobs"]] == ["wheel"] * 5 + ["model"]


def test_prepare_http_plan(tmp_path, blobs, no_pip):
    repo, out = _repo_with_wheels(tmp_path, gw.BASE_DISTS + gw.HTTP_DISTS)
    listing = gp.prepare(out, repo, blobs[1].path, "pkg", http=True, part_mb=1.0)
    calls = json.loads((out / "manifest.json").read_text())["calls"]
    assert calls == 3 and f"call {calls} of {calls}" in listing
    assert listing.count("device --stage none --tests-s 0") == calls - 1
    assert listing.endswith("between calls, each blob is reassembled (sha256 checked) once all its parts are there")
    assert f"device --stage http --tests-s 0\n  carry [\".gpu/manifest.json\", \".gpu/call-{calls}\"]" in listing
    manifest = json.loads((out / "manifest.json").read_text())
    assert f"ray[serve]=={gw.installed('ray').version}" in manifest["dists"]["http"]
    assert {b["group"] for b in manifest["blobs"]} == {"base", "model", "http"}


def test_plan_bench_drops_http_while_it_waits():
    block = "waiting for parts ray.whl.part-2, carried by call 4 (.gpu/call-4)"
    assert gh.plan_bench("all", True, block) == ("tiny,8b,attention,default,host,draft,offload",
                                                [("bench http", block)])
    assert gh.plan_bench("all", True, None) == ("all", [])
    assert gh.plan_bench("http", True, None) == ("http", [])
    assert gh.plan_bench("http,default", False, None) == ("8b", [])  # the model is not in yet
    assert gh.plan_bench("none", True, block) == (None, [("bench", "--stage none: this call only carries parts")])
    from benchmarks import gpu_bench

    assert gh.ALL_STAGES == gpu_bench.STAGES


def test_carry_size_check_fails_clearly(tmp_path):
    part = tmp_path / "part-0"
    part.write_bytes(b"p" * MIB)
    assert gp.check_carry(10 * MIB, [[part]], limit=12 * MIB) == [11 * MIB]
    with pytest.raises(ValueError, match=r"call 1 would move 11.0 MiB .* over the 10 MiB limit; carry less"):
        gp.check_carry(10 * MIB, [[part]], limit=10 * MIB)
    big = tmp_path / "part-1"
    big.write_bytes(b"p" * 5 * MIB)
    with pytest.raises(ValueError, match="call 2 would move 15.0 MiB .* rerun prepare with --part-mb 3 or shrink"):
        gp.check_carry(10 * MIB, [[part], [big]], limit=int(13.5 * MIB))


def test_pytest_report_finds_summary_and_failures():
    log = "....F\n=== short test summary info ===\nFAILED tests/x.py::t - boom\n=== 1 failed, 4 passed in 3.2s ==="
    assert gh.pytest_report(log) == ("1 failed, 4 passed in 3.2s", "FAILED tests/x.py::t - boom")


def test_specrays_own_unmet_requirement_fails_only_the_http_plan(tmp_path, blobs):
    """The box's grpcio is older than specray's pin: a note while no http stage can run, a failure once
    the http group (which carries grpcio) is in and still leaves it unmet."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["pytest>=99", "pydantic"]\n')
    for dists, fails in (({"base": ["pydantic"]}, False), ({"base": ["pydantic"], "http": ["openai"]}, True)):
        out, _ = _pack(tmp_path / str(fails), blobs, dists=dists)
        state = tmp_path / str(fails) / "state"
        for call in (1, 2, 3):
            gh.stash_parts(_carried(tmp_path / str(fails), out, call), state)
        if fails:
            with pytest.raises(RuntimeError, match=r"1 unmet .*: pytest>=99: "):
                gh.check_requirements(state, repo)
        else:
            text = gh.check_requirements(state, repo)
            assert text.startswith("1 carried dists (base) and 2 of specray's: requirements met, but not")
            assert "pytest>=99: " in text and "only the http stage needs them" in text


def test_every_dependency_of_specray_is_on_the_box_or_packed():
    """A new dependency must reach the GPU box: on it already (ON_BOX) or packed by prepare (base or
    http). llguidance was added to pyproject without this and a Serve replica there would not start."""
    import tomllib

    from packaging.requirements import Requirement

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    known = {gw.dist_key(d) for d in gw.ON_BOX} | {gw.dist_key(gw.parse_dist(d)[0])
                                                   for d in gw.BASE_DISTS + gw.HTTP_DISTS}
    assert [d for d in deps if gw.dist_key(Requirement(d).name) not in known] == []
