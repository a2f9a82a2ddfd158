"""Regenerate the committed protobuf/gRPC modules from ``protos/gradcode/v1/*.proto``.

Usage (from the repository root)::

    python -m protos.generate          # rewrite the generated modules
    python -m protos.generate --check  # exit 1 if the committed modules differ from a fresh build

Runs ``grpc_tools.protoc -I protos --python_out --pyi_out --grpc_python_out``, so the generated code
imports itself as ``gradcode.v1.*``: the installed package maps ``gradcode.v1`` to ``protos/gradcode/v1``.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PROTO_DIR = PROTO_ROOT / "gradcode" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    """Compile every .proto under PROTO_DIR into ``out_root`` (mirroring the tree); return the outputs."""
    import grpc_tools
    from grpc_tools import protoc

    protos = sorted(PROTO_DIR.glob("*.proto"))
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *[str(p.relative_to(PROTO_ROOT)) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    out_dir = out_root / PROTO_DIR.relative_to(PROTO_ROOT)
    return sorted(p for p in out_dir.iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def committed_modules() -> list[Path]:
    return sorted(p for p in PROTO_DIR.iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def drift() -> list[str]:
    """Names of generated modules that differ from (or are missing against) a fresh build."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p for p in generate(Path(tmp))}
        committed = {p.name: p for p in committed_modules()}
        names = sorted(set(fresh) | set(committed))
        return [n for n in names if n not in fresh or n not in committed or not filecmp.cmp(fresh[n], committed[n])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed modules are stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = drift()
        if stale:
            print(f"generated modules are stale: {', '.join(stale)}; run `python -m protos.generate`")
            return 1
        print("generated modules are up to date")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(Path(tmp)):
            shutil.copyfile(path, PROTO_DIR / path.name)
            print(f"wrote {(PROTO_DIR / path.name).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
