"""Worker threads that exist only while there is work (issue 18: a program
that closed every channel keeps no pyxds thread).

Rules:

1. A thread starts when a function is queued and no worker is idle, up to
   ``max_workers``; with ``max_workers=1`` functions run one at a time in
   the order submitted.
2. A worker idle for ``linger`` seconds exits.  A function queued while it
   decides is never stranded: the decision and :meth:`LingeringPool.submit`
   take the same lock, and a worker leaves only with the queue empty.
3. A function that raises is logged (naming the pool's ``label``) and the
   worker goes on.
4. :meth:`LingeringPool.flush` waits, bounded, for what was queued before
   it; called from one of the pool's own workers it returns at once (it
   would wait for itself).  When no worker runs and none can start (rule 6:
   Python 3.12 refuses every new thread once the interpreter is exiting,
   in its atexit hooks), the flushing thread runs what is queued itself,
   as a worker would (in order; a ``submit`` meanwhile queues behind it),
   and returns True.  (It raised, so the exit hook's close of an xDS
   client said "not waited" and left the callbacks queued before it.)
5. :meth:`LingeringPool.shutdown` drops what is queued; a running function
   finishes.
6. When a worker cannot start (``Thread.start`` raises: the process is out
   of threads or memory), :meth:`LingeringPool.submit` takes back the counts
   it raised and the function it queued, and raises a ``RuntimeError`` that
   names the pool: the function never runs, and later submits start workers
   as if it had not happened.  (Counts left raised made later submits trust
   a worker that did not exist, and their functions never ran.)  A function
   queued meanwhile by another submit runs with the next worker that starts.

``concurrent.futures.ThreadPoolExecutor`` keeps idle workers for the life
of the process, which is why pyxds does not use it for background work.
The DNS resolver (up to 4 lookups at once) and the xDS client's watcher
notifications (one serial worker for every client of the process) run here.

The queue is a deque under the pool's lock, and an idle worker waits on a
condition of that lock: CPython 3.11's ``queue.SimpleQueue.get(timeout=)``
can block past its timeout, until the next ``put``, when it wakes after its
deadline to a queue another consumer emptied (its remaining timeout goes
negative, which the lock reads as "forever"), so a worker waiting there
for its linger stayed alive with nothing to do (rule 2 broken; seen in
tests/unit/test_lingering_pool.py under CPU load).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

__all__ = ["LingeringPool"]

_log = logging.getLogger(__name__)


class LingeringPool:
    """Runs submitted functions on at most ``max_workers`` daemon threads
    named ``{name}_{n}``; see the module's rules."""

    def __init__(self, max_workers: int, name: str, linger: float, label: str) -> None:
        self._max = max_workers
        self._name = name
        self._linger = linger
        self._label = label
        self._queue: deque[Callable[[], None]] = deque()  # guarded by _lock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # idle workers wait here
        self._threads = 0
        self._idle = 0
        self._closed = False
        self._workers: set[int] = set()  # idents of the live workers

    @property
    def threads(self) -> int:
        """Worker threads alive now."""
        return self._threads

    def submit(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._closed:
                return
            self._queue.append(fn)
            if self._idle:
                self._wake.notify()
            if self._idle >= len(self._queue) or self._threads >= self._max:
                return
            self._threads += 1
            self._idle += 1
            number = self._threads
        try:
            threading.Thread(
                target=self._run, args=(self._linger,), name=f"{self._name}_{number}", daemon=True
            ).start()
        except Exception as exc:  # RuntimeError("can't start new thread"), MemoryError
            if self._undo_start(fn):
                raise RuntimeError(
                    f"pyxds: cannot start a thread for {self._label} ({self._name}): {exc}"
                ) from exc

    def _undo_start(self, fn: Callable[[], None]) -> bool:
        """A worker failed to start for ``fn`` (rule 6): take back the counts
        raised for it and ``fn`` from the queue.  False when a live worker
        has taken ``fn`` already (it runs: nothing to report)."""
        with self._lock:
            self._threads -= 1
            self._idle -= 1
            for index in range(len(self._queue) - 1, -1, -1):  # the one just put
                if self._queue[index] is fn:
                    del self._queue[index]  # the others keep their order
                    return True
            return False

    def on_worker(self) -> bool:
        """Whether the calling thread is one of this pool's workers."""
        return threading.get_ident() in self._workers

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the functions queued so far
        (rule 4).  True once they ran (or nothing was waiting)."""
        if self.on_worker():
            return True
        done = threading.Event()
        try:
            self.submit(done.set)
        except RuntimeError:  # no worker could start (rule 6)
            return self._work_here()
        with self._lock:
            if self._closed:
                return True  # nothing queued runs any more
        return done.wait(timeout)

    def _work_here(self) -> bool:
        """Run the queued functions on the calling thread, as a worker that
        exits once the queue is empty (rule 4); False when a worker started
        meanwhile (it runs them: the caller may wait again)."""
        with self._lock:
            if self._threads >= self._max:
                return False
            self._threads += 1
            self._idle += 1
        self._run(0.0)
        return True

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            self._queue.clear()

    def _run(self, linger: float) -> None:
        me = threading.get_ident()
        self._workers.add(me)
        try:
            self._work(linger)
        finally:
            self._workers.discard(me)

    def _work(self, linger: float) -> None:
        while True:
            with self._lock:
                if not self._queue and not self._wait(linger):
                    # idle for ``linger`` with the queue empty, under the
                    # lock a submit takes: it sees this worker gone (rule 2)
                    self._idle -= 1
                    self._threads -= 1
                    return
                fn = self._queue.popleft()
                self._idle -= 1
            try:
                fn()
            except Exception:
                _log.exception("pyxds: %s raised", self._label)
            with self._lock:
                self._idle += 1

    def _wait(self, linger: float) -> bool:
        """Under the lock, with the queue empty: wait up to ``linger``
        seconds for a function; False when none came.  (A wake-up whose
        function another worker took waits on, for the rest of the linger.)"""
        deadline = time.monotonic() + linger
        while not self._queue:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._wake.wait(remaining)
        return True
