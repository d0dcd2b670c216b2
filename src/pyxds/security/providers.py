"""Certificate providers named by the bootstrap's ``certificate_providers``
(gRFC A29 "Certificate Provider Plugin Framework", ``file_watcher``; gRFC
A87 SPIFFE trust bundle maps).

A provider instance is shared by every channel of the process that uses the
same plugin and config (:func:`get_provider`).  ``file_watcher`` re-reads its
files when ``refresh_interval`` (default 600 s; whole seconds, at least 1, as
C-core) has passed since the last read, checked each time a connection asks
for certificates, so a connection made after a rotation uses the new files
and no thread polls the disk in between.

What a read failure does, as C-core's provider and certificate distributor:

* A file that cannot be read (missing, no permission) or a SPIFFE bundle
  map that does not load keeps what the last good read gave (logged); with
  no good read yet it is an error for every connection that needs it
  ("<field> <path>: <reason>").
* A file that reads but holds garbage (empty, truncated, not PEM) *replaces*
  the last good content: connections then fail when their TLS context is
  built from it (C-core's handshaker factory fails the same way).
* The key and certificate count as one read only if neither file's mtime
  changed while reading (a rotation caught half-way is read again, up to 3
  times, as C-core).

A87: with ``GRPC_EXPERIMENTAL_XDS_MTLS_SPIFFE`` true, ``spiffe_bundle_map_file``
(C-core's name; ``spiffe_trust_bundle_map_file``, A87's and grpc-go/java's
name, is read too) replaces ``ca_certificate_file`` as the roots: the
provider then gives a :class:`~pyxds.security.spiffe.SpiffeBundleMap`
instead of CA certificates.  Without the switch the field is ignored, as
C-core.

API (kept stable for the server side): :func:`get_provider`,
:meth:`FileWatcherProvider.certificates` -> :class:`Certificates`
(``spiffe`` is new, last and defaulted), :func:`validate_file_watcher_config`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pyxds._duration import DurationError, parse_duration
from pyxds._values import dataclass
from pyxds.security import experiments

if TYPE_CHECKING:  # SPIFFE bundle maps load with the first provider that names one
    from pyxds.security.spiffe import SpiffeBundleMap

_log = logging.getLogger(__name__)

DEFAULT_REFRESH_INTERVAL = 600.0
MIN_REFRESH_INTERVAL = 1.0
_IDENTITY_READ_ATTEMPTS = 3
SPIFFE_FIELD = "spiffe_bundle_map_file"  # C-core's name
SPIFFE_FIELD_A87 = "spiffe_trust_bundle_map_file"  # A87's (and grpc-go's, grpc-java's)


class CertificateError(Exception):
    """A provider cannot give the certificates a connection needs."""


@dataclass(frozen=True)
class Certificates:
    """What a provider holds now; ``version`` changes with the content.
    The roots are ``ca_pem`` or, for a SPIFFE provider (A87), ``spiffe``;
    ``ca_error`` says why there are none."""

    ca_pem: bytes | None
    cert_pem: bytes | None
    key_pem: bytes | None
    ca_error: str | None
    identity_error: str | None
    version: int
    spiffe: SpiffeBundleMap | None = None


def spiffe_map_file(config: Mapping[str, Any]) -> str | None:
    """The SPIFFE bundle map file a ``file_watcher`` config names, when A87
    is switched on (either spelling of the field)."""
    if not experiments.spiffe_enabled():
        return None
    value = config.get(SPIFFE_FIELD) or config.get(SPIFFE_FIELD_A87)
    return value if isinstance(value, str) and value else None


def validate_file_watcher_config(config: Any, path: str) -> list[str]:
    """C-core's checks of a ``file_watcher`` config; errors as "field: problem"."""
    errs: list[str] = []
    if not isinstance(config, dict):
        return [f"{path}: is not an object"]
    spiffe = experiments.spiffe_enabled()
    names = ["certificate_file", "private_key_file", "ca_certificate_file"]
    if spiffe:
        names += [SPIFFE_FIELD, SPIFFE_FIELD_A87]
    for name in names:
        if name in config and not isinstance(config[name], str):
            errs.append(f"{path}.{name}: is not a string")
    if ("certificate_file" in config) != ("private_key_file" in config):
        errs.append(
            f'{path}: fields "certificate_file" and "private_key_file" must be both set or '
            "both unset"
        )
    if spiffe:
        both = config.get(SPIFFE_FIELD), config.get(SPIFFE_FIELD_A87)
        if all(isinstance(v, str) and v for v in both) and both[0] != both[1]:
            errs.append(
                f'{path}: fields "{SPIFFE_FIELD}" and "{SPIFFE_FIELD_A87}" name different files'
            )
        if not any(
            n in config
            for n in ("certificate_file", "ca_certificate_file", SPIFFE_FIELD, SPIFFE_FIELD_A87)
        ):
            errs.append(
                f'{path}: at least one of "certificate_file", "ca_certificate_file", and '
                f'"{SPIFFE_FIELD}" must be specified'
            )
    elif "certificate_file" not in config and "ca_certificate_file" not in config:
        errs.append(
            f'{path}: at least one of "certificate_file" and "ca_certificate_file" must be '
            "specified"
        )
    if "refresh_interval" in config:
        try:
            parse_duration(config["refresh_interval"])
        except DurationError as err:
            errs.append(f"{path}.refresh_interval: {err}")
    return errs


