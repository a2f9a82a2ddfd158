"""Which machine a process runs on, as gradcode counts machines: one kernel, seen from one network and host-name
identity.

Workers that share a machine id share cores (the master keeps their backups from computing speculatively), and
only a worker of the master's own machine id is offered the job's shared-memory directory (which it must then
prove it reads: :mod:`gradcode.common.transport.shared_memory`). The Linux boot id alone names a kernel, so every
network
namespace and container on one kernel would count as one machine: emulated hosts (a network namespace each) and
containers that mount one ``/dev/shm`` would exchange payloads through it instead of their network, and hold
their backups back as if they shared cores. Hence the rule of :func:`default_machine_id`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["BOOT_ID", "NAMESPACES", "default_machine_id"]

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
NAMESPACES = ("net", "uts")
"""The namespaces that make a host identity: the network namespace (its addresses and routes: a network
namespace per emulated host) and the UTS namespace (its host name: every container runtime gives a container one
of its own, ``ip netns exec`` and systemd services keep the host's). Not the mount namespace: ``ip netns exec``
makes a new one per command and systemd one per sandboxed service, on the same host; nor the cgroup, which a
benchmark or systemd gives each process."""


def default_machine_id(proc_self: Path = Path("/proc/self")) -> str:
    """This process's machine id: the first 32 hex digits of the SHA-256 of the UTF-8 text
    ``"<boot id>\\nnet:[<inode>]\\nuts:[<inode>]"``, the boot id from ``/proc/sys/kernel/random/boot_id`` and each
    ``<kind>:[<inode>]`` as ``readlink /proc/self/ns/<kind>`` shows the process's namespace (a namespace that is not
    visible is left out, with its line). Processes in one network and UTS namespace of one boot share it (workers on
    one host, in one container or one emulated host); two network namespaces or two containers on one kernel do
    not. Empty (unknown: a machine of its own) where there is no boot id (not Linux).

    ``--machine-id`` / ``GRADCODE_MACHINE_ID`` override it (workers pinned to disjoint cores, or containers that
    truly share a host's cores)."""
    try:
        boot_id = BOOT_ID.read_text().strip()
    except OSError:
        return ""
    if not boot_id:
        return ""
    parts = [boot_id]
    for kind in NAMESPACES:
        try:
            parts.append(os.readlink(proc_self / "ns" / kind))
        except OSError:
            continue
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]
