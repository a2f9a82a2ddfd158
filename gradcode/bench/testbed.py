"""Emulated hosts on one machine: a network namespace, a shaped link and a CPU quota each (issue 28).

An emulated :class:`Host` is

* a **network namespace** ``gcb-<owner pid>-<role>`` with one interface, ``eth0``, holding a private address
  (:data:`SUBNET`, only ever configured inside the testbed's namespaces), whose peer is a port of a bridge that
  lives in a namespace of its own (``gcb-<owner pid>-switch``): the host's own network namespace gets no
  interface, address or route;
* a **link** of ``rate_mbit`` Mbit/s in each direction: a token-bucket filter (``tc qdisc ... tbf``) on the
  host's ``eth0`` (what it sends) and on its port of the bridge (what it receives);
* a **CPU quota** of ``cpu_percent`` % of one core: a cgroup v1 ``cpu`` group (``cpu.cfs_quota_us`` over
  ``cpu.cfs_period_us``) that every process started on the host, and every process those start, belongs to.

A :class:`Testbed` builds its hosts and the switch and removes all of it again (processes, namespaces, cgroups)
when it is closed, also after an exception; :func:`cleanup` removes what a testbed whose owner died left behind,
by the name prefix. Building needs root, ``ip`` and ``tc`` from iproute2, network namespaces and the cgroup v1
``cpu`` controller: :func:`check_available` says precisely which of those is missing.

The module is also a tiny command line, used inside the namespaces for bare TCP transfers (the testbed's
floor, :meth:`Testbed.transfer`) and for the control socket (:meth:`Testbed.forward`)::

    python -m gradcode.bench.testbed receive HOST:PORT CONNECTIONS
    python -m gradcode.bench.testbed send HOST:PORT=BYTES [HOST:PORT=BYTES ...]   (then the start time on stdin)
    python -m gradcode.bench.testbed forward UNIX_PATH HOST:PORT
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from gradcode.common.exceptions import GradcodeError

__all__ = [
    "PREFIX",
    "SUBNET",
    "Host",
    "HostSpec",
    "Testbed",
    "TestbedUnavailableError",
    "check_available",
    "cleanup",
    "leftovers",
]

PREFIX = "gcb-"
"""Every namespace and cgroup a testbed makes is named ``gcb-<owner pid>-...``: what :func:`cleanup` looks for."""
SUBNET = ipaddress.ip_network("10.213.0.0/24")
"""The hosts' addresses (host i: ``.i + 1``), configured inside the testbed's namespaces only."""
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
CPU_PERIOD_US = 10_000
"""A short CFS period (10 ms), so a host at a small quota is throttled often and briefly, not 100 ms at a time."""
BURST_SECONDS = 0.001
"""Token-bucket depth: 1 ms at the link's rate (at least :data:`MIN_BURST_BYTES`)."""
MIN_BURST_BYTES = 16_384
QUEUE_SECONDS = 0.02
"""Packets queue at most 20 ms at a link's rate before the filter drops them (TCP then backs off)."""
SWITCH = "switch"
"""The bridge's namespace is ``gcb-<owner pid>-switch`` (so no host may take that role)."""
INTERFACE = "eth0"
"""Each host's one interface (in its own namespace; the bridge's port for it is ``p-<role>``)."""


class TestbedUnavailableError(GradcodeError, RuntimeError):
    """This machine (or this user) cannot build emulated hosts; the message says what is missing."""


