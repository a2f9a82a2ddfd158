"""The ``gradcode`` command line.

    gradcode master ...                run a master (`gradcode master --help`)
    gradcode worker ...                run a worker (`gradcode worker --help`)
    gradcode demo                      local master + workers as processes, train on digits, compare
    gradcode codes --n 12 --s 3        which scheme to choose: load, messages, decode cost, exactness
    gradcode codes --accepted          which (n, s) the guarded schemes accept (certified), as a table
    gradcode simulate --scheme A B ... simulated iteration times at any n under a delay model and costs
    gradcode plan HISTORY              the configuration a job's history says is fastest, with runners-up
    gradcode run --master ADDR ...     start a job on a running master and follow it (prints its id first;
                                       Ctrl-C detaches: the job goes on)
    gradcode watch|model|cancel JOB    follow (re-attach to), fetch the model of, or cancel a job
    gradcode jobs                      list the jobs a master holds and their states
    gradcode workers                   list the workers a master knows
    gradcode bench training [--quick]  gradcode vs a torch.distributed allreduce on Tandon et al.'s workload
    gradcode bench wide [--quick]      n = 16, p = 1e5: gradcode against the floor of the same work
    gradcode bench chaos [--quick]     verified jobs while workers are frozen and killed
    gradcode bench cluster [--quick]   emulated hosts (root): flat codes, trees, allreduce on shaped links
    gradcode bench cluster-plan        heterogeneous emulated hosts (root): gradcode plan's pick, measured
    gradcode bench papers [--quick]    the papers' timing results beside gradcode's simulation of its own codes
    gradcode bench primaries [--quick] how long a round takes to choose the workers it expects, n = 16 to 2000
    gradcode bench versus COMMIT       this checkout's master CPU on bench wide's job against a commit's, interleaved
    gradcode workers remove ID         remove a worker from the master's pool
    gradcode certs --host H ...        make a CA and TLS certificates for a cluster

The master address comes from ``--master`` or ``GRADCODE_MASTER`` (default 127.0.0.1:50050); TLS
files and the client token from ``--tls-ca``/``--tls-cert``/``--tls-key``/``--token`` or their
GRADCODE_* variables (see the README's Security section).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import math
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from gradcode.client.errors import explain_rpc_error
from gradcode.client.history import (
    format_summary,
    format_worker_table,
    plot_history,
    plot_workers,
    read_reports,
    save_history,
    save_spec,
)
from gradcode.client.launch import LocalCluster
from gradcode.client.progress import Progress
from gradcode.client.sdk import RESUME_PATIENCE_SECONDS, GradcodeClient, JobFailedError, build_job_spec, keep_report
from gradcode.client.simulation import (
    PROBE_MIN_ITERATIONS,
    PROBE_WARMUP_ITERATIONS,
    Recommendation,
    add_leave_out_argument,
    add_plan_command,
    add_simulate_command,
    check_leave_out,
    planned_configuration,
    recommend,
)
from gradcode.common.codes.compare import accepted_table, format_table, scheme_rows
from gradcode.common.codes.consistency import coverable_rows, uncheckable
from gradcode.common.codes.registry import available_codes, code_class, code_parameters, make_code
from gradcode.common.training.models import available_models, make_model, save_params
from gradcode.common.training.plugins import model_dtype
from gradcode.common.transport.security import Security, add_security_arguments, security_from_args
from gradcode.common.transport.wire import dict_from_struct, message_to_dict
from gradcode.v1 import master_pb2

DEFAULT_MASTER = "127.0.0.1:50050"
DEFAULT_SCHEME = "binary"
"""The scheme of `gradcode run` and `gradcode demo`: a 0/1 code that is exact (certified to 1e-12 in float64)
for every n and s < n a user may type, where cyclic repetition is refused for some (n = 16, s = 2)."""


class CommandError(Exception):
    """A local problem the command reports in one line (exit status 1): an output it cannot write."""


def _scheme(text: str) -> str:
    """``--scheme``: a registered scheme's name, or a usage error listing them."""
    names = available_codes()
    if text not in names:
        raise argparse.ArgumentTypeError(
            f"unknown scheme {text!r}; valid schemes: {', '.join(names)} (`gradcode codes --n N --s S` compares them)"
        )
    return text


def _count(text: str) -> int:
    """A whole number >= 0 (a size; 0: the default)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0 (0: the default), got {value}")
    return value


def _parameters_file(text: str) -> np.ndarray[Any, Any]:
    """``--initial-parameters``: the array of a ``.npy`` file, read here so a bad file is a usage error."""
    try:
        values = np.load(Path(text), allow_pickle=False)
    except OSError as exc:  # missing, a directory, unreadable
        raise argparse.ArgumentTypeError(f"cannot read {text}: {exc.strerror or exc}") from None
    except ValueError as exc:  # text (numpy reads it as a pickle it refuses to load), a damaged header
        why = "" if "pickle" in str(exc) else f" ({exc})"
        raise argparse.ArgumentTypeError(
            f"{text} is not a .npy array file{why}; write the parameters with numpy.save or `gradcode model`"
        ) from None
    if not isinstance(values, np.ndarray):
        values.close()
        raise argparse.ArgumentTypeError(f"{text} is a .npz archive; give a .npy file of one flat vector")
    return values


def _input_file(text: str) -> Path:
    """A local file to read (``resume --checkpoint``): refused at parse time when it is not a readable file."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: {'is a directory' if path.is_dir() else 'no such file'}")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text}: permission denied")
    return path


