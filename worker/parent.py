"""The tree-parent role (CodedReduce): ask the children, decode them, add the parent's own messages.

A worker whose JobSetup has ``parent`` set is an inner node of a tree. For each Compute call it
sends the same model and iteration to its children (child ``i`` computes the child code's static
rows of worker ``i``), runs one :class:`~gradcode.common.gather.round.Round` (the same gather-and-decode
the master runs) with the child code's decoder, whose decode is the sum of the children's messages.
Its upward message for every requested row is its own coded message for that row plus that sum
(Reisizadeh et al., Algorithm 2: $m_v = a_{f(v)} [m_{children}] + g_{\\mathcal{D}(v)}$).

The master loads every worker (children included) directly, so the parent only needs the
children's addresses and the call tokens the master issued them (a child answers only its master and
its parent); the children's row ids are the child code's row ids. A child that answers
NOT_FOUND restarted and lost the job: the parent names it in its message's trailer (or, when it
fails, in its error's trailing metadata) and the master reloads it, so a node that restarts anywhere
in the tree comes back into the job.

Exactness travels up the tree: the child code must be an exact scheme (an approximate one is refused
when the job is loaded), and when a decoding is nevertheless not exact (flagged by the decoder, its
certified error bound above the job's tolerance, or built on a child's message that was itself
approximate) the parent's messages are marked approximate.
Only the job's message dtype is accepted from children (plus complex128 for a complex child code).

Integrity: under the job's consistency policy (``ParentRole.integrity``) the parent runs the master's
:class:`~gradcode.common.gather.integrity.IntegrityPolicy` on its own round, so it checks its children's surplus
messages exactly as the master checks its own: it waits for the surplus that checks every child it uses,
decodes around a child the checks single out and names it in its messages' trailer
(``children_singled_out``), quarantines a repeat offender (asks it no more; ``children_quarantined``), and
marks its messages approximate when its decode is not exact (a violation it could not clear, or children
left unchecked). The master names the leaf, never the parent.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from gradcode.common.codes.base import Array, Assignment, GradientCode
from gradcode.common.codes.numerics import decode_tolerance, message_rounding, underflow_unit, unit_roundoff
from gradcode.common.codes.registry import code_class, make_code
from gradcode.common.exceptions import ChildrenUnavailableError, ComputeCancelledError
from gradcode.common.gather.integrity import INTEGRITY_POLICIES, IntegrityPolicy
from gradcode.common.gather.round import Decoded, Round, Source, WorkerFailure
from gradcode.common.tasks import TaskOwner
from gradcode.common.transport.link import link_opener
from gradcode.common.transport.security import Security
from gradcode.common.transport.session import Caller
from gradcode.common.transport.wire import CHANNEL_OPTIONS, COMPLEX128, Subtree, dict_from_struct, model_request_bytes
from gradcode.v1 import worker_pb2

__all__ = ["ChildrenUnavailableError", "ParentRunner", "UpwardMessage", "children_lost", "upward_message"]

logger = logging.getLogger(__name__)


def children_lost(round_: Round) -> tuple[int, ...]:
    """The children that answered NOT_FOUND: they restarted and lost the job (the master reloads them)."""
    return tuple(sorted(w for w, f in round_.failed.items() if f.lost_job))


@dataclass(frozen=True)
class UpwardMessage:
    """A tree parent's message for one row, and what its receiver needs to certify it."""

    vector: Array
    magnitude: float
    r"""$\mu_{own} + \sum_i |a_i| \mu_i \ge \sum_j |b_j| \|g_j\|$ over every partition of the row (own and
    children's): covers cancellation in the parent's own part as a leaf's magnitude covers it in a leaf's."""
    decode_error: float
    """Certified absolute error of the children's decoded sum plus the parent's own rounding (its own coded part,
    the add and the cast to the message dtype)."""


