"""The listeners of a :class:`~msgsafe.cluster.kafka.KafkaCluster` node and their
security settings: ``PLAINTEXT`` (clients and brokers) and ``CONTROLLER`` always; with
TLS, ``SSL`` (client certificate required) and ``EXPIRED`` (presents the expired
certificate), advertised by the name the certificates name; with SCRAM users,
``SASL`` (SASL_PLAINTEXT, SCRAM-SHA-256 and -512), the users created when the storage is
formatted (``--add-scram``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from msgsafe.cluster import tls as cluster_tls

__all__ = ["SCRAM_MECHANISMS", "NodeListeners", "properties", "scram_arguments"]

#: The SCRAM mechanisms the SASL listener offers; users get credentials for each.
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
_LOOPBACK = "127.0.0.1"
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


@dataclass(frozen=True, slots=True)
class NodeListeners:
    """One node's ports; the optional ones are None when that listener is off."""

    plain: int
    controller: int
    tls: int | None = None
    expired: int | None = None
    sasl: int | None = None


def _tls_store(
    name: str, store: str, client_auth: str, tls: cluster_tls.ClusterTls
) -> dict[str, str]:
    prefix = f"listener.name.{name}."
    password = cluster_tls.STORE_PASSWORD
    return {
        prefix + "ssl.keystore.type": "PKCS12",
        prefix + "ssl.keystore.location": str(tls.store(store)),
        prefix + "ssl.keystore.password": password,
        prefix + "ssl.key.password": password,
        prefix + "ssl.truststore.type": "PKCS12",
        prefix + "ssl.truststore.location": str(tls.store("trust")),
        prefix + "ssl.truststore.password": password,
        prefix + "ssl.client.auth": client_auth,
    }


def properties(ports: NodeListeners, tls: cluster_tls.ClusterTls | None) -> dict[str, str]:
    """``listeners``, ``advertised.listeners``, the protocol map and each optional
    listener's settings for one node."""
    # (name, bound to, advertised as, security protocol)
    rows = [
        ("PLAINTEXT", _LOOPBACK, _LOOPBACK, "PLAINTEXT", ports.plain),
        ("CONTROLLER", _LOOPBACK, None, "PLAINTEXT", ports.controller),
    ]
    props: dict[str, str] = {}
    if tls is not None and ports.tls is not None and ports.expired is not None:
        rows.append(("SSL", _LOOPBACK, cluster_tls.HOST, "SSL", ports.tls))
        rows.append(("EXPIRED", _LOOPBACK, cluster_tls.HOST, "SSL", ports.expired))
        props.update(_tls_store("ssl", "server", "required", tls))
        props.update(_tls_store("expired", "expired", "none", tls))
    if ports.sasl is not None:
        rows.append(("SASL", _LOOPBACK, _LOOPBACK, "SASL_PLAINTEXT", ports.sasl))
        props["listener.name.sasl.sasl.enabled.mechanisms"] = ",".join(SCRAM_MECHANISMS)
        for mechanism in SCRAM_MECHANISMS:
            props[f"listener.name.sasl.{mechanism.lower()}.sasl.jaas.config"] = _SCRAM_MODULE
    props["listeners"] = ",".join(f"{n}://{bind}:{p}" for n, bind, _, _, p in rows)
    props["advertised.listeners"] = ",".join(
        f"{n}://{adv}:{p}" for n, _, adv, _, p in rows if adv is not None
    )
    props["listener.security.protocol.map"] = ",".join(f"{n}:{proto}" for n, _, _, proto, _ in rows)
    return props


def scram_arguments(users: Mapping[str, str]) -> list[str]:
    """``kafka-storage format`` arguments that create ``users`` (name -> password) with
    credentials for every mechanism in :data:`SCRAM_MECHANISMS`."""
    args: list[str] = []
    for name, password in users.items():
        for mechanism in SCRAM_MECHANISMS:
            args += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
    return args