def _read(field_name: str, path: str) -> tuple[bytes | None, str | None]:
    """The file's bytes (possibly empty), or why it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(), None
    except OSError as err:
        return None, f"{field_name} {path}: {err.strerror or err}"


class FileWatcherProvider:
    """The ``file_watcher`` plugin (A29, A87)."""

    def __init__(
        self, config: Mapping[str, Any], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.certificate_file = config.get("certificate_file") or None
        self.private_key_file = config.get("private_key_file") or None
        self.spiffe_bundle_map_file = spiffe_map_file(config)
        # A87: with a bundle map the CA file is ignored (forward compatibility).
        self.ca_certificate_file = (
            None if self.spiffe_bundle_map_file else config.get("ca_certificate_file") or None
        )
        interval = parse_duration(config.get("refresh_interval", f"{DEFAULT_REFRESH_INTERVAL:g}s"))
        self.refresh_interval = max(MIN_REFRESH_INTERVAL, float(int(interval)))
        self._clock = clock
        self._lock = threading.Lock()
        self._current: Certificates | None = None
        self._read_at = 0.0
        self._version = 0
        self._logged: set[str] = set()

    def certificates(self) -> Certificates:
        """The certificates now, re-reading the files if the interval passed."""
        with self._lock:
            now = self._clock()
            if self._current is None or now - self._read_at >= self.refresh_interval:
                self._current = self._load(self._current)
                self._read_at = now
            return self._current

    def _log_once(self, problem: str, kept: bool) -> None:
        if problem not in self._logged:
            self._logged.add(problem)
            tail = "; the last good content stays in use" if kept else ""
            _log.error("pyxds certificate provider: %s%s", problem, tail)

    def _load(self, previous: Certificates | None) -> Certificates:
        ca = cert = key = None
        spiffe: SpiffeBundleMap | None = None
        ca_err = id_err = None
        if self.spiffe_bundle_map_file:
            path = self.spiffe_bundle_map_file
            from pyxds.security.spiffe import load_bundle_map

            try:
                spiffe = load_bundle_map(path)
            except (OSError, ValueError) as err:
                reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
                problem = f"spiffe bundle map file {path} failed to load: {reason}"
                if previous is not None and previous.spiffe is not None:
                    spiffe = previous.spiffe  # A87: errors do not affect the map in use
                    self._log_once(problem, kept=True)
                else:
                    ca_err = problem
                    self._log_once(problem, kept=False)
        elif self.ca_certificate_file:
            ca, ca_err = _read("ca_certificate_file", self.ca_certificate_file)
            if ca_err is not None:
                if previous is not None and previous.ca_pem is not None:
                    self._log_once(ca_err, kept=True)
                    ca, ca_err = previous.ca_pem, None
                else:
                    self._log_once(ca_err, kept=False)
        else:
            ca_err = "no ca_certificate_file configured"
        if self.certificate_file and self.private_key_file:
            cert, key, id_err = self._read_identity()
            if id_err is not None:
                if previous is not None and previous.cert_pem is not None:
                    self._log_once(id_err, kept=True)
                    cert, key, id_err = previous.cert_pem, previous.key_pem, None
                else:
                    self._log_once(id_err, kept=False)
        else:
            id_err = "no certificate_file configured"
        content = (ca, cert, key, ca_err, id_err, spiffe)
        if previous is not None and content == (
            previous.ca_pem,
            previous.cert_pem,
            previous.key_pem,
            previous.ca_error,
            previous.identity_error,
            previous.spiffe,
        ):
            return previous
        if ca_err is None and id_err is None:
            self._logged.clear()  # a later failure is news again
        self._version += 1
        return Certificates(ca, cert, key, ca_err, id_err, self._version, spiffe)

    def _read_identity(self) -> tuple[bytes | None, bytes | None, str | None]:
        assert self.certificate_file and self.private_key_file
        error = None
        for _ in range(_IDENTITY_READ_ATTEMPTS):
            before = _mtimes(self.private_key_file, self.certificate_file)
            cert, error = _read("certificate_file", self.certificate_file)
            if error is not None:
                continue
            key, error = _read("private_key_file", self.private_key_file)
            if error is not None:
                continue
            if before is not None and before == _mtimes(
                self.private_key_file, self.certificate_file
            ):
                return cert, key, None
            error = "certificate_file and private_key_file changed while being read"
        return None, None, error


def _mtimes(*paths: str) -> tuple[int, ...] | None:
    try:
        return tuple(os.stat(p).st_mtime_ns for p in paths)
    except OSError:
        return None


_registry_lock = threading.Lock()
_registry: dict[tuple[str, str], FileWatcherProvider] = {}


def get_provider(plugin_name: str, config_json: str) -> FileWatcherProvider:
    """The process-wide provider instance for this plugin and config."""
    key = (plugin_name, config_json)
    with _registry_lock:
        provider = _registry.get(key)
        if provider is None:
            if plugin_name != "file_watcher":
                raise CertificateError(f"unknown certificate provider plugin {plugin_name!r}")
            config = json.loads(config_json)
            errs = validate_file_watcher_config(config, "config")
            if errs:
                raise CertificateError("; ".join(errs))
            provider = _registry[key] = FileWatcherProvider(config)
        return provider
