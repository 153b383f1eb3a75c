"""Building the CPU kernels of ``kernels/csrc`` (loaded and bound by ``kernels/cpu_native.py``).

``torch.utils.cpp_extension.load`` (g++ and ninja) into ``~/.cache/specray/cpu_kernels``
(``SPECRAY_KERNELS_DIR``), named by a hash of the sources, this CPU's model and flags and the torch
installation compiled against, so a changed source or another CPU builds anew (about 20 s on 2
cores) and a built one loads in about a second. Two virtual environments on one machine get a build
each: with one shared build, each would find the other's compile command in it and compile again,
rewriting a library the other may have loaded. Tests build other copies of the same sources under
other op namespaces and flags (``build(("-mno-avx512f",), namespace=...)``).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import sysconfig
from pathlib import Path

import torch

CSRC = Path(__file__).parent / "csrc"
SOURCES = ("ops.cpp", "linear.cpp", "linear_fixed.cpp", "fused.cpp", "attention.cpp", "layers.cpp", "eagle.cpp")
HEADERS = ("kernels.h", "vec16.h", "products.h", "attention_rows.h")
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=off")  # no fma the code did not ask for


def cpu_fingerprint() -> str:
    """The CPU's model name and instruction-set flags (what ``-march=native`` compiles for)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags", "Features", "CPU part"))]
    return "\n".join(sorted(set(keep))) or platform.machine()


def toolchain() -> str:
    """What the compile command names besides the sources and flags: torch's installation (its
    headers and libraries) and Python's headers."""
    return f"{torch.__version__}\n{Path(torch.__file__).resolve().parent}\n{sysconfig.get_paths()['include']}"


def build_name(extra_cflags: tuple[str, ...] = ()) -> str:
    """The extension's name: a hash of the sources, the flags, this CPU and the toolchain."""
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update(name.encode() + b"\0" + (CSRC / name).read_bytes())
    h.update(" ".join(CFLAGS + extra_cflags).encode() + cpu_fingerprint().encode() + toolchain().encode())
    return f"specray_cpu_{h.hexdigest()[:12]}"


def build_root() -> Path:
    """Where builds go: ``$SPECRAY_KERNELS_DIR``, else ``$XDG_CACHE_HOME/specray/cpu_kernels`` (~/.cache)."""
    env = os.environ.get("SPECRAY_KERNELS_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specray" / "cpu_kernels"


def build(extra_cflags: tuple[str, ...] = (), namespace: str = "specray_cpu", verbose: bool = False) -> str:
    """Compile (or find already compiled) and load the kernels as ``torch.ops.<namespace>``; returns
    the extension's name. Raises what the compiler or loader raised.

    The sources are copied into the build's own directory and compiled from there, so every process
    (a Ray worker's unpacked working_dir included) builds with the same command and finds the same
    library. One process builds at a time under an flock, which the OS releases if the process dies;
    torch's own lock file, which a killed builder leaves behind (and every later build then waits
    on forever), is removed under it."""
    from torch.utils import cpp_extension

    _ninja_on_path()
    flags = [*CFLAGS, *extra_cflags, f"-DSPECRAY_NS={namespace}"]
    name = build_name(tuple(flags[len(CFLAGS):]))
    root = build_root() / name
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    with open(root / "specray.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (root / "lock").unlink(missing_ok=True)  # torch's FileBaton of a builder that died
        for f in SOURCES + HEADERS:
            data = (CSRC / f).read_bytes()
            if not (src / f).is_file() or (src / f).read_bytes() != data:
                (src / f).write_bytes(data)
        cpp_extension.load(name=name, sources=[str(src / s) for s in SOURCES], extra_cflags=flags,
                           extra_ldflags=["-fopenmp"], extra_include_paths=[str(src)], build_directory=str(root),
                           is_python_module=False, verbose=verbose)
    return name


def _ninja_on_path() -> None:
    """torch runs ``ninja`` from PATH: put the pip package's (a project dependency) there when the
    virtual environment is not activated and the system has none."""
    if shutil.which("ninja"):
        return
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
