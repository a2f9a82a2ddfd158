"""The package without links: pyproject's package-dir maps the top-level folders into ``gradcode``.

The slow test builds the sdist and the wheel from a clone made with ``core.symlinks=false`` (as on Windows) of
the committed HEAD, installs the wheel into a directory of its own and imports it from there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def _package_folders(root: Path) -> dict[str, Path]:
    """Every package the package-dir mapping makes out of the folders under ``root``: dotted name -> folder."""
    found: dict[str, Path] = {}
    for name, folder in SETUPTOOLS["package-dir"].items():
        for init in sorted((root / folder).rglob("__init__.py")):
            relative = init.parent.relative_to(root / folder).parts
            found[".".join((name, *relative))] = init.parent
    return found


def _wheel_sources(root: Path) -> set[str]:
    """The files a wheel built from ``root`` must hold (paths inside the wheel): every module of every package,
    and the package data pyproject names."""
    expected: set[str] = set()
    for name, folder in _package_folders(root).items():
        prefix = name.replace(".", "/")
        patterns = ["*.py", *SETUPTOOLS["package-data"].get(name, [])]
        expected |= {f"{prefix}/{path.name}" for pattern in patterns for path in folder.glob(pattern)}
    return expected


def test_no_symbolic_links_are_tracked() -> None:
    """A checkout without links (Windows' default) must be the same tree: git records links as mode 120000."""
    links = [line.split("\t", 1)[1] for line in _git("ls-files", "--stage").splitlines() if line.startswith("120000")]
    assert links == []


def test_every_package_folder_is_listed() -> None:
    """setuptools cannot discover packages under a renamed folder: one missing from `packages` would be left out
    of the wheel without an error, while an editable install would still import it."""
    assert sorted(SETUPTOOLS["packages"]) == sorted(_package_folders(ROOT))


def test_mypy_path_names_this_version() -> None:
    """mypy reads the strict editable tree, whose folder name carries the version."""
    version = PYPROJECT["project"]["version"]
    assert PYPROJECT["tool"]["mypy"]["mypy_path"].endswith(f"/build/__editable__.gradcode-{version}-py3-none-any")


@pytest.mark.slow
def test_wheel_and_sdist_from_a_checkout_without_links(tmp_path: Path) -> None:
    checkout, dist, target = tmp_path / "checkout", tmp_path / "dist", tmp_path / "site"
    head = _git("rev-parse", "HEAD").strip()
    _git("clone", "--quiet", "--no-checkout", str(ROOT), str(checkout), cwd=tmp_path)
    _git("-c", "core.symlinks=false", "checkout", "--quiet", head, cwd=checkout)
    build = "import sys, setuptools.build_meta as m; d = sys.argv[1]; print(m.build_sdist(d), m.build_wheel(d))"
    names = subprocess.run(
        [sys.executable, "-c", build, str(dist)], cwd=checkout, check=True, capture_output=True, text=True
    ).stdout.split()
    sdist, wheel = dist / names[-2], dist / names[-1]

    with zipfile.ZipFile(wheel) as archive:
        held = {name for name in archive.namelist() if ".dist-info/" not in name}
    assert held == _wheel_sources(checkout)
    assert {"gradcode/py.typed", "gradcode/v1/worker.proto", "gradcode/common/gather/round.py"} <= held

    with tarfile.open(sdist) as archive:
        in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    tracked = set(_git("ls-files", "gradcode", "common", "master", "worker", "protos", cwd=checkout).split())
    assert tracked <= in_sdist, f"missing from the sdist: {sorted(tracked - in_sdist)}"
    assert {"gradcode/py.typed", "protos/gradcode/v1/worker.proto", "protos/generate.py"} <= in_sdist
    assert not any(name.startswith("docs/") for name in in_sdist), "benchmark results belong to the repository"

    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(target)]
    subprocess.run([*pip, str(wheel)], check=True, capture_output=True)
    probe = (
        "import json, gradcode.client.sdk, gradcode.common.gather.round, gradcode.v1.worker_pb2,"
        " gradcode.v1.worker_pb2_grpc;"
        "from gradcode.bench.output import RESULTS;"
        "print(json.dumps([m.__file__ for m in"
        " (gradcode.client.sdk, gradcode.common.gather.round, gradcode.v1.worker_pb2)]));"
        "print(json.dumps(str(RESULTS)))"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    imported = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, check=True, capture_output=True, text=True
    )
    printed = imported.stdout.splitlines()
    files = [Path(file) for file in json.loads(printed[0])]
    assert all(file.is_relative_to(target) for file in files), files
    assert json.loads(printed[1]) == "gradcode-results", "an installed gradcode writes results beside the user"


def test_a_checkout_imports_its_own_folders() -> None:
    """From the repository's root (``python -m``, pytest, ``PYTHONPATH=.``) gradcode/ holds no subpackage
    folders: gradcode's own finder maps them, so tracebacks and coverage name the real files."""
    probe = (
        "import gradcode.common.gather.round as r, gradcode.v1.worker_pb2_grpc as g; print(r.__file__);"
        " print(g.__file__)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    printed = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, check=True, capture_output=True)
    assert printed.stdout.decode().split() == [
        str(ROOT / "common" / "gather" / "round.py"),
        str(ROOT / "protos" / "gradcode" / "v1" / "worker_pb2_grpc.py"),
    ]


@pytest.mark.parametrize("name", sorted(set(SETUPTOOLS["package-dir"]) - {"gradcode"}))
def test_a_mapped_folder_refuses_its_folder_name(name: str) -> None:
    """``import common.round`` at a checkout's root would load a second copy of every class beside
    ``gradcode.common.gather.round``'s; the folder refuses any name but its package's."""
    folder_name = SETUPTOOLS["package-dir"][name].replace("/", ".")
    refused = subprocess.run([sys.executable, "-c", f"import {folder_name}"], cwd=ROOT, capture_output=True, text=True)
    assert refused.returncode == 1
    assert f"ImportError: import {name}, not {folder_name}" in refused.stderr
