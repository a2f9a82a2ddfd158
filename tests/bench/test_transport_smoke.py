"""Smoke test of ``python -m gradcode.bench.transport --quick``: real worker, master and cluster processes on loopback,
every stage of the benchmark runs and saves its outputs. No timing is asserted, only that every figure
is there and positive."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gradcode.bench import transport
from gradcode.common.transport.wire import chunk_bytes_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STREAMING_FIELDS = (
    "total_s", "compute_s", "transport_s", "transport_GBps", "raw_grpc_s", "raw_grpc_GBps", "loopback_s",
    "loopback_GBps", "memcpy_s", "memcpy_GBps", "ratio_raw_grpc", "ratio_loopback", "ratio_memcpy", "codec_s",
)  # fmt: skip
ITERATION_FIELDS = ("wall_s", "decode_s", "gather_s", "period_s", "compute_s", "overhead_s", "overhead_rtts")


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_quick_transport_benchmark_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    transport.main(["--quick", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    titles = ("Gradient streaming", "Where the transport time goes", "Chunk size", "TLS on the stream", "Per-iteration")
    for title in titles:
        assert title in printed
    results = json.loads((tmp_path / "transport.json").read_text())
    assert results["quick"] is True

    streaming = results["streaming"]
    assert [row["p"] for row in streaming] == list(transport.QUICK_SIZES)
    for row in streaming:
        assert row["bytes"] == 16 * row["p"]
        assert row["chunks"] >= 1
        for name in STREAMING_FIELDS:
            assert _positive(row[name]), (row["p"], name, row[name])
        assert all(_positive(seconds) for seconds in row["codec"].values())
        assert set(row["codec"]) == {
            "master_encode_s",
            "worker_decode_s",
            "worker_encode_s",
            "master_decode_s",
            "checksum_s",
        }
        assert _positive(row["ingest_s"])
        for name in ("ingest_GBps", "ingest_ratio_loopback"):  # the rest of the message after its first chunk
            assert _positive(row[name]) if row["chunks"] > 1 else math.isnan(row[name]), (row["p"], name, row[name])
        shared = row["shared"]  # the same Compute through shared memory
        for name in ("total_s", "compute_s", "transport_s", "transport_GBps", "ratio_loopback", "speedup"):
            assert _positive(shared[name]), (row["p"], name, shared[name])
        assert shared["speedup"] == pytest.approx(row["transport_s"] / shared["transport_s"])
        linked = row["link"]  # the same Compute on the worker's link
        for name in ("total_s", "compute_s", "transport_s", "transport_GBps", "ratio_loopback", "speedup", "ingest_s"):
            assert _positive(linked[name]), (row["p"], name, linked[name])
        assert linked["speedup"] == pytest.approx(row["transport_s"] / linked["transport_s"])
        for name in ("ingest_GBps", "ingest_ratio_loopback"):
            assert _positive(linked[name]) if row["chunks"] > 1 else math.isnan(linked[name]), (row["p"], name)
        assert set(row["cpu_per_call"]) == set(transport.PATHS)
        for cpu in row["cpu_per_call"].values():  # /proc counts 10 ms ticks: a quick run may see none
            assert cpu["calls"] >= 2 * transport.CPU_BLOCKS and cpu["worker_s"] >= 0 and cpu["master_s"] >= 0
        where = row["where"]  # the breakdown adds up to the transport time
        assert sum(where.values()) == pytest.approx(row["transport_s"])
        assert where["loopback_s"] == row["loopback_s"] and where["codec_s"] == row["codec_s"]

    sweep = results["chunk_sweep"]
    auto = chunk_bytes_for(8 * transport.QUICK_CHUNK_P)
    assert [row["chunk_bytes"] for row in sweep["rows"]] == [c or auto for c in transport.QUICK_CHUNKS]
    assert [row["auto"] for row in sweep["rows"]] == [c is None for c in transport.QUICK_CHUNKS]
    assert sweep["default_chunk_bytes"] == auto
    assert sweep["best_chunk_bytes"] in [row["chunk_bytes"] for row in sweep["rows"]]
    for row in sweep["rows"]:
        assert _positive(row["transport_s"]) and _positive(row["transport_GBps"])
    # A smaller chunk size can only mean as many chunks or more for the same message.
    chunks = [row["chunks"] for row in sorted(sweep["rows"], key=lambda r: r["chunk_bytes"])]
    assert chunks == sorted(chunks, reverse=True) and chunks[0] > chunks[-1]

    secure = results["tls"]
    assert secure["p"] == transport.QUICK_TLS_P and secure["bytes"] == 16 * secure["p"]
    for mode in ("plaintext", "mutual_tls"):
        for name in ("total_s", "compute_s", "transport_s", "ingest_s", "transport_GBps"):
            assert _positive(secure[mode][name]), (mode, name, secure[mode][name])
    for name in ("ratio_total", "ratio_transport", "ratio_ingest"):
        assert _positive(secure[name]), name
    assert len(secure["load_average_before"]) == len(secure["load_average_after"]) == 3

    iteration = results["iteration"]
    assert _positive(iteration["rtt_s"])
    expected = [
        (n, scheme, path)
        for n in transport.QUICK_CLUSTER
        for scheme, _ in transport.SCHEMES
        for path in transport.PATHS
    ]
    assert [(row["n"], row["scheme"], row["path"]) for row in iteration["rows"]] == expected
    for row in iteration["rows"]:
        assert row["iterations"] == transport.QUICK_ITERATIONS
        assert row["wall_s"] >= row["decode_s"]
        for name in ITERATION_FIELDS:
            assert _positive(row[name]), (row["n"], row["scheme"], name, row[name])
    assert (tmp_path / "transport.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    wide = results["wide"]  # the n = 16, p = 1e5 stage, smaller here
    assert wide["workload"]["num_features"] + 1 == transport.WIDE_PARAMETERS
    assert [(row["n"], row["scheme"], row["path"]) for row in wide["rows"]] == [
        (n, scheme, path)
        for n in transport.QUICK_WIDE_CLUSTER
        for scheme, _ in transport.SCHEMES
        for path in transport.PATHS
    ]
    transfer = next(row for row in streaming if row["p"] == transport.WIDE_PARAMETERS)
    for row in wide["rows"]:
        one = {
            "gRPC": transfer["transport_s"],
            "link": transfer["link"]["transport_s"],
            "shared memory": transfer["shared"]["transport_s"],
        }[row["path"]]
        assert row["one_transfer_s"] == one
        assert _positive(row["cpu_master_s"]) and _positive(row["cpu_workers_s"])
        assert row["beyond_one_transfer_s"] == pytest.approx(row["overhead_s"] - one)
        assert row["through_master_s"] == pytest.approx((row["n"] + row["used_workers"]) / 2 * one)
        alone = transfer["cpu_per_call"][row["path"]]  # each call inside the job against one made alone
        assert row["job_call_cpu_master_s"] == pytest.approx(row["cpu_master_s"] / row["n"])
        assert row["job_call_cpu_worker_s"] == pytest.approx(row["cpu_workers_s"] / row["n"])
        assert (row["alone_call_cpu_master_s"], row["alone_call_cpu_worker_s"]) == (
            alone["master_s"],
            alone["worker_s"],
        )
    assert "The wide model against the transfers" in printed
    assert "CPU per Compute call (ms): in the job" in printed

    shapes = results["call_shapes"]  # a new call per exchange against a message on a long-lived stream
    assert [result["servers"] for result in shapes] == list(transport.QUICK_SHAPE_SERVERS)
    for result in shapes:
        assert result["message_bytes"] == transport.CALL_SHAPE_BYTES
        assert set(result["shapes"]) == {"new unary call", "new unary-stream call", "long-lived stream"}
        assert result["rounds"] == transport.QUICK_SHAPE_ROUNDS // transport.CPU_BLOCKS * transport.CPU_BLOCKS
        for shape in result["shapes"].values():  # /proc counts 10 ms ticks: a quick run's servers may show none
            assert _positive(shape["wall_s"]) and shape["client_cpu_s"] >= 0 and shape["server_cpu_s"] >= 0
    assert "gRPC call shapes" in printed
