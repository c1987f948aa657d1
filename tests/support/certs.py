"""Certificates made for a test session: certificate authorities, and server certificates
for chosen names and validity periods (expired ones included), written as PEM files that
brokers and clients read."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from msgsafe.cluster.base import TlsFiles

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
except ImportError:  # pragma: no cover - depends on the installation
    x509 = None  # type: ignore[assignment]

__all__ = ["Authority", "new_authority"]

_DAY = datetime.timedelta(days=1)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass(frozen=True)
class Authority:
    """A CA: its certificate file (what a client trusts) and what signs server certificates."""

    name: Any
    key: Any
    ca: Path

    def issue(
        self,
        directory: Path,
        stem: str,
        *,
        names: Sequence[str] = ("localhost",),
        ips: Sequence[str] = (),
        expired: bool = False,
    ) -> TlsFiles:
        """A server certificate for ``names`` and ``ips`` signed by this CA, valid now (or,
        with ``expired``, for one day that ended yesterday)."""
        key = ec.generate_private_key(ec.SECP256R1())
        start = _now() - (2 * _DAY if expired else datetime.timedelta(minutes=5))
        alt: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
        alt += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + _DAY)
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        files = TlsFiles(ca=self.ca, cert=directory / f"{stem}.pem", key=directory / f"{stem}.key")
        files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return files


def new_authority(directory: Path, name: str = "msgsafe test CA", stem: str = "ca") -> Authority:
    """A new self-signed CA whose certificate is ``directory/<stem>.pem``."""
    if x509 is None:
        pytest.fail("the TLS tests need the 'cryptography' package: pip install cryptography")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + _DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = directory / f"{stem}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Authority(name=subject, key=key, ca=path)
