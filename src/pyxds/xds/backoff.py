"""Backoff between ADS stream attempts (gRFC A57 "Handling ADS Stream
Termination"; the connection-backoff algorithm of gRPC's
``doc/connection-backoff.md``).

Rules:

* Delays follow gRPC connection backoff: the first is ``INITIAL_BACKOFF``
  (1 s), each next one is the previous times ``MULTIPLIER`` (1.6), capped at
  ``MAX_BACKOFF`` (120 s); every delay is jittered by +-``JITTER`` (20 %).
* The sequence restarts from the initial delay once a stream has received a
  response (A57: "The backoff state will be reset when an ADS stream attempt
  does finally receive a response from the server").
* Never a tight loop (TRAPS.md, grpc-java#9029, grpc-go#5280): even after a
  stream that worked, the next stream starts no sooner than one backoff delay
  after the previous stream *started*.  A long-lived stream is therefore
  replaced at once, while a server that accepts streams, answers once and
  closes them can not make the client spin.

Everything here is plain arithmetic over an injected ``random.Random``; the
transport asks :meth:`StreamBackoff.on_stream_closed` for the delay and
schedules the next attempt on its clock.
"""

from __future__ import annotations

import random as _random

INITIAL_BACKOFF = 1.0
MULTIPLIER = 1.6
JITTER = 0.2
MAX_BACKOFF = 120.0


class ExponentialBackoff:
    """The gRPC connection-backoff sequence: ``next_delay()`` returns 1 s,
    1.6 s, 2.56 s, ... (each +-20 %), at most 120 s (+-20 %)."""

    # slots: every subchannel core has one (issue 18, memory per endpoint)
    __slots__ = ("_rng", "_initial", "_multiplier", "_jitter", "_max", "_current")

    def __init__(
        self,
        rng: _random.Random | None = None,
        *,
        initial: float = INITIAL_BACKOFF,
        multiplier: float = MULTIPLIER,
        jitter: float = JITTER,
        maximum: float = MAX_BACKOFF,
    ) -> None:
        if initial <= 0 or multiplier < 1 or not 0 <= jitter < 1 or maximum < initial:
            raise ValueError("invalid backoff parameters")
        self._rng = rng or _random.Random()
        self._initial = initial
        self._multiplier = multiplier
        self._jitter = jitter
        self._max = maximum
        self._current: float | None = None

    def next_delay(self) -> float:
        """The next delay in seconds (jittered)."""
        if self._current is None:
            self._current = self._initial
        else:
            self._current = min(self._current * self._multiplier, self._max)
        base = self._current
        return base + self._rng.uniform(-self._jitter * base, self._jitter * base)

    def reset(self) -> None:
        """Start the sequence again from the initial delay."""
        self._current = None


class StreamBackoff:
    """When to start the next ADS stream, per the rules of this module.

    Call :meth:`on_stream_started` when a stream starts, :meth:`on_response`
    for every response on it, and :meth:`on_stream_closed` when it ends; the
    latter returns the delay before the next attempt.
    """

    def __init__(self, backoff: ExponentialBackoff | None = None) -> None:
        self._backoff = backoff or ExponentialBackoff()
        self._started_at: float | None = None
        self._had_response = False

    @property
    def had_response(self) -> bool:
        """True when the current (or last) stream received a response."""
        return self._had_response

    def on_stream_started(self, now: float) -> None:
        self._started_at = now
        self._had_response = False

    def on_response(self) -> None:
        self._had_response = True

    def on_stream_closed(self, now: float) -> float:
        """The delay (seconds, >= 0) before the next stream attempt."""
        if self._had_response:
            self._backoff.reset()
        delay = self._backoff.next_delay()
        if self._had_response and self._started_at is not None:
            # The stream worked: only wait out what is left of one backoff
            # period counted from the stream's start.
            delay = max(0.0, delay - (now - self._started_at))
        self._had_response = False
        return delay

    def reset(self) -> None:
        """Forget the failure history (e.g. the application asked to reset
        connection backoff)."""
        self._backoff.reset()
