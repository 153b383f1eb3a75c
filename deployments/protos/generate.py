"""Regenerates the Python stubs of ``specray.proto`` with grpcio-tools (a dev dependency):
``python -m deployments.protos.generate``. The proto is compiled relative to the repository root,
so the stubs import each other as ``deployments.protos.*`` and work as a package."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO = Path("deployments/protos/specray.proto")
STUBS = (Path("deployments/protos/specray_pb2.py"), Path("deployments/protos/specray_pb2_grpc.py"))


def generate(out_root: Path = REPO_ROOT) -> list[Path]:
    """Writes the stubs under ``out_root`` (same relative paths as in the repository); returns them."""
    from grpc_tools import protoc

    for stub in STUBS:
        (out_root / stub).parent.mkdir(parents=True, exist_ok=True)
    rc = protoc.main(["grpc_tools.protoc", f"-I{REPO_ROOT}", f"--python_out={out_root}",
                      f"--grpc_python_out={out_root}", str(REPO_ROOT / PROTO)])
    if rc != 0:
        raise RuntimeError(f"protoc failed on {PROTO} (exit {rc})")
    return [out_root / stub for stub in STUBS]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deployments.protos.generate", description=__doc__)
    p.add_argument("--out", type=Path, default=REPO_ROOT, help="root to write under (default: the repository)")
    args = p.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
