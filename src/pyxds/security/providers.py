"""Certificate providers named by the bootstrap's ``certificate_providers``
(gRFC A29 "Certificate Provider Plugin Framework", ``file_watcher``).

A provider instance is shared by every channel of the process that uses the
same plugin and config (:func:`get_provider`).  ``file_watcher`` re-reads its
files when ``refresh_interval`` (default 600 s; whole seconds, at least 1, as
C-core) has passed since the last read, checked each time a connection asks for certificates, so a
connection made after a rotation uses the new files and no thread polls the
disk in between.  A file that cannot be read is an error for every
connection that needs it ("<field> <path>: <reason>"), as C-core clears the
certificate when a read fails; the next read after the interval may recover.
The key and certificate count as one read only if neither file's mtime
changed while reading (a rotation caught half-way is read again, up to 3
times, as C-core).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_REFRESH_INTERVAL = 600.0
MIN_REFRESH_INTERVAL = 1.0
_IDENTITY_READ_ATTEMPTS = 3


class CertificateError(Exception):
    """A provider cannot give the certificates a connection needs."""


@dataclass(frozen=True)
class Certificates:
    """What a provider holds now; ``version`` changes with the content."""

    ca_pem: bytes | None
    cert_pem: bytes | None
    key_pem: bytes | None
    ca_error: str | None
    identity_error: str | None
    version: int


def parse_duration(text: Any, path: str) -> float:
    """A protobuf JSON Duration ("1.5s")."""
    if not isinstance(text, str) or not text.endswith("s"):
        raise ValueError(f'{path}: not a Duration string (e.g. "60s"): {text!r}')
    try:
        value = float(text[:-1])
    except ValueError:
        raise ValueError(f'{path}: not a Duration string (e.g. "60s"): {text!r}') from None
    if value < 0:
        raise ValueError(f"{path}: must be non-negative")
    return value


def validate_file_watcher_config(config: Any, path: str) -> list[str]:
    """C-core's checks of a ``file_watcher`` config; errors as "field: problem"."""
    errs: list[str] = []
    if not isinstance(config, dict):
        return [f"{path}: is not an object"]
    for name in ("certificate_file", "private_key_file", "ca_certificate_file"):
        if name in config and not isinstance(config[name], str):
            errs.append(f"{path}.{name}: is not a string")
    if ("certificate_file" in config) != ("private_key_file" in config):
        errs.append(
            f'{path}: fields "certificate_file" and "private_key_file" must be both set or '
            "both unset"
        )
    if "certificate_file" not in config and "ca_certificate_file" not in config:
        errs.append(
            f'{path}: at least one of "certificate_file" and "ca_certificate_file" must be '
            "specified"
        )
    if "refresh_interval" in config:
        try:
            parse_duration(config["refresh_interval"], f"{path}.refresh_interval")
        except ValueError as err:
            errs.append(str(err))
    return errs


def _read(field_name: str, path: str) -> tuple[bytes | None, str | None]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        return None, f"{field_name} {path}: {err.strerror or err}"
    if not data.strip():
        return None, f"{field_name} {path}: file is empty"
    return data, None


class FileWatcherProvider:
    """The ``file_watcher`` plugin (A29)."""

    def __init__(
        self, config: Mapping[str, Any], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.certificate_file = config.get("certificate_file") or None
        self.private_key_file = config.get("private_key_file") or None
        self.ca_certificate_file = config.get("ca_certificate_file") or None
        interval = parse_duration(
            config.get("refresh_interval", f"{DEFAULT_REFRESH_INTERVAL:g}s"), "refresh_interval"
        )
        self.refresh_interval = max(MIN_REFRESH_INTERVAL, float(int(interval)))
        self._clock = clock
        self._lock = threading.Lock()
        self._current: Certificates | None = None
        self._read_at = 0.0
        self._version = 0

    def certificates(self) -> Certificates:
        """The certificates now, re-reading the files if the interval passed."""
        with self._lock:
            now = self._clock()
            if self._current is None or now - self._read_at >= self.refresh_interval:
                self._current = self._load(self._current)
                self._read_at = now
            return self._current

    def _load(self, previous: Certificates | None) -> Certificates:
        ca = cert = key = None
        ca_err = id_err = None
        if self.ca_certificate_file:
            ca, ca_err = _read("ca_certificate_file", self.ca_certificate_file)
        else:
            ca_err = "no ca_certificate_file configured"
        if self.certificate_file and self.private_key_file:
            cert, key, id_err = self._read_identity()
        else:
            id_err = "no certificate_file configured"
        content = (ca, cert, key, ca_err, id_err)
        if previous is not None and content == (
            previous.ca_pem,
            previous.cert_pem,
            previous.key_pem,
            previous.ca_error,
            previous.identity_error,
        ):
            return previous
        self._version += 1
        return Certificates(ca, cert, key, ca_err, id_err, self._version)

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