def _output_dir(directory: Path) -> Path:
    """Create ``directory`` (and its parents) and check it is writable, before a job runs; its absolute path."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".gradcode-write-check-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise CommandError(f"cannot write to {directory}: {exc.strerror or exc}") from None
    return directory.resolve()


def _key_value(text: str) -> tuple[str, Any]:
    """KEY=VALUE with the value read as JSON where it parses (numbers, booleans), else kept as text."""
    key, raw = _text_key_value(text)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key, value


def _text_key_value(text: str) -> tuple[str, str]:
    """KEY=VALUE with the value kept as text (dataset options are strings)."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    return key, value


DEFAULT_STRAGGLERS = 2
"""``--s`` when it is not given, for a scheme that tolerates stragglers."""


def _add_job_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("gradient code")
    g.add_argument(
        "--scheme", type=_scheme, default=DEFAULT_SCHEME,
        help=f"one of: {', '.join(available_codes())} (default: {DEFAULT_SCHEME}, exact for any n and s < n)",
    )  # fmt: skip
    g.add_argument("--n", type=int, default=8, help="number of workers (default: 8)")
    g.add_argument(
        "--s", type=int, default=None,
        help=f"stragglers to tolerate (default: {DEFAULT_STRAGGLERS}; uncoded tolerates none, so 0 for it)",
    )  # fmt: skip
    g.add_argument(
        "--code-param", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
        help="explicit scheme parameter (repeatable); replaces the (n, s) defaults, see `gradcode codes`",
    )  # fmt: skip
    t = p.add_argument_group("training")
    t.add_argument(
        "--model", default="softmax",
        help=f"a built-in model or an installed plugin; here: {', '.join(available_models())} (default: softmax)",
    )  # fmt: skip
    t.add_argument(
        "--dtype", default="", choices=["float64", "float32"],
        help="message precision, and the precision a plugin model computes in (default: float64)",
    )  # fmt: skip
    t.add_argument(
        "--integrity", default="", choices=["off", "detect", "locate"],
        help="consistency checks from surplus messages (default: the master's, off)",
    )  # fmt: skip
    t.add_argument(
        "--backup-priority", default="", choices=["low", "normal"],
        help="how each round asks the workers it expects to decode without: at low OS priority, so that where "
        "workers share cores their redundant work takes only idle CPU, or like the others (default: low)",
    )  # fmt: skip
    t.add_argument(
        "--surplus", default="", choices=["push", "hold", "auto"],
        help="what those backups do with their messages: push them at once, or hold them and send them only when "
        "the round needs them (it pulls them when expected workers are late), saving the master's link the "
        "bytes of every message the decode does not use; auto holds where messages cross the network and pushes "
        "where they go through shared memory (default: auto)",
    )  # fmt: skip
    t.add_argument(
        "--model-delivery", default="", choices=["direct", "relay", "auto"],
        help="how each iteration's model reaches the workers of a flat code: direct to each; relay: inline to one, "
        "the others fetch it from a peer (checked by its digest), so the master's link carries it about once; auto "
        "relays when a round asks 3 or more workers over the network (default: direct)",
    )  # fmt: skip
    t.add_argument(
        "--dataset", default="digits",
        help="digits | gaussian_mixture | linear | file, or with --worker-data an installed dataset plugin "
        "(default: digits)",
    )  # fmt: skip
    t.add_argument(
        "--samples", type=_count, default=0, metavar="N",
        help="samples of a generated dataset (gaussian_mixture, linear; default 0: the dataset's own size)",
    )  # fmt: skip
    t.add_argument(
        "--features", type=_count, default=0, metavar="P",
        help="features of a generated dataset (default 0: the dataset's own; more than the master's "
        "--max-features is refused)",
    )  # fmt: skip
    t.add_argument(
        "--dataset-path", default="",
        help="with --dataset file: a .npz (X, y), .csv (label last), .npy of features or .parquet file, relative "
        "to the master's (and with --worker-data each worker's) --data-dir",
    )  # fmt: skip
    t.add_argument(
        "--dataset-option", type=_text_key_value, action="append", default=[], metavar="KEY=VALUE",
        help="a dataset option, e.g. labels=y.npy (the labels beside a .npy of features) or label=COLUMN (Parquet)",
    )  # fmt: skip
    t.add_argument(
        "--worker-data", action="store_true",
        help="keep the data on the workers: each loads (or generates) its own partitions and the master sends "
        "only the dataset reference and the partitioning; the master reads the labels and held-out rows only",
    )  # fmt: skip
    t.add_argument(
        "--test-fraction", type=float, default=0.0,
        help="share of the dataset held out for the test accuracy, in [0, 1) (default 0: the master's default)",
    )  # fmt: skip
    t.add_argument("--optimizer", default="nesterov", choices=["gd", "nesterov"], help="(default: %(default)s)")
    t.add_argument("--learning-rate", type=float, default=0.5, help="step size (default: %(default)s)")
    t.add_argument("--l2", type=float, default=1e-4, help="L2 regularisation weight (default: %(default)s)")
    t.add_argument("--iterations", type=int, default=60, help="gradient steps (default: %(default)s)")
    t.add_argument("--target-accuracy", type=float, default=0.0, help="stop once test accuracy reaches this")
    t.add_argument(
        "--deadline", type=float, default=30.0,
        help="seconds an iteration may wait for a decodable set (default: %(default)s)",
    )  # fmt: skip
    t.add_argument(
        "--wait-for-workers", type=float, default=30.0, metavar="SECONDS",
        help="how long the job may wait for the workers its code needs to register (default: %(default)s; "
        "0: refuse at once when too few are up)",
    )  # fmt: skip
    t.add_argument("--verify", action="store_true", help="check every decoded gradient against the centralized one")
    t.add_argument("--seed", type=int, default=0, help="seed of the data split, the model and the code (default: 0)")
    e = p.add_argument_group("straggler emulation (experiments)")
    e.add_argument(
        "--straggler", default="none",
        help="none | fixed | shifted_exponential | pareto | gilbert_elliot (default: none)",
    )  # fmt: skip
    e.add_argument(
        "--straggler-param", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
        help="a delay model parameter, e.g. delay_seconds=0.25; fixed takes count=K only with random_worker=true",
    )  # fmt: skip
    t.add_argument(
        "--initial-parameters", type=_parameters_file, default=None, metavar="FILE.npy",
        help="start from these parameters (a flat vector, e.g. from `gradcode model`) instead of the model's own",
    )  # fmt: skip
    o = p.add_argument_group("output")
    o.add_argument(
        "--out", type=Path, default=Path("runs/latest"),
        help="directory for the history and plots, replaced by the next run (default: %(default)s)",
    )  # fmt: skip


