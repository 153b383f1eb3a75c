"""benchmarks.gpu_pack and gpu_harness on the CPU: model parts, manifest, reassembly, the prepare listing and the
carry-size check, on a small fake GGUF and pre-placed fake wheels (no network)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from benchmarks import gpu_harness as gh
from benchmarks import gpu_pack as gp

MIB = gp.MIB


@pytest.fixture
def fake_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "pkg" / "model.gguf"
    path.parent.mkdir()
    path.write_bytes(os.urandom(2 * MIB + 123))
    return path


def _pack(tmp_path: Path, gguf: Path, part_bytes: int = MIB) -> tuple[Path, dict]:
    out = tmp_path / "gpu"
    parts = gp.split_file(gguf, out, part_bytes)
    return out, json.loads(gp.write_manifest(out, gguf, "pkg", parts, ["w.whl"]).read_text())


def test_split_manifest_reassemble(tmp_path, fake_gguf):
    out, manifest = _pack(tmp_path, fake_gguf)
    assert [p["name"] for p in manifest["parts"]] == ["part-0", "part-1", "part-2"]
    assert [p["size"] for p in manifest["parts"]] == [MIB, MIB, 123]
    assert manifest["size"] == fake_gguf.stat().st_size and manifest["sha256"] == gp.sha256_file(fake_gguf)
    dest = gp.reassemble(manifest, out, tmp_path / "site" / "pkg" / "model.gguf")
    assert dest.read_bytes() == fake_gguf.read_bytes()


def test_reassemble_names_missing_and_corrupt_parts(tmp_path, fake_gguf):
    out, manifest = _pack(tmp_path, fake_gguf)
    (out / "part-1").unlink()
    assert gp.missing_parts(manifest, out) == ["part-1"]
    with pytest.raises(FileNotFoundError, match="missing .*: part-1"):
        gp.reassemble(manifest, out, tmp_path / "dest.gguf")
    (out / "part-1").write_bytes(b"\0" * MIB)
    with pytest.raises(ValueError, match="part part-1 .* corrupt"):
        gp.reassemble(manifest, out, tmp_path / "dest.gguf")
    assert not (tmp_path / "dest.gguf").exists()


def test_place_model_waits_for_parts_then_reassembles(tmp_path, fake_gguf):
    """Two calls: the first carries part-0 (and waits), the second the rest (and reassembles)."""
    out, _ = _pack(tmp_path, fake_gguf, part_bytes=MIB + MIB // 2)
    calls = []
    for part in ("part-0", "part-1"):
        carried = tmp_path / f"call-{part}"
        carried.mkdir()
        for name in ("manifest.json", part):
            (carried / name).write_bytes((out / name).read_bytes())
        calls.append(carried)
    state, site = tmp_path / "state", tmp_path / "state" / "site"
    gh.stash_parts(calls[0], state)
    with pytest.raises(gh.Skip, match="missing: part-1"):
        gh.place_model(state, site)
    assert "stashed: part-0, part-1" in gh.stash_parts(calls[1], state)
    gh.place_model(state, site)
    assert (site / "pkg" / "model.gguf").read_bytes() == fake_gguf.read_bytes()
    assert (site / "pkg" / "__init__.py").is_file()


def _fake_wheels(wheels_dir: Path) -> dict[str, str]:
    pins = gp.wheel_pins()
    wheels_dir.mkdir(parents=True)
    for dist, version in pins.items():
        (wheels_dir / f"{gp.dist_key(dist)}-{version}-py3-none-any.whl").write_bytes(b"w" * 1000)
    return pins


def test_prepare_lists_what_it_packed(tmp_path, fake_gguf, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "README.md").write_text("x" * 1000)
    out = repo / ".gpu"
    _fake_wheels(out / "wheels")

    real_run = subprocess.run

    def run(cmd, **kwargs):
        assert "pip" not in cmd, f"downloaded although the wheels are present: {cmd}"
        return real_run(cmd, **kwargs)

    monkeypatch.setattr(gp.subprocess, "run", run)
    listing = gp.prepare(out, 1.0, repo, fake_gguf, "pkg")
    assert "wheels/pydantic-" in listing and "wheels/gguf-" in listing
    assert "in 3 parts" in listing
    assert 'carry [".gpu/wheels", ".gpu/manifest.json", ".gpu/part-2"]' in listing
    assert "call 3 of 3" in listing and "--stage default" in listing and "--stage 8b" in listing
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["package"] == "pkg" and len(manifest["wheels"]) == len(gp.WHEEL_DISTS)


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
