"""Test certificates made on the fly with ``cryptography`` (a test extra):
a CA, intermediate CAs (chains of any length), leaf certificates with DNS /
URI (SPIFFE) / IP / email SANs, expired ones, file sets for the
``file_watcher`` certificate provider (A29) and SPIFFE trust bundle maps in
the JSON shape C-core reads (A87)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from typing import Any

from pyxds._values import dataclass


@dataclass(frozen=True)
class Pem:
    cert: bytes
    key: bytes


def _key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    pem: bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return pem


class CertAuthority:
    """A self-signed CA that issues leaf certificates."""

    def __init__(self, name: str = "pyxds test CA", parent: CertAuthority | None = None) -> None:
        """A self-signed root, or an intermediate CA signed by ``parent``."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.x509.oid import NameOID

        self._key = _key()
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.parent = parent
        issuer_name = parent._name if parent is not None else self._name
        signer = parent._key if parent is not None else self._key
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(issuer_name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(signer, hashes.SHA256())
        )

    @property
    def pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self._cert.public_bytes(serialization.Encoding.PEM)

    @property
    def der(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self._cert.public_bytes(serialization.Encoding.DER)

    def intermediate(self, name: str) -> CertAuthority:
        """A CA signed by this one."""
        return CertAuthority(name, parent=self)

    @property
    def chain_pem(self) -> bytes:
        """This CA's certificate and its parents' up to (not including) the
        root: what a server sends after its leaf."""
        out = b""
        ca: CertAuthority | None = self
        while ca is not None and ca.parent is not None:
            out += ca.pem
            ca = ca.parent
        return out

    def issue(
        self,
        common_name: str = "leaf",
        dns: tuple[str, ...] = (),
        uris: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        emails: tuple[str, ...] = (),
        expired: bool = False,
    ) -> Pem:
        """A leaf for server and client auth with the given SANs."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        if expired:
            start, end = now - datetime.timedelta(days=10), now - datetime.timedelta(days=1)
        else:
            start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=10)
        sans: list[Any] = [x509.DNSName(d) for d in dns]
        sans += [x509.UniformResourceIdentifier(u) for u in uris]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        sans += [x509.RFC822Name(e) for e in emails]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        from cryptography.hazmat.primitives import serialization

        cert = builder.sign(self._key, hashes.SHA256())
        leaf = cert.public_bytes(serialization.Encoding.PEM)
        return Pem(leaf + self.chain_pem, _key_pem(key))


def write_files(folder: str, ca_pem: bytes, leaf: Pem | None, prefix: str = "") -> dict[str, Any]:
    """Write a file_watcher file set; returns its bootstrap ``config``."""
    os.makedirs(folder, exist_ok=True)
    config: dict[str, Any] = {}
    path = os.path.join(folder, f"{prefix}ca.pem")
    with open(path, "wb") as f:
        f.write(ca_pem)
    config["ca_certificate_file"] = path
    if leaf is not None:
        cert = os.path.join(folder, f"{prefix}cert.pem")
        key = os.path.join(folder, f"{prefix}key.pem")
        with open(cert, "wb") as f:
            f.write(leaf.cert)
        with open(key, "wb") as f:
            f.write(leaf.key)
        config["certificate_file"] = cert
        config["private_key_file"] = key
    return config


def spiffe_bundle_map(bundles: dict[str, list[CertAuthority]], **key_fields: Any) -> dict[str, Any]:
    """A SPIFFE trust bundle map as C-core reads it (A87): ``{"trust_domains":
    {domain: {"keys": [{"use": "x509-svid", "kty": "EC", "x5c": [base64 DER]}]}}}``;
    ``key_fields`` override or add fields of every key (None removes one)."""
    import base64

    domains: dict[str, Any] = {}
    for domain, cas in bundles.items():
        keys = []
        for ca in cas:
            key: dict[str, Any] = {
                "use": "x509-svid",
                "kty": "EC",
                "x5c": [base64.b64encode(ca.der).decode()],
            }
            for name, value in key_fields.items():
                if value is None:
                    key.pop(name, None)
                else:
                    key[name] = value
            keys.append(key)
        domains[domain] = {"spiffe_sequence": 1, "keys": keys}
    return {"trust_domains": domains}


def write_spiffe_bundle_map(path: str, bundle_map: dict[str, Any]) -> str:
    """Write ``bundle_map`` (see :func:`spiffe_bundle_map`) as JSON; returns ``path``."""
    import json

    with open(path, "w") as f:
        json.dump(bundle_map, f)
    return path
