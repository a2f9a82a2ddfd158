"""``gradcode simulate`` and ``gradcode plan``: what configurations would do, from :mod:`gradcode.common.sim.simulate`
and :mod:`gradcode.common.sim.plan`.

    gradcode simulate --scheme binary fractional uncoded --n 120 --s 3 --straggler pareto \\
        --straggler-param shape=1.1 --straggler-param scale=0.01 --compute-seconds 0.5 --iterations 200

Costs come from ``--costs FILE.json`` (the fields of :class:`~gradcode.common.sim.simulate.Costs`) and the flags,
a flag winning over the file. Prints one row per configuration; ``--json FILE`` writes the rows and the costs.

    gradcode plan runs/job-1.jsonl --iterations 100 --bootstrap 10

fits every worker of the job's history and ranks the exact configurations with that many workers.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradcode.common.codes.base import GradientCode
from gradcode.common.codes.registry import code_class, make_code
from gradcode.common.ops.cli import text_table
from gradcode.common.sim.simulate import MODEL_DELIVERIES, SURPLUS_MODES, Costs, simulate
from gradcode.common.sim.stragglers import DELAY_MODEL_NAMES, DelayModel, make_delay_model

__all__ = [
    "COST_FLAGS",
    "add_cost_arguments",
    "add_plan_command",
    "add_simulate_command",
    "costs_from_args",
    "format_rows",
    "planned_configuration",
]

COST_FLAGS = {
    "compute_seconds": "seconds one worker takes for the gradient of the whole data set",
    "message_bytes": "bytes of one gradient message (and of the model sent down)",
    "worker_bandwidth": "bytes/s of each worker's link (default: free)",
    "master_bandwidth": "bytes/s of the master's link (default: free)",
    "message_overhead": "seconds the receiver spends per message besides its bytes",
    "decode_seconds": "seconds from the decodable moment to the end of the iteration",
    "worker_seconds": "seconds every worker spends per iteration whatever its share (model in, message out)",
    "parent_decode_seconds": "a tree parent's --decode-seconds (default: the same)",
    "broadcast_spread": "how models sent at once end: 0 together (a fair link) to 1 one after another (default: as "
    "gradcode's links, 1 for models of 1 MiB or more, which take turns, else 0)",
    "relay_spread": "the same for the relayed fetches a peer serves at once (default: as the models sent down)",
    "relay_hop_seconds": "seconds a relayed model's fetch costs besides its bytes (--model-delivery relay)",
}
"""Cost flags (``--compute-seconds`` ...) and what they mean; each is a field of :class:`Costs`."""


def add_cost_arguments(p: argparse.ArgumentParser) -> None:
    """``--costs FILE`` and one flag per :data:`COST_FLAGS` field."""
    g = p.add_argument_group("costs (a flag wins over --costs)")
    g.add_argument("--costs", type=Path, default=None, metavar="FILE.json", help="calibration file of cost fields")
    for name, text in COST_FLAGS.items():
        g.add_argument(f"--{name.replace('_', '-')}", type=float, default=None, metavar="X", help=text)
    g.add_argument("--no-broadcast", action="store_true", help="the model is not sent down each iteration")


def costs_from_args(args: argparse.Namespace) -> Costs:
    """The costs of ``--costs`` with the flags given on top."""
    values: dict[str, Any] = {}
    if args.costs is not None:
        values = Costs.from_json(args.costs).to_dict()
    for name in COST_FLAGS:
        given = getattr(args, name)
        if given is not None:
            values[name] = given
    if args.no_broadcast:
        values["broadcast"] = False
    return Costs.from_mapping(values)


def _configurations(args: argparse.Namespace) -> tuple[list[GradientCode], list[str]]:
    """The codes to simulate, and why the (scheme, s) pairs that have no configuration were skipped."""
    if args.code_param:
        if len(args.scheme) != 1:
            raise ValueError("--code-param sets one scheme's parameters: give exactly one --scheme with it.")
        return [make_code(args.scheme[0], **dict(args.code_param))], []
    codes: dict[str, GradientCode] = {}
    skipped = []
    for scheme, s in itertools.product(args.scheme, args.s):
        try:
            code = code_class(scheme).for_stragglers(args.n, s)
        except ValueError as exc:
            skipped.append(f"{scheme} n={args.n} s={s}: {exc}")
            continue
        codes.setdefault(repr(code), code)
    if not codes:
        raise ValueError("No configuration to simulate: " + " | ".join(skipped))
    return list(codes.values()), skipped


def _delays(args: argparse.Namespace) -> DelayModel:
    return make_delay_model(args.straggler, dict(args.straggler_param), args.seed)


def _parameters(code: GradientCode) -> str:
    shown = {k: v for k, v in code._params().items() if k not in ("seed", "shifts")}
    return " ".join(f"{k}={v}" for k, v in shown.items())


def simulation_row(
    code: GradientCode,
    costs: Costs,
    iterations: int,
    delays: DelayModel,
    surplus: str = "push",
    model_delivery: str = "direct",
) -> dict[str, Any]:
    """One table row: the scheme, its parameters, its worker processes and the simulated summary."""
    result = simulate(code, costs, iterations, delays, surplus=surplus, model_delivery=model_delivery)
    return {
        "scheme": type(code).name,
        "parameters": _parameters(code),
        "workers": code.worker_processes(),
        **result.summary(),
    }


def format_rows(rows: Sequence[dict[str, Any]], *, extra: Sequence[tuple[str, str]] = ()) -> str:
    """The rows as an aligned text table (seconds in ms, bytes in MB)."""
    columns: list[tuple[str, str, Callable[[Any], str]]] = [
        ("scheme", "scheme", str),
        ("parameters", "parameters", str),
        ("workers", "workers", lambda v: f"{int(v)}"),
        ("median_seconds", "median ms", lambda v: f"{1e3 * v:.2f}"),
        ("p10_seconds", "p10 ms", lambda v: f"{1e3 * v:.2f}"),
        ("p90_seconds", "p90 ms", lambda v: f"{1e3 * v:.2f}"),
        ("total_seconds", "K iterations s", lambda v: f"{v:.3f}"),
        ("master_bytes_per_iteration", "MB/iter at master", lambda v: f"{v / 1e6:.3f}"),
    ]
    columns += [(key, head, str) for key, head in extra]
    return text_table([head for _, head, _ in columns], [[fmt(row[key]) for key, _, fmt in columns] for row in rows])


def _simulate_command(args: argparse.Namespace) -> int:
    if args.iterations < 1:
        raise ValueError(f"--iterations must be >= 1, not {args.iterations}.")
    costs = costs_from_args(args)
    delays = _delays(args)
    codes, skipped = _configurations(args)
    rows = [simulation_row(code, costs, args.iterations, delays, args.surplus, args.model_delivery) for code in codes]
    print(f"{args.iterations} simulated iterations; delays {delays!r}")
    print(format_rows(rows))
    for note in skipped:
        print(f"skipped {note}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        clean = [{k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in r.items()} for r in rows]
        args.json.write_text(json.dumps({"costs": costs.to_dict(), "delays": repr(delays), "rows": clean}, indent=1))
    return 0


def add_simulate_command(
    sub: Any, *, scheme: Callable[[str], str], key_value: Callable[[str], tuple[str, Any]]
) -> argparse.ArgumentParser:
    """Register ``gradcode simulate`` on the subparsers ``sub`` (``scheme``/``key_value``: the CLI's own types)."""
    p: argparse.ArgumentParser = sub.add_parser(
        "simulate", help="simulate schemes at any n (up to thousands) under a delay model and calibrated costs"
    )
    p.add_argument("--scheme", type=scheme, nargs="+", default=["binary"], help="one or more schemes to compare")
    p.add_argument("--n", type=int, default=8, help="workers (default: %(default)s)")
    p.add_argument("--s", type=int, nargs="+", default=[1], help="stragglers to tolerate, one or more (default: 1)")
    p.add_argument(
        "--code-param", type=key_value, action="append", default=[], metavar="KEY=VALUE",
        help="explicit parameters of the one --scheme (repeatable), e.g. L=2 for coded_reduce",
    )  # fmt: skip
    p.add_argument("--straggler", default="none", choices=DELAY_MODEL_NAMES, help="delay model (default: none)")
    p.add_argument(
        "--straggler-param", type=key_value, action="append", default=[], metavar="KEY=VALUE",
        help="a delay model parameter, as for `gradcode run`",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="seed of the delay model (default: 0)")
    p.add_argument("--iterations", type=int, default=100, help="iterations simulated, K (default: %(default)s)")
    p.add_argument(
        "--surplus", choices=SURPLUS_MODES, default="push",
        help="what backups do with their messages: push them when ready, or hold them until the master's rules "
        "pull them (JobSpec.surplus; the master's auto holds on hosts of their own) (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--model-delivery", choices=MODEL_DELIVERIES, default="direct",
        help="how the model reaches the workers: sent to each, or to one and relayed among them "
        "(JobSpec.model_delivery) (default: %(default)s)",
    )  # fmt: skip
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the rows as JSON")
    add_cost_arguments(p)
    p.set_defaults(handler=_simulate_command)
    return p


def _plan_command(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from gradcode.common.sim.plan import plan_for_spec, read_history

    for name in ("iterations", "top", "show"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, not {getattr(args, name)}.")
    check_leave_out(args.leave_out)
    reports, spec = read_history(args.history)
    if args.spec is not None:
        spec = json.loads(args.spec.read_text(encoding="utf-8"))
    if spec is None:
        raise ValueError(
            f"No job spec beside {args.history} ({args.history.with_suffix('.spec.json').name}); give --spec FILE "
            "(the master writes it beside the history)."
        )
    rows, fits = plan_for_spec(
        reports,
        spec,
        surplus=None if args.surplus == "auto" else args.surplus,
        base=costs_from_args(args),
        iterations=args.iterations,
        bootstrap=args.bootstrap,
        top=args.top,
        leave_out=args.leave_out,
    )
    print(f"{len(reports)} iterations of history, {len(fits)} workers fitted (shift + Exp(rate), censored MLE):")
    for f in fits:
        print(
            f"  worker {f.worker_id}: shift {1e3 * f.shift:.2f} ms, mean excess {1e3 / f.rate:.2f} ms "
            f"({f.observed} observed, {f.censored} late)"
        )
    print(
        f"Ranked by simulated mean seconds per iteration (K = {args.iterations}; 5-95 % bootstrap over "
        f"{args.bootstrap} resamples of the history for the top {args.top}); the first is the recommendation:"
    )
    head = ("rank", "scheme", "parameters", "workers", "left out", "mean ms", "5% ms", "95% ms", "K iterations s")
    ids = [f.worker_id for f in fits]
    lines = [
        (
            str(r.rank), r.scheme, r.parameters, str(r.workers),
            " ".join(str(w) for w in ids if w not in r.worker_ids) or "-", f"{1e3 * r.mean_seconds:.2f}",
            f"{1e3 * r.low_seconds:.2f}", f"{1e3 * r.high_seconds:.2f}", f"{r.total_seconds:.3f}",
        )
        for r in rows[: args.show]
    ]  # fmt: skip
    print(text_table(head, lines))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        clean = [
            {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in asdict(f).items()} for f in fits
        ]
        args.json.write_text(json.dumps({"fits": clean, "rows": [asdict(r) for r in rows]}, indent=1))
    return 0


PROBE_WARMUP_ITERATIONS = 2
"""A probe job's first iterations, left out of the fit: connections open and the data is first touched."""
PROBE_MIN_ITERATIONS = PROBE_WARMUP_ITERATIONS + 6
"""The shortest probe ``gradcode run --probe`` accepts: the warm-up and six iterations to fit each worker on."""


@dataclass(frozen=True)
class Recommendation:
    """What ``gradcode run --plan`` and ``--probe`` run: the scheme, its parameters, and the workers (pool ids) it
    runs on when it leaves some of the history's out (empty: the first it needs, as any job)."""

    scheme: str
    code_params: dict[str, Any]
    worker_ids: tuple[int, ...]


def recommend(
    reports: Sequence[Mapping[str, Any]], spec: Mapping[str, Any], source: str, *, iterations: int = 100,
    leave_out: int = 0,
) -> Recommendation:  # fmt: skip
    """The recommended configuration for the cluster that ran ``spec`` and wrote ``reports`` (a history, as the
    master writes it; ``source`` names it in the line printed), no bootstrap, considering configurations that leave
    up to ``leave_out`` of the slowest workers idle."""
    from gradcode.common.sim.plan import plan_for_spec

    rows, fits = plan_for_spec(reports, spec, iterations=iterations, bootstrap=0, top=1, leave_out=leave_out)
    best = rows[0]
    fewer = best.workers < len(fits)
    on = f" on workers {list(best.worker_ids)} of the {len(fits)} fitted" if fewer else ""
    print(
        f"plan from {source}: {best.scheme} {best.parameters} ({best.workers} workers{on}), predicted "
        f"{1e3 * best.mean_seconds:.1f} ms per iteration; runner-up "
        + (f"{rows[1].scheme} {rows[1].parameters} {1e3 * rows[1].mean_seconds:.1f} ms" if len(rows) > 1 else "none"),
        flush=True,
    )
    return Recommendation(best.scheme, dict(best.code_params), best.worker_ids if fewer else ())


def planned_configuration(
    history: Path, spec: Path | None = None, *, iterations: int = 100, leave_out: int = 0
) -> Recommendation:
    """:func:`recommend` for a history file (the master's ``<job>.jsonl``, its ``.spec.json`` beside it or
    ``spec``): what ``gradcode run --plan HISTORY`` runs."""
    from gradcode.common.sim.plan import read_history

    reports, beside = read_history(history)
    job = json.loads(spec.read_text(encoding="utf-8")) if spec is not None else beside
    if job is None:
        raise ValueError(f"No job spec beside {history}; `gradcode plan` needs the history's .spec.json.")
    return recommend(reports, job, str(history), iterations=iterations, leave_out=leave_out)


def check_leave_out(leave_out: int) -> None:
    if leave_out < 0:
        raise ValueError(f"--leave-out must be >= 0 (workers left idle), not {leave_out}.")


def add_leave_out_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--leave-out", type=int, default=0, metavar="K",
        help="also consider flat codes that leave up to K of the slowest workers idle (CodedReduce trees of fewer "
        "nodes are always considered); a configuration with fewer workers runs on the fastest (default: 0)",
    )  # fmt: skip


def add_plan_command(sub: Any) -> argparse.ArgumentParser:
    """Register ``gradcode plan HISTORY`` on the subparsers ``sub``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "plan", help="recommend a configuration from a job's history: fit each worker, simulate, rank"
    )
    p.add_argument("history", type=Path, help="<run_dir>/<job>.jsonl the master writes (or a saved .json history)")
    p.add_argument("--spec", type=Path, default=None, help="the job's spec (default: <history>.spec.json beside it)")
    p.add_argument("--iterations", type=int, default=100, help="iterations per simulation, K (default: %(default)s)")
    p.add_argument("--bootstrap", type=int, default=10, help="bootstrap resamples of the history (default: 10)")
    p.add_argument("--top", type=int, default=5, help="configurations given a bootstrap interval (default: 5)")
    p.add_argument("--show", type=int, default=10, help="rows printed (default: %(default)s)")
    p.add_argument(
        "--surplus", choices=("push", "hold", "auto"), default="auto",
        help="what backups do with their messages in the simulated jobs: auto, as the history's spec says, its auto "
        "holding as the master does on hosts of their own; push for a job on one machine (default: %(default)s)",
    )  # fmt: skip
    add_leave_out_argument(p)
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the fits and all rows")
    add_cost_arguments(p)
    p.set_defaults(handler=_plan_command)
    return p
