"""The default machine id tells network namespaces and containers (host-name namespaces) on one kernel apart, and
stays one for processes of one namespace: real processes in namespaces of their own (``unshare``, as root)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from gradcode.worker.node import default_machine_id

# What a worker registers by default (gradcode.worker.node re-exports the one rule of
# gradcode.common.transport.machine).
PRINT_ID = "from gradcode.worker.node import default_machine_id; print(default_machine_id())"


def _machine_id(*unshare: str) -> str:
    """The default machine id of a new Python process, in new namespaces of the ``unshare`` kinds given."""
    if unshare:
        if shutil.which("unshare") is None:
            pytest.skip("util-linux's unshare is not installed: no new namespaces to compare")
        if os.geteuid() != 0:
            pytest.skip("new network and host-name namespaces need root (unshare without --user)")
    argv = ["unshare", *unshare, sys.executable, "-c", PRINT_ID] if unshare else [sys.executable, "-c", PRINT_ID]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_processes_of_one_namespace_share_the_machine_id() -> None:
    here = default_machine_id()
    assert here and len(here) == 32 and int(here, 16) >= 0
    assert _machine_id() == here  # another process, the same namespaces: the same machine


def test_two_network_namespaces_are_two_machines() -> None:
    """Emulated hosts (a network namespace each) do not share a machine id, nor does either with this one."""
    first, second = _machine_id("--net"), _machine_id("--net")
    assert len({first, second, default_machine_id()}) == 3


def test_a_container_host_name_namespace_is_another_machine_a_mount_namespace_alone_is_not() -> None:
    """Containers get a host name (UTS) namespace of their own; ``ip netns exec`` (and a sandboxed systemd service)
    gives each command a mount namespace of its own on the same host, which makes no other machine."""
    assert _machine_id("--uts") != default_machine_id()
    assert _machine_id("--mount") == default_machine_id()
