"""The emulated cluster of ``gradcode bench cluster`` (issue 28): 4 hosts build, shape their links, run a
CodedReduce tree job exactly with its payloads on the emulated network, and leave nothing behind — also after
an exception and after SIGTERM. Needs root and ``ip netns`` (CI runs as root); skipped, saying why, otherwise.
The refusal without root is checked everywhere."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gradcode.bench import cluster
from gradcode.bench import testbed as testbed_module  # (its classes are named Testbed...: not test classes)
from gradcode.bench.cluster import EmulatedCluster, _spread
from gradcode.bench.output import OOM_KILL_MARK, new_oom_kills, oom_kills
from gradcode.bench.testbed import CPU_CGROUP, PREFIX, HostSpec, check_available, cleanup, leftovers
from gradcode.client.sdk import GradcodeClient, build_job_spec
from gradcode.common.codes.registry import make_code
from gradcode.common.sim.plan import read_history
from gradcode.common.sim.simulate import broadcast_spread
from gradcode.v1 import master_pb2


def _unavailable() -> str | None:
    try:
        check_available()
    except testbed_module.TestbedUnavailableError as error:
        return str(error)
    return None


needs_testbed = pytest.mark.skipif(_unavailable() is not None, reason=f"no emulated hosts here: {_unavailable()}")

SLOW_MBIT, FAST_MBIT = 40.0, 400.0
HOSTS = [HostSpec("m", SLOW_MBIT, 50), HostSpec("w0", FAST_MBIT, 40), HostSpec("w1", FAST_MBIT, 40),
         HostSpec("w2", FAST_MBIT, 40)]  # fmt: skip
EXACT = 1e-9


def _alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _everything_of(testbed: testbed_module.Testbed) -> tuple[list[str], list[int]]:
    """The testbed's namespaces and cgroups by name, and every process in its cgroups."""
    names = [h.namespace for h in testbed.hosts.values()] + [testbed.switch]
    pids = [
        int(p) for h in testbed.hosts.values() for p in (CPU_CGROUP / h.cgroup / "cgroup.procs").read_text().split()
    ]
    return names, pids


def _assert_gone(names: list[str], pids: list[int], owner: int) -> None:
    assert leftovers(owner=owner) == {"namespaces": [], "cgroups": []}
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not [name for name in names if name in listed]
    assert not [pid for pid in pids if _alive(pid)]


def test_without_root_the_testbed_refuses_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(testbed_module.os, "geteuid", lambda: 1000)
    with pytest.raises(testbed_module.TestbedUnavailableError, match=r"needs root .* this is uid 1000"):
        check_available()
    with pytest.raises(testbed_module.TestbedUnavailableError, match="needs root"):
        testbed_module.Testbed(HOSTS).build()


def test_the_command_refuses_without_root_with_status_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(testbed_module.os, "geteuid", lambda: 1000)
    assert cluster.main(["--quick"]) == 2
    assert "gradcode bench cluster: the emulated cluster needs root" in capsys.readouterr().err


@pytest.mark.parametrize("n", [6, 12, 24])
def test_each_n_compares_a_tree_of_the_size_its_code_has(n: int) -> None:
    systems = {s.scheme: s for s in cluster.systems_for(n)}
    assert list(systems) == ["uncoded", "fractional", "binary", "coded_reduce", "allreduce"]
    tree = systems["coded_reduce"]
    code = make_code("coded_reduce", **tree.code_params)
    assert tree.workers == code.tree.num_workers <= n and tree.first_layer == tree.code_params["n"]
    assert all(s.workers == s.first_layer == n for name, s in systems.items() if name != "coded_reduce")


def test_flat_codes_run_once_per_surplus_mode_and_systems_can_be_picked() -> None:
    picked = cluster.systems_for(6, ("push", "hold"), ("uncoded", "fractional"))
    assert [(s.name, s.surplus) for s in picked] == [
        ("uncoded", ""),
        ("fractional s=1 push", "push"),
        ("fractional s=1 hold", "hold"),
    ]
    assert [s.scheme for s in cluster.systems_for(6)] == list(cluster.SCHEMES)


def test_gradcode_systems_run_once_per_model_delivery() -> None:
    picked = cluster.systems_for(6, ("hold",), ("uncoded", "fractional", "coded_reduce"), ("direct", "relay"))
    assert [(s.name, s.surplus, s.model_delivery) for s in picked] == [
        ("uncoded direct", "", "direct"),
        ("uncoded relay", "", "relay"),
        ("fractional s=1 hold direct", "hold", "direct"),
        ("fractional s=1 hold relay", "hold", "relay"),
        ("tree n=2 L=2 direct", "", "direct"),
        ("tree n=2 L=2 relay", "", "relay"),
    ]


