"""Imports run downward only (ARCHITECTURE section 1): deployments -> cluster -> actors -> kernels;
benchmarks and training sit beside the top and serving never imports them. Checked on the source
with ast, imports inside functions included, so that a new upward import fails here."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package -> the top-level packages it must never import
FORBIDDEN = {
    "kernels": {"actors", "cluster", "deployments", "training", "benchmarks"},
    "actors": {"cluster", "deployments", "training", "benchmarks"},
    "cluster": {"deployments", "training", "benchmarks"},
    "deployments": {"training", "benchmarks"},
}

# (file, imported package) -> why it is still there; each entry is debt to remove, never to add to
KNOWN = {
    ("cluster/serve_cli.py", "deployments"): "`specray serve` builds the Serve application",
    ("cluster/serve_config_file.py", "deployments"): "the serve config file validates into deployments' ServeArgs",
}


def _module_parts(path: Path, root: Path) -> list[str]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported_modules(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in the file: top-level or inside functions, relative
    ones resolved, and ``importlib.import_module("...")`` / ``__import__("...")`` with a literal name."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _module_parts(path, root)
    if path.name != "__init__.py":
        package = package[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            out.append((node.lineno, ".".join(base + ([node.module] if node.module else []))))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                out.append((node.lineno, node.args[0].value))
    return out


def upward_imports(package: str) -> dict[tuple[str, str], list[str]]:
    """(file, forbidden top-level package) -> the offending ``file:line imports module`` lines."""
    found: dict[tuple[str, str], list[str]] = {}
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no Python files under {ROOT / package}"
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        for line, module in imported_modules(path):
            top = module.split(".")[0]
            if top in FORBIDDEN[package]:
                found.setdefault((rel, top), []).append(f"{rel}:{line} imports {module}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_run_downward(package):
    new = {k: v for k, v in upward_imports(package).items() if k not in KNOWN}
    lines = [line for v in new.values() for line in v]
    assert not lines, (f"{package} must not import {sorted(FORBIDDEN[package])} (ARCHITECTURE section 1); "
                       f"move the code to the importing side or pass it in: " + "; ".join(lines))


def test_known_exceptions_are_still_real():
    found = {k for package in FORBIDDEN for k in upward_imports(package)}
    stale = sorted(set(KNOWN) - found)
    assert not stale, f"these imports are gone; remove them from KNOWN in {Path(__file__).name}: {stale}"


@pytest.mark.parametrize("rel, source, expected", [
    ("actors/x.py", "import cluster.engine\n", "cluster.engine"),
    ("actors/x.py", "from cluster import engine\n", "cluster"),
    ("actors/x.py", "def f():\n    from training.fit import fit_head\n", "training.fit"),
    ("actors/eagle/x.py", "from .. import sampling\n", "actors"),
    ("actors/eagle/__init__.py", "from .head import EagleHead\n", "actors.eagle.head"),
    ("actors/x.py", "import importlib\nimportlib.import_module('deployments.app')\n", "deployments.app"),
])
def test_checker_sees_every_import_form(tmp_path, rel, source, expected):
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    assert expected in [m for _, m in imported_modules(path, tmp_path)]