def upward_message(
    own: Array, own_magnitude: float, own_terms: int, decoded: Decoded, dtype: np.dtype[Any], length: int
) -> UpwardMessage:
    r"""Reisizadeh et al., Algorithm 2: $m_v = a_{f(v)} [m_{children}] + g_{\mathcal{D}(v)}$, certified.

    ``own`` is the parent's own coded message ($\sum$ of ``own_terms`` products, magnitude ``own_magnitude``,
    :meth:`~gradcode.worker.compute.IterationComputation.magnitude`), ``decoded`` the
    children's round's decode; ``length`` the certified (gradient) coordinates. The error forwarded is
    (Higham, *Accuracy and Stability*, 2nd ed., §3.1 and eq. (2.8), first order):

    * the children's decode, ``decoded.absolute_error`` (their messages' errors and the combine);
    * the parent's own part (:func:`~gradcode.common.codes.numerics.message_rounding`: $w$ products, the cast
      to the message dtype, underflow);
    * the add and the cast of the sum: $(u_{64} + 2u)(\|own\| + \|d\|) + \sqrt{p}\,\eta$ ($u$, $\eta$ of
      ``dtype``; :func:`~gradcode.common.codes.numerics.underflow_unit`).

    The receiver takes this error in place of its own estimate of the message's rounding
    (:func:`~gradcode.common.codes.numerics.bound_combination`, ``sender_errors``).

    The magnitude sent up bounds $\sum_j |b_j|\|g_j\|$ of the whole row, so the receiver's own certificate
    covers cancellation in this parent's part however large its terms; an unknown child magnitude makes it
    infinite, and the receiver's decode not exact.
    """
    u = unit_roundoff(dtype)
    # The decode's own norm (the round's Decoded.norm is only a lower bound of it): its magnitude plus error bounds it
    # too, but loosely enough to call honest float32 trees with cancelling partials inexact.
    decoded_norm = float(np.linalg.norm(decoded.vector[:length]))
    own_error = message_rounding(own_terms, own_magnitude, dtype, length)
    add = (unit_roundoff(np.float64) + 2 * u) * (own_magnitude + own_error + decoded_norm)
    add += math.sqrt(length) * underflow_unit(dtype)
    total = own + decoded.vector  # promotes to the wider dtype of the two
    return UpwardMessage(
        total.astype(dtype, copy=False),
        own_magnitude + decoded.magnitude,
        decoded.absolute_error + own_error + add,
    )


@dataclass(frozen=True)
class ChildChannel:
    worker_id: int
    address: str
    rows: tuple[int, ...]
    channel: grpc.aio.Channel
    caller: Caller
    """The child's Computes, on a Session over :attr:`channel`, as the master asks its workers."""
    subtree: frozenset[int] = frozenset()
    """The nodes below the child (ChildSpec.descendants): all its messages' trailers may name."""


