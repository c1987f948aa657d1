"""Certificates for a cluster's TLS listeners (``msgsafe cluster up KIND --tls``).

:func:`make` writes into ``DIR/tls/``, with ``trustme`` (``pip install 'msgsafe[tls]'``):

- ``ca.pem`` — the CA that signed everything below; clients trust it (``tls_ca_file=``)
  and the listeners verify client certificates against it;
- ``server.pem`` / ``server.key`` — what every TLS listener presents: valid now, for the
  host name ``localhost`` only (so ``127.0.0.1`` is a host name it does not name);
- ``client.pem`` / ``client.key`` — a client certificate the listeners accept
  (``tls_cert_file=`` / ``tls_key_file=``): the listeners require one (mutual TLS);
- ``expired.pem`` / ``expired.key`` — the same names, valid for one day that ended
  yesterday: where a launcher has a second listener presenting it (``expired_port``), a
  client's refusal of a certificate that can never verify is checked on the real broker;
- ``other-ca.pem`` — a CA that signed nothing here: a client trusting only it must refuse
  every listener (the untrusted-CA case);
- ``server.p12``, ``expired.p12``, ``trust.p12`` — the same keys and the CA as PKCS#12
  stores for the Java brokers (password :data:`STORE_PASSWORD`: a throw-away store on
  loopback, not a secret).

Every private key is written with mode 0600.
"""

from __future__ import annotations

import datetime
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from msgsafe.cluster.base import ClusterError, TlsFiles

__all__ = ["STORE_PASSWORD", "ClusterTls", "make", "load"]

#: The password of the PKCS#12 stores the Java brokers read (Java refuses an empty one).
STORE_PASSWORD = "msgsafe-local"
#: The host name the server certificates name.
HOST = "localhost"


@dataclass(frozen=True, slots=True)
class ClusterTls:
    """The files :func:`make` wrote (see the module docstring)."""

    dir: Path

    def _path(self, name: str) -> Path:
        return self.dir / name

    @property
    def server(self) -> TlsFiles:
        """The good listener's files (client certificates required)."""
        return TlsFiles(
            ca=self._path("ca.pem"),
            cert=self._path("server.pem"),
            key=self._path("server.key"),
            require_client_cert=True,
        )

    @property
    def expired(self) -> TlsFiles:
        """An expired certificate for the same host name, signed by the same CA."""
        return TlsFiles(
            ca=self._path("ca.pem"), cert=self._path("expired.pem"), key=self._path("expired.key")
        )

    @property
    def ca(self) -> Path:
        return self._path("ca.pem")

    @property
    def other_ca(self) -> Path:
        return self._path("other-ca.pem")

    @property
    def client_cert(self) -> Path:
        return self._path("client.pem")

    @property
    def client_key(self) -> Path:
        return self._path("client.key")

    def store(self, stem: str) -> Path:
        """A PKCS#12 store: ``server``, ``expired`` (key and chain) or ``trust`` (the CA)."""
        return self._path(f"{stem}.p12")

    def query(self, *, ca: Path | None = None, client: bool = True) -> str:
        """The URL query a msgsafe client needs for these listeners (``ca`` None: the
        cluster's CA; ``client``: present the client certificate)."""
        parts = [f"tls_ca_file={ca or self.ca}"]
        if client:
            parts += [f"tls_cert_file={self.client_cert}", f"tls_key_file={self.client_key}"]
        return "&".join(parts)

    def describe(self) -> dict[str, Any]:
        """The paths ``msgsafe cluster up --tls --json`` prints."""
        return {
            "ca": str(self.ca),
            "server_cert": str(self.server.cert),
            "server_key": str(self.server.key),
            "client_cert": str(self.client_cert),
            "client_key": str(self.client_key),
            "expired_cert": str(self.expired.cert),
            "other_ca": str(self.other_ca),
            "host": HOST,
        }


def load(dir: Path) -> ClusterTls:
    """The certificates :func:`make` wrote into ``dir/tls`` (a cluster started again)."""
    tls = ClusterTls(Path(dir) / "tls")
    if not tls.server.cert.exists():
        raise ClusterError(f"{tls.dir} holds no certificates; start the cluster with --tls anew")
    return tls


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)


def _pkcs8(pem: bytes) -> bytes:
    # NOTE: Kafka's PEM key store reads only unencrypted PKCS#8 ("BEGIN PRIVATE KEY");
    # trustme writes the traditional OpenSSL form.
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pem, password=None)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _p12(path: Path, cert_pem: bytes, key_pem: bytes, ca_pem: bytes) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    key = serialization.load_pem_private_key(key_pem, password=None)
    data = pkcs12.serialize_key_and_certificates(
        b"server",
        key,  # type: ignore[arg-type]
        x509.load_pem_x509_certificate(cert_pem),
        [x509.load_pem_x509_certificate(ca_pem)],
        serialization.BestAvailableEncryption(STORE_PASSWORD.encode()),
    )
    _write_private(path, data)


def _trust_store(path: Path, ca: Path) -> None:
    # NOTE: Java loads certificate-only PKCS#12 entries as trusted only with Oracle's
    # trusted-key-usage attribute, which keytool writes and cryptography does not.
    from msgsafe.cluster.maven import java

    keytool = Path(java()).with_name("keytool")
    path.unlink(missing_ok=True)
    argv = [str(keytool), "-importcert", "-noprompt", "-alias", "ca", "-file", str(ca)]
    argv += ["-keystore", str(path), "-storetype", "PKCS12", "-storepass", STORE_PASSWORD]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise ClusterError(f"keytool could not write {path}: {proc.stdout}{proc.stderr}")


def make(dir: Path, *, java_stores: bool = False) -> ClusterTls:
    """Write a new set of certificates into ``dir/tls`` (see the module docstring);
    ``java_stores``: also the PKCS#12 stores (needs a JDK's ``keytool``)."""
    try:
        import trustme
    except ImportError:
        raise ClusterError("--tls needs trustme: pip install 'msgsafe[tls]'") from None
    tls = ClusterTls(Path(dir) / "tls")
    tls.dir.mkdir(parents=True, exist_ok=True)
    ca, other = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(tls.ca))
    other.cert_pem.write_to_path(str(tls.other_ca))
    now = datetime.datetime.now(datetime.UTC)
    day = datetime.timedelta(days=1)
    issued = {
        "server": ca.issue_cert(HOST),
        "client": ca.issue_cert("msgsafe-client"),
        "expired": ca.issue_cert(HOST, not_before=now - 2 * day, not_after=now - day),
    }
    for stem, leaf in issued.items():
        cert_pem = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
        key_pem = _pkcs8(leaf.private_key_pem.bytes())
        (tls.dir / f"{stem}.pem").write_bytes(cert_pem)
        _write_private(tls.dir / f"{stem}.key", key_pem)
        if java_stores and stem != "client":
            _p12(tls.store(stem), cert_pem, key_pem, ca.cert_pem.bytes())
    if java_stores:
        _trust_store(tls.store("trust"), tls.ca)
    return tls
