"""The ``etc/broker.xml`` of an Artemis node of :class:`~msgsafe.cluster.artemis.ArtemisCluster`:
journal, acceptors (plain, and with TLS the ``tls`` and ``expired`` ones), the pair's
cluster connection and HA policy, security and address settings."""

from __future__ import annotations

from msgsafe.cluster.tls import STORE_PASSWORD, ClusterTls

__all__ = ["broker_xml", "xml_text"]


def xml_text(text: str) -> str:
    """``text`` escaped for an XML element or attribute."""
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )


_PRIMARY_POLICY = """\
      <replication>
        <primary>
          <check-for-active-server>true</check-for-active-server>
          <vote-on-replication-failure>false</vote-on-replication-failure>
          <initial-replication-sync-timeout>30000</initial-replication-sync-timeout>
        </primary>
      </replication>"""

_BACKUP_POLICY = """\
      <replication>
        <backup>
          <allow-failback>true</allow-failback>
          <restart-backup>true</restart-backup>
          <max-saved-replicated-journals-size>2</max-saved-replicated-journals-size>
        </backup>
      </replication>"""

# NOTE: one acceptor for CORE and AMQP: the cluster connection announces this node through
# the connector of the same port, and the primary's AMQP open frame advertises that
# connector as the fail-over candidate; a separate AMQP port would not be the one listed.
_AMQP_OPTIONS = (
    "useEpoll=true;amqpCredits=1000;amqpLowCredits=300;amqpMinLargeMessageSize=102400;"
    "amqpDuplicateDetection=true"
)

_BROKER_XML = """\
<?xml version="1.0"?>
<configuration xmlns="urn:activemq"
               xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
               xsi:schemaLocation="urn:activemq /schema/artemis-configuration.xsd">
  <core xmlns="urn:activemq:core">
    <name>{name}</name>
    <persistence-enabled>true</persistence-enabled>
    <journal-type>NIO</journal-type>
    <journal-datasync>true</journal-datasync>
    <journal-file-size>2M</journal-file-size>
    <journal-min-files>2</journal-min-files>
    <journal-pool-files>4</journal-pool-files>
    <paging-directory>data/paging</paging-directory>
    <bindings-directory>data/bindings</bindings-directory>
    <journal-directory>data/journal</journal-directory>
    <large-messages-directory>data/large-messages</large-messages-directory>
    <max-disk-usage>98</max-disk-usage>
    <!-- A paused (SIGSTOP) node must not halt itself when it is resumed. -->
    <critical-analyzer>false</critical-analyzer>

    <connectors>
      <connector name="self">tcp://{host}:{port}</connector>
      <connector name="peer">tcp://{host}:{other_port}</connector>
    </connectors>
    <acceptors>
      <acceptor name="artemis">tcp://{host}:{port}?protocols=CORE,AMQP;{amqp_options}</acceptor>{tls_acceptors}
    </acceptors>

    <cluster-user>{cluster_user}</cluster-user>
    <cluster-password>{cluster_password}</cluster-password>
    <cluster-connections>
      <cluster-connection name="pair">
        <connector-ref>self</connector-ref>
        <!-- A SIGKILLed peer closes its sockets and is noticed at once; these bound only a
             silent one. Short values would promote the backup of a primary paused for a few
             seconds, and with no third voter both would then stay active (split brain). -->
        <check-period>30000</check-period>
        <connection-ttl>60000</connection-ttl>
        <retry-interval>500</retry-interval>
        <max-retry-interval>2000</max-retry-interval>
        <reconnect-attempts>-1</reconnect-attempts>
        <message-load-balancing>ON_DEMAND</message-load-balancing>
        <max-hops>0</max-hops>
        <static-connectors>
          <connector-ref>peer</connector-ref>
        </static-connectors>
      </cluster-connection>
    </cluster-connections>

    <ha-policy>
{ha_policy}
    </ha-policy>

    <security-settings>
      <security-setting match="#">
        <permission type="createNonDurableQueue" roles="amq"/>
        <permission type="deleteNonDurableQueue" roles="amq"/>
        <permission type="createDurableQueue" roles="amq"/>
        <permission type="deleteDurableQueue" roles="amq"/>
        <permission type="createAddress" roles="amq"/>
        <permission type="deleteAddress" roles="amq"/>
        <permission type="consume" roles="amq"/>
        <permission type="browse" roles="amq"/>
        <permission type="send" roles="amq"/>
        <permission type="manage" roles="amq"/>
      </security-setting>
    </security-settings>

    <address-settings>
      <!-- ANYCAST (the default here): a first send to a new address creates it with a
           durable anycast queue of the same name; with multicast, a client that does not
           ask for a queue (capability "queue") would have its message routed nowhere. -->
      <address-setting match="#">
        <dead-letter-address>DLQ</dead-letter-address>
        <expiry-address>ExpiryQueue</expiry-address>
        <redelivery-delay>0</redelivery-delay>
        <max-delivery-attempts>100</max-delivery-attempts>
        <address-full-policy>PAGE</address-full-policy>
        <max-size-bytes>-1</max-size-bytes>
        <page-size-bytes>2M</page-size-bytes>
        <auto-create-queues>true</auto-create-queues>
        <auto-create-addresses>true</auto-create-addresses>
        <auto-delete-queues>false</auto-delete-queues>
        <auto-delete-addresses>false</auto-delete-addresses>
        <default-address-routing-type>{routing}</default-address-routing-type>
        <default-queue-routing-type>{routing}</default-queue-routing-type>
      </address-setting>
    </address-settings>

    <addresses>
      <address name="DLQ"><anycast><queue name="DLQ"/></anycast></address>
      <address name="ExpiryQueue"><anycast><queue name="ExpiryQueue"/></anycast></address>
    </addresses>
  </core>
</configuration>
"""


