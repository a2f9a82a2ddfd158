"""The tree-parent role (CodedReduce): ask the children, decode them, add the parent's own messages.

A worker whose JobSetup has ``parent`` set is an inner node of a tree. For each Compute call it
sends the same model and iteration to its children (child ``i`` computes the child code's static
rows of worker ``i``), runs the shared online gather-and-decode loop (:func:`gradcode.common.gather.gather`)
with the child code's decoder, and combines the survivors into the decoded sum of the children's
messages. Its upward message for every requested row is its own coded message for that row plus
that sum (Reisizadeh et al., Algorithm 2: $m_v = a_{f(v)} [m_{children}] + g_{\\mathcal{D}(v)}$).

The master loads every worker (children included) directly, so the parent only needs the
children's addresses; the children's row ids are the child code's row ids.

Exactness travels up the tree: the child code must be an exact scheme (an approximate one is refused
when the job is loaded), and when a decoding is nevertheless not exact (flagged by the decoder, or
built on a child's message that was itself approximate) the parent's messages are marked approximate.
Only the job's message dtype is accepted from children (plus complex128 for a complex child code).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from gradcode.common.codes.base import Array, Assignment, GradientCode
from gradcode.common.codes.registry import code_class, make_code
from gradcode.common.gather import GatherResult, Source, gather
from gradcode.common.security import Security
from gradcode.common.wire import CHANNEL_OPTIONS, dict_from_struct
from gradcode.v1 import worker_pb2, worker_pb2_grpc
from gradcode.worker.compute import ComputeCancelledError

__all__ = ["ChildrenSum", "ChildrenUnavailableError", "ParentRunner"]

logger = logging.getLogger(__name__)

_COMPLEX = np.dtype("<c16")


class ChildrenUnavailableError(Exception):
    """Not enough children answered (in time) to decode their sum; the message names the missing ones."""


@dataclass(frozen=True)
class ChildChannel:
    worker_id: int
    address: str
    rows: tuple[int, ...]
    channel: grpc.aio.Channel
    stub: worker_pb2_grpc.WorkerStub


@dataclass(frozen=True)
class ChildrenSum:
    """The decoded sum of the children's messages and who contributed."""

    vector: Array
    used: list[int]
    late: list[int]
    failed: dict[int, str]
    exact: bool
    """False when the decoding is flagged not exact or uses a child's message that was itself approximate."""


class ParentRunner:
    """One job's parent role: the child code, a channel per child, and the per-iteration gather.

    The constructor validates the :class:`ParentRole` and raises ``ValueError`` saying what is wrong;
    channels are opened lazily (inside the event loop) and closed for good by :meth:`close`.
    ``message_dtype`` is the job's message type, the only one accepted from children besides
    complex128 for a complex child code.
    """

    def __init__(
        self,
        role: worker_pb2.ParentRole,
        *,
        job_id: str,
        num_params: int,
        message_dtype: np.dtype[Any],
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
        self.num_params = num_params
        self.wait_seconds = float(role.wait_seconds) or None
        self.assignment: Assignment = self.code.static_assignment()
        self.children = [(int(c.worker_id), c.address, self.assignment.rows[i]) for i, c in enumerate(role.children)]
        dtype = np.dtype(message_dtype)
        self.child_dtypes: tuple[np.dtype[Any], ...] = (
            (dtype, _COMPLEX) if self.code.is_complex and dtype != _COMPLEX else (dtype,)
        )
        self.security = security or Security()
        """TLS and the worker call token for the channels to the children."""
        self._channels: list[ChildChannel] | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _open(self) -> list[ChildChannel]:
        if self._closed:
            raise ComputeCancelledError(
                f"The tree parent of job {self.job_id!r} was closed (job ended or replaced); no child is asked again."
            )
        if self._channels is None:
            self._channels = []
            for worker_id, address, rows in self.children:
                channel = self.security.channel(
                    address, bearer=self.security.worker_call_token, options=CHANNEL_OPTIONS
                )
                stub = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
                self._channels.append(ChildChannel(worker_id, address, rows, channel, stub))
        return self._channels

    async def children_sum(self, request: worker_pb2.ComputeRequest) -> ChildrenSum:
        """Ask every child for this iteration and decode their sum.

        Raises ChildrenUnavailableError when the children that answered are not decodable, and
        ComputeCancelledError when the runner is (or gets) closed.
        """
        sources = [self._source(child, request) for child in self._open()]
        result = await gather(
            self.code.decoder(self.assignment),
            sources,
            job_id=self.job_id,
            iteration=int(request.iteration),
            length=self.num_params,
            dtypes=self.child_dtypes,
            timeout=self.wait_seconds,
        )
        if self._closed:  # closed while gathering: the failures are our own doing, and nobody wants the sum
            raise ComputeCancelledError(
                f"The tree parent of job {self.job_id!r} was closed during iteration {request.iteration}."
            )
        if result.decoding is None:
            raise ChildrenUnavailableError(self._describe_failure(result, int(request.iteration)))
        vector = result.combine()
        return ChildrenSum(
            vector=vector, used=result.used_workers, late=result.late, failed=result.failed, exact=result.exact
        )

    def _source(self, child: ChildChannel, request: worker_pb2.ComputeRequest) -> Source:
        child_request = worker_pb2.ComputeRequest(
            job_id=self.job_id, iteration=request.iteration, worker_id=child.worker_id, model=request.model,
            rows=list(child.rows),
        )  # fmt: skip

        def open_stream() -> Any:
            return child.stub.Compute(child_request)

        return Source(worker_id=child.worker_id, rows=child.rows, open=open_stream)

    def _describe_failure(self, result: GatherResult, iteration: int) -> str:
        delivered = set(result.finished)
        missing = [w for w, _, _ in self.children if w not in delivered]
        addresses = {w: a for w, a, _ in self.children}
        details = "; ".join(
            f"child {w} at {addresses[w]}: " + result.failed.get(w, "no answer in time" if result.timed_out else "late")
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
            await child.channel.close(grace=None)
