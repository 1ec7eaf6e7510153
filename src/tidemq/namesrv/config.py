"""NamesrvConfig: the name server's settings, under RocketMQ's key names.

Keys (``metadata["key"]``) are what RocketMQ's NamesrvConfig and NettyServerConfig call them,
so a ``namesrv.properties`` written for RocketMQ works here; ``tidemq.config_loader``
reads files and ``--<key> value`` options into this class.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tidemq.server_security import ServerSecurityConfig


@dataclass(slots=True)
class NamesrvConfig(ServerSecurityConfig):
    """Settings of one name server.

    Attributes:
        listen_port: TCP port (RocketMQ's 9876); 0 picks a free port.
        bind_address: address to listen on; loopback by default so a dev machine does not
            expose an unauthenticated name server (give 0.0.0.0 to serve other hosts).
        scan_not_active_broker_interval_ms: how often brokers that stopped registering are
            looked for.
        broker_channel_expired_time_ms: a broker not heard from for this long is dropped.
        order_message_enable: answer routes with ``orderTopicConf`` from the
            ORDER_TOPIC_CONFIG KV namespace.
        kv_config_path: file keeping the KV config across restarts; None keeps it in memory.
        enable_all_topic_list: serve GET_ALL_TOPIC_LIST_FROM_NAMESERVER.
        enable_topic_list: serve GET_TOPICS_BY_CLUSTER.
        delete_topic_with_broker_registration: a master's registration with a new topic
            table also drops topics it no longer lists (RocketMQ 5's option; off as in 4.x,
            where brokers may send only the topics that changed).
        server_channel_max_idle_time_seconds: close a connection idle this long.
        acl_enable: RocketMQ's aclEnable: a name server checks its write operations (KV
            config, topic deletion, broker write permission) against plain_acl.yml; reads
            stay open, as in RocketMQ.

    The ACL and TLS keys are ``ServerSecurityConfig``'s, shared with the broker.
    """

    listen_port: int = field(default=9876, metadata={"key": "listenPort", "min": 0,
                                                     "max": 65535})
    bind_address: str = field(default="127.0.0.1", metadata={
        "key": "bindAddress", "aliases": ("listenAddress",)})
    # RocketMQ 4.x scans every 10 s for brokers silent for 120 s: four missed registrations
    # (brokers register every 30 s) before a broker is dropped.
    scan_not_active_broker_interval_ms: int = field(default=10_000, metadata={
        "key": "scanNotActiveBrokerInterval", "min": 1})
    broker_channel_expired_time_ms: int = field(default=120_000, metadata={
        "key": "brokerChannelExpiredTime", "min": 1})
    order_message_enable: bool = field(default=False, metadata={"key": "orderMessageEnable"})
    kv_config_path: str | None = field(default=None, metadata={"key": "kvConfigPath"})
    enable_all_topic_list: bool = field(default=True, metadata={"key": "enableAllTopicList"})
    enable_topic_list: bool = field(default=True, metadata={"key": "enableTopicList"})
    delete_topic_with_broker_registration: bool = field(default=False, metadata={
        "key": "deleteTopicWithBrokerRegistration"})
    # RocketMQ's serverChannelMaxIdleTimeSeconds.
    server_channel_max_idle_time_seconds: int = field(default=120, metadata={
        "key": "serverChannelMaxIdleTimeSeconds", "min": 1})

    # Prometheus metrics (RocketMQ 5's keys; docs/monitoring.md): PROM serves /metrics on
    # metricsPromExporterHost (empty: bindAddress) : metricsPromExporterPort.
    metrics_exporter_type: str = field(default="DISABLE", metadata={
        "key": "metricsExporterType", "choices": ("DISABLE", "PROM")})
    metrics_prom_exporter_host: str = field(default="", metadata={
        "key": "metricsPromExporterHost"})
    metrics_prom_exporter_port: int = field(default=5557, metadata={
        "key": "metricsPromExporterPort", "min": 0, "max": 65535})