@dataclass(frozen=True)
class HostSpec:
    """One emulated host: its role (a short name), its link's rate each way and its CPU quota."""

    role: str
    rate_mbit: float
    cpu_percent: float

    def __post_init__(self) -> None:
        if not self.role or len(self.role) > 8 or not self.role.replace("-", "").isalnum():
            raise ValueError(f"role must be 1-8 letters, digits or '-', not {self.role!r}.")
        if not self.rate_mbit > 0:
            raise ValueError(f"rate_mbit must be > 0, not {self.rate_mbit}.")
        if not 0 < self.cpu_percent <= 100 * (os.cpu_count() or 1):
            raise ValueError(
                f"cpu_percent must be in (0, {100 * (os.cpu_count() or 1)}] (this machine's cores x 100), "
                f"not {self.cpu_percent}."
            )


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a configuration command; on failure, raise with the command and what it printed."""
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done


def check_available() -> None:
    """Raise :class:`TestbedUnavailableError` naming what is missing: root, ``ip``/``tc``, namespaces, cpu cgroup."""
    if os.geteuid() != 0:
        raise TestbedUnavailableError(
            f"the emulated cluster needs root (network namespaces, tc and cgroups); this is uid {os.geteuid()}."
        )
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise TestbedUnavailableError(f"the emulated cluster needs `{tool}` (iproute2) on PATH; it was not found.")
    if not (CPU_CGROUP / "cpu.cfs_quota_us").is_file():
        raise TestbedUnavailableError(
            f"the emulated cluster needs the cgroup v1 cpu controller at {CPU_CGROUP} (cpu.cfs_quota_us); "
            "it is not mounted here."
        )
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _run(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        raise TestbedUnavailableError(f"cannot create a network namespace (`ip netns add`): {made.stderr.strip()}")
    _run(["ip", "netns", "del", probe], check=False)


def _owner(name: str) -> int | None:
    """The owner pid in a ``gcb-<pid>-...`` name (None if the name is not one of ours)."""
    if not name.startswith(PREFIX):
        return None
    head = name[len(PREFIX) :].split("-", 1)[0]
    return int(head) if head.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces() -> list[str]:
    listed = _run(["ip", "netns", "list"], check=False).stdout.split("\n")
    return [line.split()[0] for line in listed if line.strip()]


def _cgroups() -> list[str]:
    return sorted(p.name for p in CPU_CGROUP.iterdir() if p.is_dir()) if CPU_CGROUP.is_dir() else []


def leftovers(*, owner: int | None = None) -> dict[str, list[str]]:
    """The testbed namespaces and cpu cgroups on this machine: of ``owner``, or of every owner when None."""

    def ours(name: str) -> bool:
        pid = _owner(name)
        return pid is not None and (owner is None or pid == owner)

    return {
        "namespaces": [n for n in _namespaces() if ours(n)],
        "cgroups": [c for c in _cgroups() if ours(c)],
    }


def _kill_all(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _cgroup_pids(name: str) -> list[int]:
    procs = CPU_CGROUP / name / "cgroup.procs"
    with contextlib.suppress(OSError):
        return [int(x) for x in procs.read_text().split()]
    return []


def _remove_cgroup(name: str) -> None:
    """Kill what is left in cgroup ``name``, then remove it (a cgroup goes only once it is empty)."""
    path = CPU_CGROUP / name
    for _ in range(100):
        _kill_all(_cgroup_pids(name))
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"cgroup {path} still holds processes {_cgroup_pids(name)} after SIGKILL")


def _remove_namespace(name: str) -> None:
    """Kill every process in namespace ``name``, then delete it (its interfaces go with it)."""
    pids = _run(["ip", "netns", "pids", name], check=False).stdout.split()
    _kill_all([int(p) for p in pids if p.isdigit()])
    _run(["ip", "netns", "del", name], check=False)


def cleanup() -> dict[str, list[str]]:
    """Remove the namespaces and cgroups (and the processes in them) of testbeds whose owner process is gone;
    return what was removed and, under ``kept``, what belongs to a running owner."""
    found = leftovers()
    removed: dict[str, list[str]] = {"namespaces": [], "cgroups": [], "kept": []}
    for kind, names in found.items():
        for name in names:
            pid = _owner(name)
            if pid is not None and pid != os.getpid() and _alive(pid):
                removed["kept"].append(name)
                continue
            (_remove_cgroup if kind == "cgroups" else _remove_namespace)(name)
            removed[kind].append(name)
    return removed


@dataclass
class Host:
    """A built emulated host (see the module docstring): run processes on it, read its interface's counters."""

    spec: HostSpec
    namespace: str
    address: str
    cgroup: str

    @property
    def role(self) -> str:
        return self.spec.role

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as run on this host: in its cgroup from the first instruction (the shell joins it, then
        execs), in its network namespace (``ip netns exec``)."""
        procs = CPU_CGROUP / self.cgroup / "cgroup.procs"
        script = f'echo $$ > {procs} && exec ip netns exec {self.namespace} "$@"'
        return ["sh", "-c", script, "sh", *argv]

    def popen(self, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[str]:
        """Start ``argv`` on this host (text mode); :meth:`Testbed.close` kills it if it is still running."""
        return subprocess.Popen(self.command(argv), text=True, **kwargs)  # type: ignore[call-overload,no-any-return]

    def interface_bytes(self) -> tuple[int, int]:
        """Bytes received and sent so far by this host's interface (whole frames: headers included)."""
        shown = json.loads(_run(["ip", "-n", self.namespace, "-j", "-s", "link", "show", INTERFACE]).stdout)
        stats = shown[0]["stats64"]
        return int(stats["rx"]["bytes"]), int(stats["tx"]["bytes"])

    def throttled_seconds(self) -> float:
        """Seconds the quota has held this host's processes back so far (``cpu.stat`` throttled_time)."""
        for line in (CPU_CGROUP / self.cgroup / "cpu.stat").read_text().splitlines():
            key, value = line.split()
            if key == "throttled_time":
                return int(value) / 1e9
        return float("nan")