def _tls_acceptor(name: str, host: str, port: int, keystore: str, trust: str | None) -> str:
    # NOTE: AMQP only: the pair's cluster connection and its fail-over announcements stay
    # on the plain acceptor, so these ports never appear in a failover-server-list.
    options = [
        "protocols=AMQP",
        _AMQP_OPTIONS,
        "sslEnabled=true",
        f"keyStorePath={keystore}",
        "keyStoreType=PKCS12",
        f"keyStorePassword={STORE_PASSWORD}",
    ]
    if trust is not None:
        options += [
            "needClientAuth=true",
            f"trustStorePath={trust}",
            "trustStoreType=PKCS12",
            f"trustStorePassword={STORE_PASSWORD}",
        ]
    url = xml_text(f"tcp://{host}:{port}?" + ";".join(options))
    return f'      <acceptor name="{name}">{url}</acceptor>'


def broker_xml(
    *,
    name: str,
    host: str,
    port: int,
    other_port: int,
    user: str,
    password: str,
    primary: bool,
    routing: str,
    tls: ClusterTls | None = None,
    tls_ports: tuple[int, int] | None = None,
) -> str:
    """The broker.xml of one node; ``tls`` with ``tls_ports`` (the ``tls`` acceptor, which
    requires a client certificate, and the ``expired`` one) adds two TLS acceptors."""
    acceptors = ""
    if tls is not None and tls_ports is not None:
        good, expired = tls_ports
        trust = str(tls.store("trust"))
        acceptors = "\n" + "\n".join(
            [
                _tls_acceptor("tls", host, good, str(tls.store("server")), trust),
                _tls_acceptor("expired", host, expired, str(tls.store("expired")), None),
            ]
        )
    return _BROKER_XML.format(
        name=name,
        host=host,
        port=port,
        other_port=other_port,
        cluster_user=xml_text(user),
        cluster_password=xml_text(password),
        ha_policy=_PRIMARY_POLICY if primary else _BACKUP_POLICY,
        routing=routing,
        amqp_options=_AMQP_OPTIONS,
        tls_acceptors=acceptors,
    )