def test_flat_codes_run_once_per_s_and_trees_once_per_shape_asked_for() -> None:
    picked = cluster.systems_for(
        24, schemes=("fractional", "coded_reduce"), deliveries=("relay",), redundancy=(1, 11), trees=[(2, 3), (2, 2)]
    )
    assert [(s.name, s.workers, s.first_layer, s.code_params) for s in picked] == [
        ("fractional s=1 relay", 24, 24, {"n": 24, "s": 1}),
        ("fractional s=11 relay", 24, 24, {"n": 24, "s": 11}),
        ("tree n=2 L=3 relay", 14, 2, {"n": 2, "s": 1, "L": 3}),
        ("tree n=2 L=2 relay", 6, 2, {"n": 2, "s": 1, "L": 2}),
    ]
    assert cluster.systems_for(5, schemes=("coded_reduce",)) == []  # no default tree at n = 5
    assert [s.name for s in cluster.systems_for(5, schemes=("coded_reduce",), trees=[(2, 2)])] == ["tree n=2 L=2"]


@pytest.mark.parametrize(("text", "shape"), [("4x2", (4, 2)), ("2x3", (2, 3)), ("10x1", (10, 1))])
def test_a_tree_shape_is_children_by_layers(text: str, shape: tuple[int, int]) -> None:
    assert cluster.tree_shape(text) == shape


@pytest.mark.parametrize("text", ["4", "1x2", "4x0", "x2", "4x", "4*2", "-2x2", "2x2x2"])
def test_a_tree_shape_that_is_not_one_is_refused_with_the_form_it_takes(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="give CHILDRENxLAYERS, children per parent >= 2"):
        cluster.tree_shape(text)


def test_a_run_refuses_a_configuration_its_code_refuses_before_building_anything() -> None:
    with pytest.raises(ValueError, match=r"fractional s=4 at n = 24: .*valid values are \[0, 1, 2, 3, 5, 7, 11, 23\]"):
        cluster.run(ns=[24], schemes=["fractional"], redundancy=[4])
    with pytest.raises(ValueError, match="tree n=2 L=0 at n = 6"):
        cluster.run(ns=[6], schemes=["coded_reduce"], trees=[(2, 0)])
    with pytest.raises(ValueError, match=r"Nothing to compare at n = 5: \['coded_reduce'\] has no system there"):
        cluster.run(ns=[5], schemes=["coded_reduce"])


def test_a_run_of_several_tree_shapes_at_one_n_plots_each_shape_on_its_own_line() -> None:
    def entry(n: int, children: int, layers: int, way: str = "relay") -> dict[str, Any]:
        system = f"tree n={children} L={layers} {way}"
        return {"n": n, "scheme": "coded_reduce", "system": system, "code_params": {"n": children, "s": 1, "L": layers}}

    one_per_n = [entry(6, 2, 2), entry(24, 4, 2), entry(24, 4, 2, "direct")]
    several = [entry(24, 4, 2), entry(24, 2, 3), entry(24, 2, 2)]
    assert not cluster._several_shapes(one_per_n) and cluster._several_shapes(several)
    assert [cluster._series(e, by_shape=True) for e in several] == [
        "tree n=4 L=2 relay", "tree n=2 L=3 relay", "tree n=2 L=2 relay"
    ]  # fmt: skip


def test_odd_rounds_run_the_jobs_in_the_reverse_order() -> None:
    systems = cluster.systems_for(6, schemes=("uncoded", "fractional"))
    even, odd = cluster._order(0, systems), cluster._order(1, systems)
    names = ["uncoded", "fractional s=1"]
    assert [(k, s.name) for k, s in even] == [(k, name) for k in (0, 1) for name in names]
    assert odd == even[::-1] and cluster._order(2, systems) == even


def test_a_run_refuses_a_model_without_features_before_building_anything() -> None:
    with pytest.raises(ValueError, match="features must be at least 1, not 0"):
        cluster.run(ns=[6], features=0)


def test_host_specs_refuse_what_cannot_be_built() -> None:
    with pytest.raises(ValueError, match="rate_mbit must be > 0"):
        HostSpec("m", 0, 50)
    with pytest.raises(ValueError, match=r"cpu_percent must be in \(0, "):
        HostSpec("m", 10, 0)
    with pytest.raises(ValueError, match="role must be 1-8 letters"):
        HostSpec("a host", 10, 10)
    with pytest.raises(ValueError, match="distinct roles"):
        testbed_module.Testbed([HostSpec("m", 10, 10), HostSpec("m", 10, 10)])
    with pytest.raises(ValueError, match="other than 'switch'"):
        testbed_module.Testbed([HostSpec("switch", 10, 10)])


