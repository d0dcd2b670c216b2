"""A66 per-call and per-attempt metrics of one RPC (gRFC A66, A78).

One :class:`CallMetrics` per RPC, made only while metrics are on
(``pyxds.metrics.RECORDER`` set when the RPC starts): an RPC made while
they are off carries None and costs nothing more.  The RPC
(:class:`pyxds.channel.rpc.Rpc`) tells it when each attempt starts and ends
and when the call ends; it records:

* ``grpc.client.attempt.started`` when an attempt starts: A66 "Attempts are
  created after name resolution and after any xDS HTTP filters but before
  the LB pick", so the first one when the RPC is routed and its filters
  let it through (an RPC that fails before, e.g. with no config, no
  matching route or a fault abort, has no attempt, as C-core), each next
  one at the first pick after the retry backoff (an RPC whose deadline
  comes during the backoff has no next attempt);
* ``grpc.client.attempt.duration`` (pick included) and the attempt's
  ``sent``/``rcvd_total_compressed_message_size`` at each attempt's end,
  a failed pick that is retried included (C-core's LB call fails with it),
  with the A78 optional labels its pick set (``PickComplete.attempt_labels``);
* ``grpc.client.call.duration`` at the call's end.

``grpc.method`` is the method without its leading slash for a method the
application registered (``_registered_method=True``, as generated stubs
do) and ``"other"`` for any other (A66: generic method names are reported
as "other" unless the user's ``generic_method_attribute_filter`` says
otherwise; :func:`pyxds.metrics.enable`).

Message sizes are counted by the attempt's own grpcio serializers
(:func:`counting`), into :attr:`CallMetrics.sizes` ([sent, received]).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from pyxds import metrics as _metrics
from pyxds.status import Status

__all__ = ["CallMetrics", "counting"]


class CallMetrics:
    """See the module docstring."""

    __slots__ = ("method", "target", "sizes", "_attempt_start", "_call_start")

    def __init__(self, path: str, target: str, registered: bool = True) -> None:
        method = path.lstrip("/")
        if not registered and not _metrics.method_recorded(method):
            method = _metrics.OTHER_METHOD
        self.method = method
        self.target = target
        #: the current attempt's message bytes, [sent, received]
        self.sizes: list[int] = [0, 0]
        #: when the open attempt started (None: none is open)
        self._attempt_start: float | None = None
        self._call_start = time.perf_counter()

    @property
    def attempt_open(self) -> bool:
        return self._attempt_start is not None

    def attempt_started(self) -> None:
        """An attempt starts (A66: after routing and the filters, before
        the pick): ``grpc.client.attempt.started``."""
        _metrics.add(
            "grpc.client.attempt.started",
            1,
            {"grpc.method": self.method, "grpc.target": self.target},
        )
        self.sizes = [0, 0]
        self._attempt_start = time.perf_counter()

    def attempt_ended(
        self, status: Status, attempt_labels: Mapping[str, str] | None, last: bool
    ) -> bool:
        """The open attempt (if any) ended with ``status``; ``last``: the
        RPC ends with it.  Not last: the next attempt starts now (a pick
        whose subchannel had lost its connection, picked again at once).
        False: metrics were turned off meanwhile, the RPC's next attempts
        are not recorded."""
        self.attempt_failed(status, attempt_labels)
        if last or _metrics.RECORDER is None:
            return False
        self.attempt_started()
        return True

    def attempt_failed(self, status: Status, attempt_labels: Mapping[str, str] | None) -> None:
        """The open attempt (if any) ended with ``status``; the next one, if
        the RPC retries, starts with :meth:`attempt_started` at its pick."""
        start = self._attempt_start
        if start is None:
            return
        self._attempt_start = None
        labels = {
            "grpc.method": self.method,
            "grpc.target": self.target,
            "grpc.status": status.code.name,
        }
        if attempt_labels is not None:
            # A78: the optional labels the picker set (grpc.lb.locality); the
            # recorder emits those the user enabled
            labels.update(attempt_labels)
        _metrics.record("grpc.client.attempt.duration", time.perf_counter() - start, labels)
        sizes = self.sizes
        _metrics.record("grpc.client.attempt.sent_total_compressed_message_size", sizes[0], labels)
        _metrics.record("grpc.client.attempt.rcvd_total_compressed_message_size", sizes[1], labels)

    def call_ended(self, status: Status) -> None:
        """``grpc.client.call.duration``: from the call's start to its end."""
        _metrics.record(
            "grpc.client.call.duration",
            time.perf_counter() - self._call_start,
            {
                "grpc.method": self.method,
                "grpc.target": self.target,
                "grpc.status": status.code.name,
            },
        )


def counting(
    sizes: list[int],
    serializer: Callable[[Any], bytes] | None,
    deserializer: Callable[[bytes], Any] | None,
) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    """A66 ``grpc.client.attempt.{sent,rcvd}_total_compressed_message_size``:
    the (serializer, deserializer) of one attempt's grpcio call that add the
    serialized size of each request to ``sizes[0]`` and of each response to
    ``sizes[1]`` (:attr:`CallMetrics.sizes`, recorded at the attempt's end).
    Used only while metrics are on: the attempt then gets its own grpcio
    multicallable."""

    def serialize(message: Any) -> bytes:
        data = message if serializer is None else serializer(message)
        sizes[0] += len(data)
        return data

    def deserialize(data: bytes) -> Any:
        sizes[1] += len(data)
        return data if deserializer is None else deserializer(data)

    return serialize, deserialize
