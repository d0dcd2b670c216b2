"""Resource files served by a ManagementServer, reloaded when they change.

:class:`ServedFiles` owns the set of files behind a running server: the
shared files (served to every node without its own files) and per-node files.
``reload()`` reads each group again; a group that fails to load keeps the last
version that loaded (the server keeps serving it) and the reason, with file,
line and field, goes to ``log``. A group that loads and differs is pushed to
every connected client at once (the server bumps the changed types' versions).

Every load (at start and at each reload) also runs the lint over the group
(:mod:`pyxds.server.lint`): each config a client accepts but that cannot
serve goes to ``log`` as one ``warning: FILE:LINE: ...`` line, in file order.
With ``strict`` they are ``error:`` lines and the group is refused like a
file that does not load (at start :class:`CannotServeError`; on reload the
last good version stays served).

:class:`FileWatcher` calls ``reload()`` whenever one of the files changes,
using ``watchfiles`` (inotify/FSEvents/kqueue through the Rust ``notify``
crate), watching the files' directories so an editor's save-by-rename is seen.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence

from pyxds.server.files import ResourceFileError, merge_snapshots, read_resource_file
from pyxds.server.lint import report
from pyxds.server.server import ManagementServer
from pyxds.server.snapshot import Snapshot

Log = Callable[[str], None]


class CannotServeError(ResourceFileError):
    """``strict``: the files load, but some config in them cannot serve."""


class ServedFiles:
    """The files a server serves: ``files`` for every node, ``node_files[node]`` per node."""

    def __init__(
        self,
        server: ManagementServer,
        files: Sequence[str],
        node_files: Mapping[str, Sequence[str]] | None = None,
        *,
        validate: bool = True,
        log: Log = print,
        strict: bool = False,
    ) -> None:
        self._server = server
        self._groups: dict[str | None, tuple[str, ...]] = {}
        # Files are watched by absolute path and named as the user gave them.
        self._shown: dict[str, str] = {}
        for node, given in [(None, files), *(node_files or {}).items()]:
            if given:
                self._groups[node] = tuple(os.path.abspath(f) for f in given)
                self._shown.update((os.path.abspath(f), f) for f in given)
        self._validate = validate
        self._strict = strict
        self._log = log
        self._lock = threading.Lock()
        self._good: dict[str | None, Snapshot] = {}

    @property
    def paths(self) -> set[str]:
        return {p for paths in self._groups.values() for p in paths}

    def _load(self, node: str | None, paths: Sequence[str]) -> Snapshot:
        """The group's Snapshot, after logging its lint lines (raises
        CannotServeError instead of returning when ``strict`` finds any)."""
        loaded = [read_resource_file(self._shown.get(p, p), validate=self._validate) for p in paths]
        snapshot = merge_snapshots([(f.path, f.snapshot) for f in loaded])
        lines = report(
            [e for f in loaded for e in f.entries],
            {f.path: f.text for f in loaded},
            "error" if self._strict else "warning",
        )
        whose = "" if node is None else f" (files of node {node!r})"
        for line in lines:
            self._log(line + whose)
        if lines and self._strict:
            n = len(lines)
            raise CannotServeError(
                f"{n} config{'s' if n != 1 else ''} that cannot serve (--strict){whose}"
            )
        return snapshot

    def load_initial(self) -> None:
        """Load every group and serve it; raises ResourceFileError on the first bad file."""
        with self._lock:
            for node, paths in self._groups.items():
                self._good[node] = self._load(node, paths)
            for node, snapshot in self._good.items():
                self._server.set_snapshot(snapshot, node_id=node)

    def reload(self, changed: set[str] | None = None) -> bool:
        """Reload the groups holding a ``changed`` file (all when None); False if any failed."""
        ok = True
        with self._lock:
            for node, paths in self._groups.items():
                if changed is not None and not changed.intersection(paths):
                    continue
                who = "every node" if node is None else f"node {node!r}"
                try:
                    snapshot = self._load(node, paths)
                except ResourceFileError as e:
                    ok = False
                    self._log(f"error: {e}; still serving the last good version to {who}")
                    continue
                if snapshot == self._good.get(node):
                    continue
                self._good[node] = snapshot
                self._server.set_snapshot(snapshot, node_id=node)
                shown = ", ".join(self._shown.get(p, p) for p in paths)
                self._log(f"reloaded {shown} for {who}")
        return ok


class FileWatcher:
    """Calls ``on_change(paths)`` when files among ``paths`` change (a daemon thread)."""

    def __init__(
        self, paths: set[str], on_change: Callable[[set[str]], object], debounce_ms: int = 100
    ) -> None:
        self._paths = {os.path.abspath(p) for p in paths}
        self._on_change = on_change
        self._debounce_ms = debounce_ms
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pyxds-file-watcher", daemon=True)

    def start(self) -> FileWatcher:
        self._thread.start()
        self._ready.wait(5)
        return self

    def _run(self) -> None:
        import watchfiles

        dirs = sorted({os.path.dirname(p) for p in self._paths})
        paths = self._paths

        def wanted(_change: object, path: str) -> bool:
            return os.path.abspath(path) in paths

        for changes in watchfiles.watch(
            *dirs,
            watch_filter=wanted,
            stop_event=self._stop,
            debounce=self._debounce_ms,
            step=50,
            rust_timeout=100,
            yield_on_timeout=True,
            raise_interrupt=False,
        ):
            # The first (empty) yield means the OS watch is in place.
            self._ready.set()
            if changes:
                self._on_change({os.path.abspath(path) for _, path in changes})

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