class Testbed:
    """Emulated hosts on one bridge (see the module docstring). Use as a context manager: everything it made is
    removed on exit, on an exception, and on SIGTERM/SIGHUP (turned into SystemExit while it is open)."""

    def __init__(self, hosts: Sequence[HostSpec], *, cpu_period_us: int = CPU_PERIOD_US) -> None:
        roles = [h.role for h in hosts]
        if not hosts or len(set(roles)) != len(roles) or SWITCH in roles:
            raise ValueError(f"hosts must be a non-empty list with distinct roles other than {SWITCH!r}, not {roles}.")
        if len(hosts) > SUBNET.num_addresses - 3:
            raise ValueError(f"at most {SUBNET.num_addresses - 3} hosts fit in {SUBNET}, not {len(hosts)}.")
        if not 1000 <= cpu_period_us <= 1_000_000:
            raise ValueError(f"cpu_period_us must be in [1000, 1000000], not {cpu_period_us}.")
        self.specs = list(hosts)
        self.cpu_period_us = cpu_period_us
        self.tag = f"{PREFIX}{os.getpid()}"
        self.switch = f"{self.tag}-{SWITCH}"
        self.hosts: dict[str, Host] = {}
        self._processes: list[subprocess.Popen[str]] = []
        self._previous_handlers: dict[int, object] = {}
        self._built = False

    # ---- building -----------------------------------------------------------------------------------------
    def build(self) -> Testbed:
        """Make the switch and every host; on any failure, remove what was made and re-raise."""
        check_available()
        if any(leftovers(owner=os.getpid()).values()):
            raise RuntimeError(
                f"this process already has a testbed ({leftovers(owner=os.getpid())}); close it first: the names "
                f"{self.tag}-... are one testbed's"
            )
        self._trap_signals()
        try:
            _run(["ip", "netns", "add", self.switch])
            self._built = True
            _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
            for index, spec in enumerate(self.specs):
                self.hosts[spec.role] = self._build_host(index, spec)
        except BaseException:
            self.close()
            raise
        return self

    def _build_host(self, index: int, spec: HostSpec) -> Host:
        namespace, cgroup = f"{self.tag}-{spec.role}", f"{self.tag}-{spec.role}"
        address = str(SUBNET.network_address + index + 1)
        port = f"p-{spec.role}"
        _run(["ip", "netns", "add", namespace])
        ns, sw = ["ip", "-n", namespace], ["ip", "-n", self.switch]
        _run([*sw, "link", "add", port, "type", "veth", "peer", "name", INTERFACE, "netns", namespace])
        _run([*sw, "link", "set", port, "master", "br0", "up"])
        _run([*ns, "addr", "add", f"{address}/{SUBNET.prefixlen}", "dev", INTERFACE])
        _run([*ns, "link", "set", INTERFACE, "up"])
        _run([*ns, "link", "set", "lo", "up"])
        for where, device in ((namespace, INTERFACE), (self.switch, port)):
            _run(["ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", device, "root", *_tbf(spec.rate_mbit)])
        path = CPU_CGROUP / cgroup
        path.mkdir()
        (path / "cpu.cfs_period_us").write_text(str(self.cpu_period_us))
        (path / "cpu.cfs_quota_us").write_text(str(max(1000, round(self.cpu_period_us * spec.cpu_percent / 100))))
        return Host(spec, namespace, address, cgroup)

    # ---- using ----------------------------------------------------------------------------------------------
    def popen(self, role: str, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[str]:
        """Start ``argv`` on host ``role``; killed at :meth:`close` if still running."""
        process = self.hosts[role].popen(argv, **kwargs)
        self._processes.append(process)
        return process

    def transfer(self, flows: Sequence[tuple[str, str, int]], *, port: int = 47000, timeout: float = 300.0) -> float:
        """Move ``bytes`` over plain TCP for every ``(source role, destination role, bytes)`` at once; the seconds
        from the common start to the last byte received (the floor of moving those bytes over these links)."""
        return max(self.transfer_ends(flows, port=port, timeout=timeout).values())

    def transfer_ends(
        self, flows: Sequence[tuple[str, str, int]], *, port: int = 47000, timeout: float = 300.0
    ) -> dict[str, float]:
        """:meth:`transfer`, with the seconds from the common start to the last byte each destination received."""
        if not flows:
            raise ValueError("transfer needs at least one (source, destination, bytes) flow.")
        incoming: dict[str, int] = {}
        for _, destination, _ in flows:
            incoming[destination] = incoming.get(destination, 0) + 1
        receivers = {
            role: self.popen(
                role, [*_SELF, "receive", f"{self.hosts[role].address}:{port}", str(count)], stdout=subprocess.PIPE
            )
            for role, count in incoming.items()
        }
        for role, process in receivers.items():
            assert process.stdout is not None
            if process.stdout.readline().strip() != "listening":
                raise RuntimeError(f"the bare receiver on {role} did not start (exit {process.wait()})")
        by_source: dict[str, list[str]] = {}
        for source, destination, size in flows:
            by_source.setdefault(source, []).append(f"{self.hosts[destination].address}:{port}={size}")
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
        senders = [self.popen(role, [*_SELF, "send", *targets], **pipes) for role, targets in by_source.items()]
        for sender in senders:  # every sender started and connected: process start-up is not part of the floor
            assert sender.stdout is not None
            if sender.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a bare sender did not connect (exit {sender.wait()})")
        start = time.monotonic() + 0.05  # then all start sending at once
        for sender in senders:
            assert sender.stdin is not None
            sender.stdin.write(f"{start!r}\n")
            sender.stdin.close()
        ends: dict[str, float] = {}
        for role, process in receivers.items():
            out, _ = process.communicate(timeout=timeout)
            if process.returncode != 0:
                raise RuntimeError(f"the bare receiver on {role} failed (exit {process.returncode})")
            ends[role] = float(out.split()[-1]) - start
        for sender in senders:
            assert sender.stdout is not None
            sender.stdout.close()
            if sender.wait(timeout) != 0:
                raise RuntimeError(f"a bare sender failed (exit {sender.returncode})")
        return ends

    def forward(self, role: str, unix_path: Path, port: int) -> None:
        """Serve ``unix_path`` (a socket file on this machine) as a tunnel to ``port`` of host ``role``: how a
        client outside the namespaces reaches a server inside without a route from the host's namespace."""
        process = self.popen(role, [*_SELF, "forward", str(unix_path), f"{self.hosts[role].address}:{port}"])
        deadline = time.monotonic() + 30
        while not unix_path.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the control tunnel to {role} did not start (exit {process.poll()})")
            time.sleep(0.02)

    def describe(self) -> list[dict[str, object]]:
        """Each host: role, address, link rate and CPU quota (what a results file records)."""
        return [
            {"role": h.role, "address": h.address, "rate_mbit": h.spec.rate_mbit, "cpu_percent": h.spec.cpu_percent}
            for h in self.hosts.values()
        ]

    # ---- removing -----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every process started on the hosts, remove every cgroup and namespace; idempotent."""
        try:
            for process in self._processes:
                if process.poll() is None:
                    process.kill()
            for process in self._processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(5)
                for pipe in (process.stdin, process.stdout, process.stderr):
                    if pipe is not None:
                        with contextlib.suppress(OSError):
                            pipe.close()
            self._processes.clear()
            if self._built:
                found = leftovers(owner=os.getpid())
                for name in found["cgroups"]:
                    _remove_cgroup(name)
                for name in found["namespaces"]:
                    if name != self.switch:
                        _remove_namespace(name)
                _remove_namespace(self.switch)
                self._built = False
            self.hosts.clear()
        finally:
            self._restore_signals()

    def _trap_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def leave(signum: int, frame: object) -> None:
            raise SystemExit(128 + signum)

        for signum in (signal.SIGTERM, signal.SIGHUP):
            self._previous_handlers[signum] = signal.signal(signum, leave)

    def _restore_signals(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._previous_handlers.clear()

    def __enter__(self) -> Testbed:
        return self.build()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _tbf(rate_mbit: float) -> list[str]:
    """The ``tc`` arguments of a token bucket at ``rate_mbit`` Mbit/s (bucket 1 ms, queue 20 ms)."""
    bytes_per_second = rate_mbit * 1e6 / 8
    burst = max(MIN_BURST_BYTES, round(bytes_per_second * BURST_SECONDS))
    limit = burst + round(bytes_per_second * QUEUE_SECONDS)
    return ["tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst), "limit", str(limit)]


_SELF = [sys.executable, "-m", "gradcode.bench.testbed"]


# ---- the command line run inside the namespaces ------------------------------------------------------------
def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def _receive(address: str, connections: int) -> None:
    """Accept ``connections`` senders, drain each; print the monotonic time the last byte arrived."""
    with socket.create_server(_split(address), backlog=connections) as server:
        print("listening", flush=True)
        ends: list[float] = []

        def drain(conn: socket.socket) -> None:
            with conn:
                buffer = bytearray(1 << 20)
                while conn.recv_into(buffer):
                    pass
            ends.append(time.monotonic())

        threads = []
        for _ in range(connections):
            conn, _peer = server.accept()
            thread = threading.Thread(target=drain, args=(conn,))
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
    print(max(ends), flush=True)


def _send(targets: Sequence[str]) -> None:
    """Connect to every ``HOST:PORT=BYTES`` target, print ``ready``, read the monotonic start time from standard
    input, wait for it, then send to every target at once."""
    payload = bytes(1 << 20)
    plan = []
    for target in targets:
        address, _, size = target.rpartition("=")
        plan.append((socket.create_connection(_split(address)), int(size)))

    def push(conn: socket.socket, size: int) -> None:
        with conn:
            view = memoryview(payload)
            while size > 0:
                size -= conn.send(view[: min(size, len(payload))])
            conn.shutdown(socket.SHUT_WR)
            conn.recv(1)  # the receiver closes once it has drained everything

    print("ready", flush=True)
    start = float(sys.stdin.readline())
    time.sleep(max(0.0, start - time.monotonic()))
    threads = [threading.Thread(target=push, args=item) for item in plan]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


async def _forward(unix_path: str, address: str) -> None:
    """Relay every connection to ``unix_path`` to ``address`` (and back) until killed."""
    host, port = _split(address)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    server = await asyncio.start_unix_server(relay, path=unix_path)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["receive"] and len(args) == 3:
        _receive(args[1], int(args[2]))
    elif args[:1] == ["send"] and len(args) >= 2:
        _send(args[1:])
    elif args[:1] == ["forward"] and len(args) == 3:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_forward(args[1], args[2]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
