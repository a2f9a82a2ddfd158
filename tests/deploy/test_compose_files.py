"""docker-compose.yml and the Docker build context, checked offline (no Docker engine on these machines):
services that recover, a small context that still holds everything the Dockerfile copies, and a ./data
folder that exists before Docker would create it owned by root."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CONTEXT_BUDGET_BYTES = 8 * 2**20
"""The build context without caches and tests is ~3 MB; with .mypy_cache and .git it was over 50 MB."""


def _ignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip().rstrip("/") for line in lines if line.strip() and not line.startswith("#")]


def _ignored(relative: str, patterns: list[str]) -> bool:
    """Docker's rule for these patterns: a path is out when it, or a folder above it, matches one."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        bare = pattern.removeprefix("**/")
        for prefix in prefixes:
            if fnmatch.fnmatchcase(prefix, pattern) or (
                pattern.startswith("**/") and fnmatch.fnmatchcase(prefix.rsplit("/", 1)[-1], bare)
            ):
                return True
    return False


def _context_files(patterns: list[str]) -> list[Path]:
    kept = []
    for folder, dirs, files in os.walk(ROOT):
        here = Path(folder).relative_to(ROOT).as_posix()
        dirs[:] = [d for d in dirs if not _ignored(f"{here}/{d}".removeprefix("./"), patterns)]
        kept += [Path(folder) / f for f in files if not _ignored(f"{here}/{f}".removeprefix("./"), patterns)]
    return kept


def test_the_build_context_is_small_and_keeps_what_the_dockerfile_copies() -> None:
    patterns = _ignore_patterns()
    copied = [
        source
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ")
        for source in line.split()[1:-1]
    ]
    assert {"pyproject.toml", "README.md", "common", "master", "worker", "protos", "gradcode"} <= set(copied)
    assert not [source for source in copied if _ignored(source, patterns)]
    for heavy in (".git", ".mypy_cache", "tests", "runs", "data", "gradcode/bench/results"):
        assert _ignored(heavy, patterns), heavy
    assert _ignored("common/__pycache__/x.pyc", patterns) and not _ignored("common/gather/round.py", patterns)
    size = sum(f.stat().st_size for f in _context_files(patterns) if f.is_file())
    assert size < CONTEXT_BUDGET_BYTES, f"build context {size / 2**20:.1f} MB"


def test_services_restart_and_the_client_runs_once() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert services["master"]["restart"] == "unless-stopped"
    assert services["worker"]["restart"] == "unless-stopped"
    assert services["client"]["restart"] == "no"


def test_the_data_folder_exists_in_the_checkout() -> None:
    """A missing bind-mount source is created by the Docker daemon, as root: users could not write to it."""
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    sources = {v.split(":")[0] for s in services.values() for v in s.get("volumes", []) if v.startswith("./")}
    assert sources == {"./data"}
    assert (ROOT / "data").is_dir() and (ROOT / "data" / "README.md").is_file()
