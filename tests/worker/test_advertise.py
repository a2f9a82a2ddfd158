"""What a worker without --advertise tells the master to reach it at: its listen host when that is one address
(loopback only then), else the address of its interface towards the master (of the default route's when the master
is on loopback), loopback only where there is nothing else; ``auto`` keeps the hostname."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

from gradcode.common.transport.serving import is_loopback, source_address
from gradcode.worker.node import advertised_address, dns_name, worker_name

PORT = 50061


def test_a_worker_on_every_interface_advertises_its_address_towards_the_master_not_loopback() -> None:
    outside = source_address(None)  # this machine's default route's interface
    if outside is None:
        pytest.skip("this machine has no default route: nothing but loopback to advertise")
    assert not is_loopback(outside)
    # A master on this host, on loopback: the worker listens everywhere, so it advertises its outside address.
    assert advertised_address("0.0.0.0", PORT, "127.0.0.1:50050") == f"{outside}:{PORT}"
    assert advertised_address("::", PORT, "localhost:50050") == f"{outside}:{PORT}"
    assert advertised_address("0.0.0.0", PORT, f"{outside}:50050") == f"{outside}:{PORT}"
    assert advertised_address("0.0.0.0", PORT, None) == f"{outside}:{PORT}"


def test_a_worker_on_one_address_advertises_it_and_auto_the_hostname() -> None:
    assert advertised_address("127.0.0.1", PORT, "192.0.2.50:50050") == f"127.0.0.1:{PORT}"  # loopback only there
    assert advertised_address("::1", PORT, "192.0.2.50:50050") == f"[::1]:{PORT}"
    assert advertised_address("0.0.0.0", PORT, "127.0.0.1:50050", "auto") == f"{socket.gethostname()}:{PORT}"
    assert advertised_address("0.0.0.0", PORT, "127.0.0.1:50050", "AUTO") == f"{socket.gethostname()}:{PORT}"
    assert advertised_address("0.0.0.0", PORT, "127.0.0.1:50050", "w.example:7") == "w.example:7"


def test_a_worker_in_a_namespace_with_loopback_alone_advertises_loopback() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs root, util-linux's unshare and iproute2's ip to make a network namespace")
    script = textwrap.dedent("""
        from gradcode.worker.node import advertised_address
        advertised = advertised_address("0.0.0.0", 50061, "127.0.0.1:50050")
        print(advertised == "127.0.0.1:50061", advertised)
    """)
    done = subprocess.run(
        ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", sys.executable, "-c", script],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "True", done.stdout


def test_a_worker_named_auto_takes_the_name_its_address_resolves_back_to() -> None:
    """docker-compose names a replica's container ``<project>-worker-<n>`` in its network's DNS, while its hostname
    is the container id: ``--name auto`` registers the former (issue 30). Here: loopback's name, from /etc/hosts."""
    assert dns_name("127.0.0.1") == socket.gethostbyaddr("127.0.0.1")[0].split(".")[0]
    assert dns_name("no-such-host.invalid") is None
    assert worker_name("w-3") == "w-3" and worker_name(None) == socket.gethostname()
    assert worker_name("auto") == (dns_name(socket.gethostname()) or socket.gethostname())