def _stragglers(args: argparse.Namespace) -> int:
    """``--s``, or its default for the scheme (uncoded tolerates none: an explicit ``--s 2`` is refused for it)."""
    if args.s is not None:
        return int(args.s)
    return 0 if args.scheme == "uncoded" else DEFAULT_STRAGGLERS


def _spec_from_args(args: argparse.Namespace, **overrides: Any) -> master_pb2.JobSpec:
    values: dict[str, Any] = {
        "scheme": args.scheme,
        "n": args.n,
        "s": _stragglers(args),
        "code_params": dict(args.code_param) or None,
        "model": args.model,
        "dataset": args.dataset,
        "dataset_path": args.dataset_path,
        "dataset_options": dict(args.dataset_option),
        "worker_data": args.worker_data,
        "test_fraction": args.test_fraction,
        "optimizer": args.optimizer,
        "learning_rate": args.learning_rate,
        "l2": args.l2,
        "iterations": args.iterations,
        "target_accuracy": args.target_accuracy,
        "deadline_seconds": args.deadline,
        "verify": args.verify,
        "straggler": args.straggler,
        "straggler_params": dict(args.straggler_param),
        "seed": args.seed,
        "message_dtype": args.dtype,
        "integrity": args.integrity,
        "backup_priority": args.backup_priority,
        "surplus": args.surplus,
        "model_delivery": args.model_delivery,
        "num_samples": args.samples,
        "num_features": args.features,
        "initial_parameters": args.initial_parameters,
        "wait_for_workers_seconds": args.wait_for_workers,
    }
    values.update(overrides)
    return build_job_spec(**values)


def _workers_needed(spec: master_pb2.JobSpec) -> str:
    """The code's worker count as the spec states it (``n``, or ``n1 + n2``), for a message; empty if unstated."""
    params = dict_from_struct(spec.code.params)
    if isinstance(params.get("n"), int):
        return f", its code needs n = {params['n']}"
    if isinstance(params.get("n1"), int) and isinstance(params.get("n2"), int):
        return f", its code needs n1 + n2 = {params['n1'] + params['n2']}"
    return ""


async def _explain_wait(client: GradcodeClient, info: master_pb2.JobInfo, progress: Progress) -> None:
    """While the job is pending, say what it waits for (the workers up versus those the code needs).

    The master waits up to ``wait_for_workers_seconds`` for its workers to register; without this the
    bar would sit silently at 0% for that long. Says it again whenever the number of workers up changes.
    """
    spec, said = info.spec, -1
    await asyncio.sleep(1.0)
    while True:
        try:
            job = await client.get_job(info.job_id)
            workers = [] if job.state != master_pb2.JOB_STATE_PENDING else await client.list_workers()
        except grpc.aio.AioRpcError:
            return  # a note, not the job: the watch itself reports what matters
        if job.state != master_pb2.JOB_STATE_PENDING:
            return
        up = sum(w.state == master_pb2.WORKER_STATE_UP for w in workers)
        if up != said:
            said = up
            progress.write(
                f"job {info.job_id} is pending ({job.message or 'not started'}): {up} worker(s) up at the master"
                f"{_workers_needed(spec)}; it waits up to {spec.wait_for_workers_seconds:g} s for them "
                "(--wait-for-workers sets how long)"
            )
        await asyncio.sleep(2.0)