class ParentRunner:
    """One job's parent role: the child code, a channel per child, and the per-iteration gather.

    The constructor validates the :class:`ParentRole` and raises ``ValueError`` saying what is wrong;
    channels are opened lazily (inside the event loop) and closed for good by :meth:`close`.
    ``length`` is the job's message length, which the children's messages share (they are loaded
    with the same ``append_statistics``).
    ``message_dtype`` is the job's message type, the only one accepted from children besides
    complex128 for a complex child code; it sets the tolerance of the decode's error certificate, which
    covers the first ``certified_length`` elements (the gradient; default: all).

    Its rounds' background tasks (the streams of children still late when a round ended) are :attr:`tasks`, the
    job's on this parent, closed with it; a crash of one is only logged (its round has taken what it needed).
    """

    def __init__(
        self,
        role: worker_pb2.ParentRole,
        *,
        job_id: str,
        length: int,
        message_dtype: np.dtype[Any],
        certified_length: int | None = None,
        security: Security | None = None,
    ) -> None:
        name = role.child_code.name
        if not name:
            raise ValueError("ParentRole.child_code.name is empty; name the code the parent decodes its children with.")
        try:
            if not code_class(name).exact:
                raise ValueError(
                    f"{name!r} is an approximate scheme; a tree parent must decode its children exactly, so choose "
                    "an exact scheme (e.g. 'cyclic' or 'binary')."
                )
            self.code: GradientCode = make_code(name, **dict_from_struct(role.child_code.params))
        except (KeyError, ValueError) as exc:
            message = exc.args[0] if exc.args else str(exc)
            raise ValueError(f"ParentRole.child_code is invalid: {message}") from None
        if self.code.dynamic:
            raise ValueError(f"ParentRole.child_code {name!r} is dynamic; a tree parent needs a static code.")
        if len(role.children) != self.code.n:
            raise ValueError(
                f"ParentRole lists {len(role.children)} children but child code {self.code!r} has n={self.code.n}."
            )
        ids = [int(c.worker_id) for c in role.children]
        if len(set(ids)) != len(ids):
            raise ValueError(f"ParentRole names a child worker twice: {ids}.")
        empty = [c.worker_id for c in role.children if not c.address]
        if empty:
            raise ValueError(f"ParentRole children {empty} have no address.")
        if role.wait_seconds < 0:
            raise ValueError(f"ParentRole.wait_seconds must be >= 0 (0: no limit), not {role.wait_seconds}.")
        self.job_id = job_id
        self.length = length
        """Elements of every child message: the job's message length (parameters, plus statistics if appended)."""
        self.certified_length = certified_length
        self.wait_seconds = float(role.wait_seconds) or None
        self.links = not role.no_links
        """Ask the children for links (:mod:`gradcode.common.transport.link`); False: their gRPC Sessions only."""
        self.assignment: Assignment = self.code.static_assignment()
        self.children = [(int(c.worker_id), c.address, self.assignment.rows[i]) for i, c in enumerate(role.children)]
        self._subtrees = [frozenset(int(d) for d in c.descendants) for c in role.children]
        """The nodes below each child (ChildSpec.descendants): all its messages' trailers may name."""
        self._bearers = [c.call_token or None for c in role.children]
        """Each child's call token (None: the token derived from the join secret, if any)."""
        dtype = np.dtype(message_dtype)
        self.child_dtypes: tuple[np.dtype[Any], ...] = (
            (dtype, COMPLEX128) if self.code.is_complex and dtype != COMPLEX128 else (dtype,)
        )
        policy = role.integrity or "off"
        if policy not in INTEGRITY_POLICIES:
            raise ValueError(f"ParentRole.integrity {policy!r} is not a consistency policy; valid ones are "
                             f"{list(INTEGRITY_POLICIES)}.")  # fmt: skip
        addresses = dict(enumerate(role.children))
        self.integrity = IntegrityPolicy(
            policy, self.code, describe=lambda i: f"child {addresses[i].worker_id} at {addresses[i].address}"
        )
        """The job's consistency policy on this parent's children (positions in the child code)."""
        self.security = security or Security()
        """TLS (and, for a child without a call token, the join-derived token) for the channels to the children."""
        self._channels: list[ChildChannel] | None = None
        self._closed = False
        self.tasks = TaskOwner(f"tree parent of job {job_id}")

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def connected(self) -> bool:
        """True once the children's channels are open (they are opened by the first Compute)."""
        return self._channels is not None

    def _open(self) -> list[ChildChannel]:
        if self._closed:
            raise ComputeCancelledError(
                f"The tree parent of job {self.job_id!r} was closed (job ended or replaced); no child is asked again."
            )
        if self._channels is None:
            self._channels = []
            for (worker_id, address, rows), bearer, subtree in zip(
                self.children, self._bearers, self._subtrees, strict=True
            ):
                bearer = bearer or self.security.worker_call_token
                channel = self.security.channel(address, bearer=bearer, options=CHANNEL_OPTIONS)
                link = link_opener(channel, address, self.security) if self.links else None
                caller = Caller(channel, f"child {worker_id} at {address}", link)
                self._channels.append(ChildChannel(worker_id, address, rows, channel, caller, subtree))
        return self._channels

    async def children_sum(self, request: worker_pb2.ComputeRequest, params: Array) -> Round:
        """Ask every child for this iteration with the model ``params`` inline (however this parent got it: inline or
        relayed by a peer), serialized once for all of them; the returned round is decodable (its decode is the sum).

        Raises ChildrenUnavailableError when the children that answered are not decodable, and
        ComputeCancelledError when the runner is (or gets) closed.
        """
        quarantined = self.integrity.quarantined
        channels = self._open()
        body = model_request_bytes(params)
        sources = [self._source(child, request, body) for i, child in enumerate(channels) if i not in quarantined]
        dtype = self.child_dtypes[0]
        round_ = Round(
            self.code.decoder(self.assignment),
            job_id=self.job_id,
            iteration=int(request.iteration),
            length=self.length,
            dtypes=self.child_dtypes,
            certified_length=self.certified_length,
            tolerance=decode_tolerance(dtype),
            tasks=self.tasks,
        )
        for i, reason in quarantined.items():
            round_.fail(channels[i].worker_id, WorkerFailure.worker_down(reason))
        await round_.gather(
            sources, timeout=self.wait_seconds, strategies=self.integrity.wait_rules(round_, self.assignment)
        )
        if self._closed:  # closed while gathering: the failures are our own doing, and nobody wants the sum
            raise ComputeCancelledError(
                f"The tree parent of job {self.job_id!r} was closed during iteration {request.iteration}."
            )
        if not round_.decodable:
            raise ChildrenUnavailableError(self._describe_failure(round_), children_lost=children_lost(round_))
        self.integrity.judge(round_, self.assignment)
        return round_

    def subtree(self, round_: Round) -> Subtree:
        """What this parent's messages say of the nodes below it after ``round_`` (job worker indices): the children
        that lost the job, those the checks singled out and quarantined now, the descendants that delivered (its
        children, with their seconds in it, and what their messages reported of theirs) and those decoded without
        (its children late or failed, and theirs)."""
        ids = [worker_id for worker_id, _, _ in self.children]
        integrity = round_.integrity
        timings = round_.timings()
        late = (set(round_.stragglers) | set(round_.failed)) - set(timings)
        for message in round_.messages.values():
            timings.update(message.subtree.timings)
            late.update(message.subtree.late)
        return Subtree(
            lost=children_lost(round_),
            singled_out=() if integrity.singled_out is None else (ids[integrity.singled_out],),
            quarantined=tuple(ids[i] for i in integrity.quarantined),
            timings=tuple(sorted(timings.items())),
            late=tuple(sorted(late)),
        )

    def _source(self, child: ChildChannel, request: worker_pb2.ComputeRequest, body: bytes) -> Source:
        """Child ``child``'s Compute: its own fields, followed by the model's (``body``, the same for every child)."""
        head = worker_pb2.ComputeRequest(
            job_id=self.job_id, iteration=request.iteration, worker_id=child.worker_id, rows=list(child.rows)
        )
        return Source(
            worker_id=child.worker_id, rows=child.rows, open=lambda: child.caller.compute(head, body),
            subtree=child.subtree,
        )  # fmt: skip

    def _describe_failure(self, result: Round) -> str:
        iteration = result.iteration
        delivered = set(result.finished)
        missing = [w for w, _, _ in self.children if w not in delivered]
        addresses = {w: a for w, a, _ in self.children}
        details = "; ".join(
            f"child {w} at {addresses[w]}: "
            + str(result.failed.get(w, "no answer in time" if result.timed_out else "late"))
            for w in missing
        )
        limit = f" within {self.wait_seconds:g} s" if self.wait_seconds is not None else ""
        return (
            f"Tree parent of job {self.job_id!r}, iteration {iteration}: children {missing} did not deliver{limit}, "
            f"and the ones that did ({sorted(delivered)}) are not decodable with {self.code!r}. {details}."
        )

    async def close(self) -> None:
        """Close the children's channels for good (idempotent): later calls are refused, nothing is reopened."""
        self._closed = True
        channels, self._channels = self._channels, None
        for child in channels or []:
            child.caller.close()
            await child.channel.close(grace=None)
        await self.tasks.close()