@pytest.mark.e2e
@needs_testbed
def test_four_hosts_shape_their_links_run_a_tree_exactly_and_leave_nothing(tmp_path: Path) -> None:
    size = 2_000_000
    with testbed_module.Testbed(HOSTS) as testbed:
        # The master's link at 40 Mbit/s: 2 MB take at least (2 MB - one bucket) / rate; the workers' are faster.
        slow = testbed.transfer([("w0", "m", size)])
        fast = testbed.transfer([("w1", "w2", size)])
        burst = testbed_module.MIN_BURST_BYTES
        assert slow >= (size - burst) * 8 / (SLOW_MBIT * 1e6), slow
        assert fast >= (size - burst) * 8 / (FAST_MBIT * 1e6), fast
        assert fast < slow / 2, (fast, slow)
        # Two at once out of the master: each destination's end, the last no earlier than both through its link.
        ends = testbed.transfer_ends([("m", "w1", size), ("m", "w2", size)])
        assert sorted(ends) == ["w1", "w2"] and min(ends.values()) > 0, ends
        assert max(ends.values()) >= (2 * size - burst) * 8 / (SLOW_MBIT * 1e6), ends
        assert 0 <= broadcast_spread(list(ends.values())) <= 1
        # what the benchmark records for the simulator: one model's burst to each of the row's first layer
        assert 0 <= _spread(testbed, ["w1", "w2"], size // 4) <= 1
        assert _spread(testbed, ["w1"], size // 4) == 0.0

        with pytest.raises(RuntimeError, match="already has a testbed"):
            testbed_module.Testbed(HOSTS[:1]).build()  # would share (and on failure remove) the open one's names
        assert len(leftovers(owner=os.getpid())["namespaces"]) == len(HOSTS) + 1

        with EmulatedCluster(testbed, tmp_path, workers_per_host=2) as cluster:
            reports, received = asyncio.run(_tree_job(cluster))
            names, pids = _everything_of(testbed)
            cluster.copy_histories(tmp_path / "histories")
    assert [r.iteration for r in reports] == [1, 2, 3, 4]
    # the job's history and spec, as `--histories` keeps them: every node's response and its own account of it
    (history,) = (tmp_path / "histories").glob("*.jsonl")
    kept, spec = read_history(history)
    assert [r["iteration"] for r in kept] == [1, 2, 3, 4] and spec is not None
    assert all(t["compute_seconds"] > 0 for r in kept for t in [*r["timings"], *r["child_timings"]])
    for r in reports:
        assert r.exact and 0 <= r.verify_error <= EXACT, (r.iteration, r.verify_error)
    # At least the one first-layer message the master decodes from per iteration (p = 1000 float64) crossed the
    # master's emulated link: payloads do not go through the shared /dev/shm.
    assert received >= 4 * 1000 * 8, received
    assert len(pids) >= 8  # master, its control relay, six workers
    _assert_gone(names, pids, os.getpid())


async def _tree_job(cluster: EmulatedCluster) -> tuple[list[master_pb2.IterationReport], int]:
    async with GradcodeClient(cluster.client_address) as client:
        await client.wait_ready(60)
        ids = await cluster.pool_ids(client, 60)
        spec = build_job_spec(
            scheme="coded_reduce", code_params={"n": 2, "s": 1, "L": 2}, model="linear", dataset="linear",
            num_samples=24, num_features=999, iterations=4, learning_rate=1e-3, verify=True,
        )  # fmt: skip
        spec.worker_ids[:] = [ids[a] for a in cluster.worker_addresses]
        before = cluster.master_bytes()[0]
        info, reports = await client.run(spec)
        assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
        return reports, cluster.master_bytes()[0] - before


@pytest.mark.e2e
@needs_testbed
def test_an_exception_inside_removes_everything() -> None:
    with pytest.raises(RuntimeError, match="inside"), testbed_module.Testbed(HOSTS[:2]) as testbed:
        testbed.popen("w0", ["sleep", "60"])
        names, _ = _everything_of(testbed)
        time.sleep(0.2)  # the shell has joined the cgroup and exec'd
        _, pids = _everything_of(testbed)
        raise RuntimeError("inside")
    assert pids
    _assert_gone(names, pids, os.getpid())


_OWNER = """
import sys, time
from gradcode.bench.testbed import HostSpec, Testbed
with Testbed([HostSpec("m", 100, 20), HostSpec("w0", 100, 20)]) as testbed:
    testbed.popen("w0", ["sleep", "60"])
    print("built", flush=True)
    time.sleep(60)
"""


@pytest.mark.e2e
@needs_testbed
def test_sigterm_removes_everything_and_cleanup_removes_a_killed_owners_leftovers() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with subprocess.Popen([sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, text=True, env=env) as owner:
            assert owner.stdout is not None and owner.stdout.readline().strip() == "built"
            made = leftovers(owner=owner.pid)
            assert len(made["namespaces"]) == 3 and len(made["cgroups"]) == 2, made
            procs = [CPU_CGROUP / name / "cgroup.procs" for name in made["cgroups"]]
            pids = [int(p) for path in procs for p in path.read_text().split()]
            owner.send_signal(signum)
            owner.wait(30)
        if signum == signal.SIGKILL:  # nothing ran in the owner: its leftovers stay until --cleanup
            assert leftovers(owner=owner.pid) == made
            removed = cleanup()
            assert set(made["namespaces"]) <= set(removed["namespaces"])
            assert set(made["cgroups"]) <= set(removed["cgroups"])
        names = [*made["namespaces"], *made["cgroups"]]
        assert all(name.startswith(f"{PREFIX}{owner.pid}-") for name in names)
        _assert_gone(names, pids, owner.pid)


def test_the_plot_draws_one_line_per_system_and_a_tree_one_per_model_delivery() -> None:
    """A tree's size changes with n, so its rows share a line by their system without the size: before, every way
    of delivering the model ended on one line that zig-zagged between them."""
    rows = [
        {"scheme": "coded_reduce", "system": "tree n=2 L=2 relay"},
        {"scheme": "coded_reduce", "system": "tree n=4 L=2 relay"},
        {"scheme": "coded_reduce", "system": "tree n=4 L=2 direct"},
        {"scheme": "coded_reduce", "system": "tree n=3 L=2"},
        {"scheme": "fractional", "system": "fractional s=1 relay"},
    ]
    assert [cluster._series(r) for r in rows] == [
        "tree relay", "tree relay", "tree direct", "tree", "fractional s=1 relay"
    ]  # fmt: skip


@pytest.mark.e2e
@needs_testbed
def test_a_run_that_dies_keeps_the_rows_it_measured_and_its_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``cluster.partial.json`` holds the rows after each one: a run that dies halfway (the OOM killer ended one 45
    minutes in, its rows only in its log) keeps what it measured, and ``cluster.failed`` the processes' logs and
    the jobs' histories (the run directory goes with the testbed: a run that failed on 2026-11-29 took the
    evidence of why with it). The testbed and the cluster are real; the measuring is cut to one row and a crash."""
    measured = [{"n": 2, "system": "uncoded", "median_ms": 12.5}]

    async def one_row_then_dies(*args: object, on_row: Any, **kwargs: object) -> None:
        on_row(measured, {"uncoded, n=2": 0.0})
        raise RuntimeError("killed halfway")

    monkeypatch.setattr(cluster, "_measure", one_row_then_dies)
    with pytest.raises(RuntimeError, match="halfway"):
        cluster.run(ns=[2], iterations=6, out=tmp_path, schemes=["uncoded"])
    saved = json.loads((tmp_path / "cluster.partial.json").read_text())
    assert saved == {"verify_max_error": {"uncoded, n=2": 0.0}, "rows": measured}
    assert not (tmp_path / "cluster.json").exists()
    logs = tmp_path / "cluster.failed" / "logs"
    assert (logs / "master.log").is_file() and len(list(logs.glob("*.log"))) >= 3, sorted(logs.iterdir())
    assert f"kept in {tmp_path / 'cluster.failed'}" in capsys.readouterr().err


def test_the_kills_of_the_oom_killer_are_read_from_the_kernels_log_and_new_ones_told_apart() -> None:
    kills = oom_kills()
    assert kills is None or all(OOM_KILL_MARK in line for line in kills)  # (None: no dmesg, or not permitted)
    before = ["[1.0] Out of memory: Killed process 10 (python)"]
    after = [*before, "[2.0] Out of memory: Killed process 11 (python)"]
    assert new_oom_kills(before, after) == after[1:] and new_oom_kills(after, after) == []
    assert new_oom_kills(None, after) is None and new_oom_kills(before, None) is None


def test_a_rows_computing_is_the_median_the_workers_said_and_none_when_none_said() -> None:
    from gradcode.v1 import master_pb2

    def report(*seconds: float) -> master_pb2.IterationReport:
        timings = [master_pb2.WorkerTiming(worker_id=w, seconds=1.0, compute_seconds=c) for w, c in enumerate(seconds)]
        return master_pb2.IterationReport(timings=timings)

    assert cluster._median_compute([report(0.1, 0.3), report(0.2, 0.0)]) == pytest.approx(0.2)  # 0: not said
    assert math.isnan(cluster._median_compute([report(0.0)])) and math.isnan(cluster._median_compute([]))