async def _follow(
    client: GradcodeClient,
    spec: master_pb2.JobSpec,
    label: str,
    seen: list[master_pb2.IterationReport] | None = None,
    on_created: Callable[[master_pb2.JobInfo], None] | None = None,
    patience: float = 0.0,
) -> list[master_pb2.IterationReport]:
    """Create the job and show its progress until it ends; return every report.

    ``seen`` collects the reports as they arrive (what is left when the caller is interrupted). With
    ``patience`` > 0 the job is followed across restarts of the master (see GradcodeClient.follow).
    """
    seen = [] if seen is None else seen
    progress = Progress(label, spec.iterations)
    waits: list[asyncio.Task[None]] = []

    def created(info: master_pb2.JobInfo) -> None:
        if on_created is not None:
            on_created(info)
        waits.append(asyncio.get_running_loop().create_task(_explain_wait(client, info, progress)))

    def report(r: master_pb2.IterationReport) -> None:
        for task in waits:
            task.cancel()
        keep_report(seen, r)
        progress.update(r)

    try:
        await client.run(spec, on_report=report, on_created=created, on_wait=progress.write, patience=patience)
    finally:
        for task in waits:
            task.cancel()
        progress.close()
    return seen


async def _demo(args: argparse.Namespace) -> int:
    out = _output_dir(args.out)  # absolute: the master child writes to the same place as we do
    args.s = _stragglers(args)
    straggler_params = {"delay_seconds": args.delay, "random_worker": True, "num_workers": args.n, "count": args.s}
    print(f"Starting a local master and {args.n} worker processes (logs in {out / 'logs'}) ...", flush=True)
    with LocalCluster(args.n, run_dir=out) as cluster:
        async with GradcodeClient(cluster.master_address) as client:
            common = {"straggler": "fixed", "straggler_params": straggler_params, "verify": True}
            coded = await _follow(client, _spec_from_args(args, **common), f"{args.scheme} (s={args.s})")
            baseline_iterations = max(3, args.iterations // 4)
            uncoded = await _follow(
                client,
                _spec_from_args(
                    args, scheme="uncoded", s=0, code_params=None, iterations=baseline_iterations, **common
                ),
                "uncoded (wait for all)",
            )
    print()
    print(f"{args.s} random worker(s) per iteration delayed by {args.delay:.2f} s (emulated stragglers).")
    print(format_summary(f"{args.scheme:>8}", coded))
    print(format_summary(f"{'uncoded':>8}", uncoded))
    ratio = statistics.median(r.wall_seconds for r in uncoded) / statistics.median(r.wall_seconds for r in coded)
    print(f"Waiting for all workers would have cost {ratio:.1f}x more time per iteration.")
    print(format_worker_table(coded))
    _save(out, coded, {args.scheme: coded, "uncoded": uncoded})
    return 0


def _save(
    out: Path,
    reports: list[master_pb2.IterationReport],
    runs: dict[str, Any],
    spec: master_pb2.JobSpec | None = None,
    *,
    plots: bool = True,
) -> None:
    """Write the history as JSON and CSV, the spec, and (with ``plots``) the loss/accuracy and per-worker
    plots; say where, with the directory's absolute path (``--out`` has a default a user may not know)."""
    out = _output_dir(out)
    files = [save_history(reports, out / "history.json"), save_history(reports, out / "history.csv")]
    if spec is not None:
        files.append(save_spec(spec, out / "spec.json"))
    if plots:
        files += [plot_history(runs, out / "history.png"), plot_workers(reports, out / "workers.png")]
    print(f"Saved {', '.join(map(str, files))}", flush=True)


def _detached(
    args: argparse.Namespace,
    job_id: str,
    reports: list[master_pb2.IterationReport],
    spec: master_pb2.JobSpec | None = None,
) -> None:
    """Ctrl-C while following a job: say that it goes on and how to get back to it; keep what was seen.

    Saves the history and spec but no plots: drawing them (and importing matplotlib) would hold the
    user for seconds after Ctrl-C; ``gradcode watch JOB --out DIR`` draws them for the whole job.
    """
    master = f" --master {args.master}"
    print(
        f"\nDetached from job {job_id} after {len(reports)} iterations; it goes on on the master {args.master}.\n"
        f"  re-attach:  gradcode watch {job_id}{master}\n"
        f"  cancel:     gradcode cancel {job_id}{master}",
        file=sys.stderr, flush=True,
    )  # fmt: skip
    if reports and args.out is not None:
        _save(args.out, reports, {job_id: reports}, spec, plots=False)


def _client(args: argparse.Namespace) -> GradcodeClient:
    """A client of ``--master`` with the TLS files and token of the flags (or their variables)."""
    return GradcodeClient(args.master, security=security_from_args(args))


def _take(args: argparse.Namespace, recommendation: Recommendation) -> None:
    """The planner's recommendation replaces --scheme, --n, --s and --code-param, and names the workers to run on
    when it leaves some out."""
    args.scheme = recommendation.scheme
    args.code_param = list(recommendation.code_params.items())
    args.worker_ids = list(recommendation.worker_ids)


def _apply_plan(args: argparse.Namespace) -> None:
    """``run --plan HISTORY``: the planner's recommendation replaces the configuration."""
    check_leave_out(args.leave_out)
    if args.plan is not None:
        _take(args, planned_configuration(args.plan, leave_out=args.leave_out))
    elif args.leave_out:
        raise ValueError("--leave-out widens what a plan considers: give it with --plan HISTORY or --probe ITERATIONS.")


async def _probe(args: argparse.Namespace) -> None:
    """``run --probe K``: K uncoded iterations on as many workers as the asked configuration uses (its model, data
    and straggler law), then the planner's recommendation from them replaces the scheme and its parameters."""
    if args.plan is not None:
        raise ValueError("Give --plan HISTORY or --probe ITERATIONS, not both.")
    check_leave_out(args.leave_out)
    if args.probe < PROBE_MIN_ITERATIONS:
        raise ValueError(
            f"--probe must be at least {PROBE_MIN_ITERATIONS} iterations (the first {PROBE_WARMUP_ITERATIONS} are "
            f"warm-up), not {args.probe}."
        )
    asked = _spec_from_args(args)
    workers = make_code(asked.code.name, **dict_from_struct(asked.code.params)).worker_processes()
    probe = _spec_from_args(
        args, scheme="uncoded", n=workers, s=0, code_params=None, iterations=args.probe, target_accuracy=0.0,
        verify=False,
    )  # fmt: skip
    async with _client(args) as client:
        reports = await _follow(client, probe, f"probe (uncoded n={workers})", patience=args.reconnect)
    history = [message_to_dict(r) for r in reports if r.iteration > PROBE_WARMUP_ITERATIONS]
    source = f"a {args.probe}-iteration probe"
    _take(args, recommend(history, message_to_dict(probe), source, leave_out=args.leave_out))


async def _run(args: argparse.Namespace) -> int:
    _output_dir(args.out)  # before any job runs (a probe too), not after
    if args.probe is not None:
        await _probe(args)
    else:
        _apply_plan(args)
    spec = _spec_from_args(args)
    spec.worker_ids[:] = args.worker_ids  # the workers a plan leaving some out runs on (none: the first n)
    created: list[master_pb2.JobInfo] = []
    reports: list[master_pb2.IterationReport] = []

    def announce(info: master_pb2.JobInfo) -> None:
        created.append(info)
        print(f"job {info.job_id}", flush=True)  # first, so an interrupted run can still be found

    async with _client(args) as client:
        try:
            await _follow(client, spec, args.scheme, reports, on_created=announce, patience=args.reconnect)
        except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels us, then raises KeyboardInterrupt
            if created:
                _detached(args, created[0].job_id, reports, created[0].spec)
            raise
        except TimeoutError:  # the master did not come back: keep what was seen, say how to get back
            if created:
                _detached(args, created[0].job_id, reports, created[0].spec)
            raise
    print(format_summary(args.scheme, reports))
    print(format_worker_table(reports))
    _save(args.out, reports, {args.scheme: reports}, created[0].spec)
    return 0


def _report_line(r: master_pb2.IterationReport) -> str:
    """One iteration for `gradcode watch`; the test accuracy only where the master evaluated it."""
    accuracy = "" if math.isnan(r.test_accuracy) else f" test acc {r.test_accuracy:.3f}"
    late = f" late {list(r.late_workers)}" if r.late_workers else ""
    failed = f" failed {list(r.failed_workers)}" if r.failed_workers else ""
    return f"iteration {r.iteration}: loss {r.loss:.4f}{accuracy} {r.wall_seconds * 1e3:.1f} ms{late}{failed}"


async def _watch(args: argparse.Namespace) -> int:
    """Follow a job: the last ``--tail`` iterations of its history, then live ones, with a progress bar."""
    if args.out is not None:
        _output_dir(args.out)
    reports: list[master_pb2.IterationReport] = []
    async with _client(args) as client:
        start = await client.get_job(args.job_id)
        total = start.spec.iterations
        print(
            f"job {start.job_id}: {master_pb2.JobState.Name(start.state).removeprefix('JOB_STATE_')}, "
            f"{start.iterations_done}/{total} iterations done",
            flush=True,
        )
        shown_from = start.iterations_done - args.tail if args.tail >= 0 else 0
        progress = Progress(start.job_id, total, print_lines=False)
        try:
            async for r in client.follow(args.job_id, on_wait=progress.write, patience=args.reconnect):
                keep_report(reports, r)
                progress.update(r)
                if r.iteration > shown_from:
                    progress.write(_report_line(r))
        except (asyncio.CancelledError, TimeoutError):
            progress.close()
            _detached(args, args.job_id, reports, start.spec)
            raise
        progress.close()
        info = await client.get_job(args.job_id)
    print(f"job {info.job_id}: {master_pb2.JobState.Name(info.state)} {info.message}")
    if reports:
        print(format_summary(info.job_id, reports))
        print(format_worker_table(reports))
    if args.out is not None and reports:
        _save(args.out, reports, {info.job_id: reports}, info.spec)
    return 0 if info.state == master_pb2.JOB_STATE_SUCCEEDED else 1


async def _resume(args: argparse.Namespace) -> int:
    checkpoint = b"" if args.checkpoint is None else args.checkpoint.read_bytes()
    async with _client(args) as client:
        info = await client.resume(args.job_id or "", checkpoint=checkpoint)
    print(f"job {info.job_id} resumed after iteration {info.iterations_done}", flush=True)
    if args.detach:
        return 0
    args.job_id = info.job_id
    return await _watch(args)


async def _jobs(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        reply = await client.list_jobs()
    if args.json:
        print(json.dumps(message_to_dict(reply), indent=1))
        return 0
    print(f"{'job':<24} {'state':<10} {'iterations':>10}  message")
    for job in reply.jobs:
        state = master_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_")
        print(f"{job.job_id:<24} {state:<10} {job.iterations_done:>10}  {job.message}")
    if reply.evicted_job_ids:
        print(f"evicted (finished, history on the master's disk): {', '.join(reply.evicted_job_ids)}")
    return 0


async def _model(args: argparse.Namespace) -> int:
    _output_dir(args.out.parent)
    async with _client(args) as client:
        params = await client.get_model(args.job_id)
        spec = (await client.get_job(args.job_id)).spec
    files = export_model(spec, params, args.out)
    print(f"saved {params.size} parameters of model {spec.model.kind!r} to {', '.join(map(str, files))}")
    return 0


def export_model(spec: master_pb2.JobSpec, params: np.ndarray[Any, Any], out: Path) -> list[Path]:
    """Write a job's trained parameters with the job's model: ``.npy``, plus its native format (torch: ``.pt``).

    The model is built from the job's spec on this machine, so a plugin's native format needs the plugin
    installed here; without it only the ``.npy`` parameters are written (and a note says why).
    """
    ms = spec.model
    try:
        model = make_model(
            ms.kind,
            num_features=ms.num_features,
            num_classes=ms.num_classes or 2,
            dtype=model_dtype(spec.message_dtype),
        )
    except ValueError as exc:
        print(f"gradcode: only the parameters are written: {exc}", file=sys.stderr)
        return save_params(params, out)
    return model.export(params, out)


async def _cancel(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        info = await client.cancel(args.job_id)
    print(f"job {info.job_id}: {master_pb2.JobState.Name(info.state)}")
    return 0


async def _workers(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        if args.action == "remove":
            removed = await client.remove_worker(args.worker_id)
            print(f"removed worker {removed.worker_id} ({removed.address})")
            return 0
        workers = await client.list_workers()
    for w in workers:
        state = master_pb2.WorkerState.Name(w.state).removeprefix("WORKER_STATE_")
        machine = w.machine_id[:8] or "-"  # workers that share one share cores (their backups wait to be promoted)
        transport = f"  transport: {w.transport}" if w.transport else ""  # shared memory only where proven
        print(f"{w.worker_id:>4}  {w.address:<22} {state:<5} {machine:<8}  {w.name} {w.last_error}{transport}")
    return 0


def _certs(args: argparse.Namespace) -> int:
    from gradcode.client.certs import make_certificates

    try:
        files = make_certificates(args.out, args.host, days=args.days, overwrite=args.overwrite)
    except RuntimeError as exc:
        print(f"gradcode: {exc}", file=sys.stderr)
        return 1
    d = files.ca.parent
    print(f"wrote {', '.join(p.name for p in vars(files).values())} to {d}")
    print(f"servers (master and workers): GRADCODE_TLS_CERT={files.node} GRADCODE_TLS_KEY={files.node_key} "
          f"GRADCODE_TLS_CA={files.ca} [GRADCODE_MTLS=1]")  # fmt: skip
    print(f"clients: GRADCODE_TLS_CA={files.ca} [GRADCODE_TLS_CERT={files.client} GRADCODE_TLS_KEY={files.client_key}]")
    print(f"keep {files.ca_key} offline: it can sign certificates for the cluster.")
    return 0


def _codes(args: argparse.Namespace) -> int:
    if args.accepted:
        verbose = (lambda line: print(line, file=sys.stderr, flush=True)) if args.verbose else None
        print(accepted_table(args.sizes, progress=verbose))
        return 0
    if args.scheme:
        print(f"{args.scheme} parameters: {', '.join(code_parameters(args.scheme))}")
        return 0
    print(format_table(scheme_rows(args.n, args.s), args.n, args.s))
    print(_integrity_notes(args.n, args.s))
    return 0


def _integrity_notes(n: int, s: int) -> str:
    """Which schemes have rows no surplus can ever check: ``--integrity detect|locate`` refuses them."""
    notes = []
    for name in available_codes():
        try:
            code = code_class(name).for_stragglers(n, s) if name != "uncoded" else make_code(name, n=n)
        except ValueError:
            continue
        never = uncheckable(code)
        if never:
            rows = np.asarray(code.B).shape[0]
            uncovered = rows - len(coverable_rows(code))
            who = "every worker" if len(never) == code.n else f"workers {list(never)}"
            notes.append(f"  {name}: {uncovered} of its {rows} rows ({who}) are in no relation of the code")
    head = "Integrity checks (--integrity detect|locate) cannot cover these (a job asking for them is refused):"
    return "\n".join(["", head, *notes]) if notes else ""


def _add_reconnect_argument(p: argparse.ArgumentParser) -> None:
    """How long a command that follows a job waits for its master to come back (run, watch, resume)."""
    p.add_argument(
        "--reconnect", type=float, default=RESUME_PATIENCE_SECONDS, metavar="SECONDS",
        help="when the master goes away (restarts), wait this long for it to come back and resume the job, "
        "then follow it on (default: %(default)g; 0: give up at once)",
    )  # fmt: skip


def _add_watch_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the commands that follow an existing job (watch, resume)."""
    _add_reconnect_argument(p)
    p.add_argument("--out", type=Path, default=None, help="also save the history and plots here")
    p.add_argument(
        "--tail", type=int, default=10, metavar="N",
        help="print the last N iterations of the history before the live ones (default: %(default)s; -1: all)",
    )  # fmt: skip


def _history(args: argparse.Namespace) -> int:
    """``gradcode history FILE``: the summary line and the worker table of a saved history."""
    if args.skip < 0:
        raise ValueError(f"--skip must be 0 or more iterations, not {args.skip}.")
    reports = read_reports(args.file)[args.skip :]
    print(format_summary(args.file.name, reports))
    if reports:
        print(format_worker_table(reports))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradcode",
        description="Straggler-tolerant distributed gradient descent with exact gradient coding.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SERVICES:
        sub.add_parser(name, add_help=False, help=f"run a {name} service (`gradcode {name} --help` lists its flags)")
    master_default = os.environ.get("GRADCODE_MASTER", DEFAULT_MASTER)

    demo = sub.add_parser("demo", help="run a local master + workers and train on the bundled digits data")
    _add_job_arguments(demo)
    demo.add_argument("--delay", type=float, default=0.25, help="emulated straggler delay in seconds (default 0.25)")
    demo.set_defaults(handler=_demo, out=Path("runs/demo"))

    codes = sub.add_parser("codes", help="compare the gradient-code schemes for (n, s)")
    codes.add_argument("--n", type=int, default=12)
    codes.add_argument("--s", type=int, default=3)
    codes.add_argument("--scheme", default="", help="print this scheme's parameters instead")
    codes.add_argument(
        "--accepted", action="store_true",
        help="print which (n, s) the guarded schemes (cyclic, reed_solomon) accept, with their guard certificates",
    )  # fmt: skip
    codes.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16, 32, 64, 128], help="n for --accepted")
    codes.add_argument("--verbose", action="store_true", help="with --accepted: each configuration on stderr")
    codes.set_defaults(handler=_codes)
    add_simulate_command(sub, scheme=_scheme, key_value=_key_value)
    add_plan_command(sub)
    history = sub.add_parser(
        "history", help="summarise a job's history file: its iterations and each worker's time, as `watch` ends"
    )
    history.add_argument("file", type=_input_file, help="the master's <run_dir>/<job>.jsonl, or a saved history.json")
    history.add_argument("--skip", type=int, default=0, metavar="K", help="leave out the first K iterations (warm-up)")
    history.set_defaults(handler=_history)

    def client_command(name: str, text: str) -> argparse.ArgumentParser:
        """A command that talks to a running master: its address and the client's security flags."""
        command = sub.add_parser(name, help=text)
        command.add_argument("--master", default=master_default, help="master address (env GRADCODE_MASTER)")
        add_security_arguments(command, role="client")
        return command

    run = client_command("run", "start a job on a running master and follow it")
    _add_job_arguments(run)
    run.add_argument(
        "--plan", type=_input_file, default=None, metavar="HISTORY",
        help="run the configuration `gradcode plan HISTORY` recommends (its scheme and parameters replace "
        "--scheme, --n, --s and --code-param)",
    )  # fmt: skip
    run.add_argument(
        "--probe", type=int, default=None, metavar="ITERATIONS",
        help="first run this many uncoded iterations on the workers, then the configuration `gradcode plan` "
        f"recommends from them (at least {PROBE_MIN_ITERATIONS}; replaces --scheme, --n, --s and --code-param)",
    )  # fmt: skip
    add_leave_out_argument(run)
    _add_reconnect_argument(run)
    run.set_defaults(handler=_run, worker_ids=[])

    for name, handler, text in (("watch", _watch, "follow a job"), ("cancel", _cancel, "cancel a job")):
        p = client_command(name, text)
        p.add_argument("job_id")
        p.set_defaults(handler=handler)
        if name == "watch":
            _add_watch_arguments(p)
    resume = client_command(
        "resume", "resume a job from its last checkpoint (the master's, or a checkpoint file) and follow it"
    )
    resume.add_argument("job_id", nargs="?", default="", help="the job (optional with --checkpoint)")
    resume.add_argument(
        "--checkpoint", type=_input_file, default=None, metavar="FILE",
        help="a checkpoint file (<state_dir>/<job>.ckpt.npz, e.g. another master's) to resume from",
    )  # fmt: skip
    resume.add_argument("--detach", action="store_true", help="return once the job is resumed")
    _add_watch_arguments(resume)
    resume.set_defaults(handler=_resume)
    jobs = client_command("jobs", "list the jobs a master holds and their states")
    jobs.add_argument("--json", action="store_true", help="print the master's reply as JSON (for scripts)")
    jobs.set_defaults(handler=_jobs)
    model = client_command("model", "save a job's trained model: parameters as .npy (+ a torch state_dict .pt)")
    model.add_argument("job_id")
    model.add_argument("--out", "--output", dest="out", type=Path, default=Path("model.npy"))
    model.set_defaults(handler=_model)
    workers = client_command("workers", "list the workers a master knows, or remove one (workers remove ID)")
    workers.add_argument("action", nargs="?", choices=["list", "remove"], default="list")
    workers.add_argument("worker_id", nargs="?", type=int, help="with remove: the id to remove")
    workers.set_defaults(handler=_workers)
    bench = sub.add_parser("bench", help="run a benchmark (`gradcode bench training --help`)")
    bench.add_argument("benchmark", choices=sorted(BENCHMARKS))
    bench.add_argument("bench_args", nargs=argparse.REMAINDER, help="the benchmark's own arguments")
    bench.set_defaults(handler=_bench)
    certs = sub.add_parser("certs", help="make a CA and TLS certificates for a cluster (needs gradcode[certs])")
    certs.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME|IP",
        required=True,
        help="a host name or IP the master and workers are reached at (repeatable; SANs of node.pem)",
    )
    certs.add_argument("--out", type=Path, default=Path("certs"), help="directory for the files (default: certs)")
    certs.add_argument("--days", type=int, default=365, help="validity in days (default: 365)")
    certs.add_argument("--overwrite", action="store_true", help="replace existing files")
    certs.set_defaults(handler=_certs)
    return parser


BENCHMARKS = {
    "chaos": "gradcode.bench.chaos",
    "cluster": "gradcode.bench.cluster",
    "cluster-plan": "gradcode.bench.cluster_plan",
    "gradient": "gradcode.bench.gradient",
    "papers": "gradcode.bench.papers",
    "primaries": "gradcode.bench.primaries",
    "training": "gradcode.bench.training",
    "transport": "gradcode.bench.transport",
    "versus": "gradcode.bench.versus",
    "wide": "gradcode.bench.wide",
}
"""``gradcode bench NAME ARGS``: runs ``python -m MODULE ARGS``."""


def _bench(args: argparse.Namespace) -> int:
    """The benchmark's own exit status (chaos: 1 when a job failed or an iteration was inexact)."""
    status = importlib.import_module(BENCHMARKS[args.benchmark]).main(args.bench_args)
    return int(status or 0)


SERVICES = {"master": "gradcode.master.__main__", "worker": "gradcode.worker.__main__"}
"""Subcommands that run a service: the rest of the command line is the service's own."""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SERVICES:
        service_main: Callable[[list[str]], int] = importlib.import_module(SERVICES[argv[0]]).main
        return int(service_main(argv[1:]))
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "workers" and (args.action == "remove") != (args.worker_id is not None):
        parser.error("use `gradcode workers` to list, `gradcode workers remove ID` to remove one.")
    handler = args.handler
    try:
        if inspect.iscoroutinefunction(handler):
            return int(asyncio.run(handler(args)))
        return int(handler(args))
    except grpc.aio.AioRpcError as exc:
        security = security_from_args(args) if hasattr(args, "tls_ca") else Security()  # demo: its own master
        print(f"gradcode: {explain_rpc_error(exc, getattr(args, 'master', 'the master'), security)}", file=sys.stderr)
        return 1
    except KeyError as exc:  # str() of a KeyError is the repr of its message
        print(f"gradcode: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 1
    except (JobFailedError, ValueError, CommandError) as exc:
        print(f"gradcode: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a local file the checks above did not foresee, or TimeoutError: one line
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"gradcode: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
