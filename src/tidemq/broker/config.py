"""BrokerConfig: the broker's settings, under RocketMQ's BrokerConfig key names.

Each field's metadata carries its RocketMQ key (``"key"``) and, where the value is one of a
few, the allowed values (``"choices"``) or bounds (``"min"``/``"max"``), which is what
``tidemq.cli.config_loader`` reads to map ``broker.conf`` and ``--<key> value`` onto fields.
Store settings (flushDiskType, storePathRootDir, maxMessageSize, ...) live in
``tidemq.store.config.StoreConfig``; ``messageDelayLevel`` is declared by both, and the loader
hands such a key to both so they cannot disagree.

Values are checked when the config is built (``ConfigError`` naming the key, the value and what
is allowed), so a bad setting fails at start and never on a request.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from tidemq.broker.security_config import BrokerSecurityConfig
from tidemq.errors import ConfigError
from tidemq.limits import topic_name_problem
from tidemq.store.config import DEFAULT_MESSAGE_DELAY_LEVEL

# PermName bits (docs/protocol.md §11.2).
PERM_PRIORITY = 0x8
PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_INHERIT = 0x1

# Queues of one topic on one broker. RocketMQ has no limit; we keep one so a typo (100000)
# cannot make the broker create a hundred thousand consume-queue directories. 1024 is what
# RocketMQ's own BenchmarkTest topic uses, the largest count any of its defaults asks for.
TOPIC_QUEUE_NUMS_MAX = 1024

# RocketMQ clamps registerNameServerPeriod into this window: below 10 s the name servers do
# needless work, above 60 s a broker risks the name server's 120 s expiry after one lost
# registration.
REGISTER_NAME_SERVER_PERIOD_MIN_MS = 10_000
REGISTER_NAME_SERVER_PERIOD_MAX_MS = 60_000


class BrokerRole(enum.StrEnum):
    """The broker's part in its master/slave group (RocketMQ's brokerRole)."""

    ASYNC_MASTER = "ASYNC_MASTER"  # acknowledges sends without waiting for a slave
    SYNC_MASTER = "SYNC_MASTER"  # waits for a slave to hold the message (replication issue)
    SLAVE = "SLAVE"  # read-only copy of a master; refuses sends


def _key(name: str, **extra: Any) -> dict[str, Any]:
    return {"key": name, **extra}


@dataclass(slots=True)
class BrokerConfig(BrokerSecurityConfig):
    """Settings of one broker; field metadata gives RocketMQ's key for each.

    The ACL and TLS keys are ``ServerSecurityConfig``'s, shared with the name server; those
    of the broker's own outgoing connections are ``BrokerSecurityConfig``'s.

    Attributes:
        acl_enable: RocketMQ's aclEnable: every request is checked against plain_acl.yml (acl/).

    Raises:
        ConfigError: a value is out of range or inconsistent; the message names the key.
    """

    # -- identity --------------------------------------------------------------------------
    broker_cluster_name: str = field(default="DefaultCluster", metadata=_key("brokerClusterName"))
    # RocketMQ defaults brokerName to the host name. We use the name RocketMQ's shipped
    # broker.conf uses instead: the broker name is the key of routes, of consumers' queue
    # assignments and of offsets clients keep, so it must not change when a container gets a
    # new random host name or a laptop joins another network.
    broker_name: str = field(default="broker-a", metadata=_key("brokerName"))
    # 0 is the master; slaves use 1, 2, ...
    broker_id: int = field(default=0, metadata=_key("brokerId", min=0))
    # "host:port;host:port"; None = register nowhere (a stand-alone broker).
    namesrv_addr: str | None = field(default=None, metadata=_key("namesrvAddr"))
    listen_port: int = field(default=10911, metadata=_key("listenPort", min=0, max=65535))
    # The address clients are told to connect to, and the one the broker binds. RocketMQ
    # picks the first non-loopback address; we default to loopback so a broker started for a
    # try is not exposed to the network until someone says so.
    broker_ip1: str = field(default="127.0.0.1", metadata=_key("brokerIP1"))
    # Host of the HA (replication) address; None = brokerIP1.
    broker_ip2: str | None = field(default=None, metadata=_key("brokerIP2"))
    # RocketMQ's start-up sets haListenPort = listenPort + 1 unless configured; None = that.
    ha_listen_port: int | None = field(
        default=None, metadata=_key("haListenPort", min=0, max=65535)
    )
    broker_role: BrokerRole = field(default=BrokerRole.ASYNC_MASTER, metadata=_key("brokerRole"))
    # PERM_READ | PERM_WRITE; 4 = read-only (what WIPE_WRITE_PERM_OF_BROKER leads to).
    broker_permission: int = field(
        default=PERM_READ | PERM_WRITE, metadata=_key("brokerPermission", min=0, max=15)
    )
    region_id: str = field(default="DefaultRegion", metadata=_key("regionId"))
    trace_on: bool = field(default=True, metadata=_key("traceOn"))

    # -- topics ----------------------------------------------------------------------------
    auto_create_topic_enable: bool = field(default=True, metadata=_key("autoCreateTopicEnable"))
    # Queues of the TBW102 template; a topic created by a send gets min(this, the client's 4).
    default_topic_queue_nums: int = field(
        default=8, metadata=_key("defaultTopicQueueNums", min=1, max=TOPIC_QUEUE_NUMS_MAX)
    )
    cluster_topic_enable: bool = field(default=True, metadata=_key("clusterTopicEnable"))
    broker_topic_enable: bool = field(default=True, metadata=_key("brokerTopicEnable"))
    trace_topic_enable: bool = field(default=False, metadata=_key("traceTopicEnable"))
    msg_trace_topic_name: str = field(
        default="RMQ_SYS_TRACE_TOPIC", metadata=_key("msgTraceTopicName")
    )
    # Delay levels; read by the delay scheduler (a later issue). StoreConfig declares it too.
    message_delay_level: str = field(
        default=DEFAULT_MESSAGE_DELAY_LEVEL, metadata=_key("messageDelayLevel")
    )

    # -- name-server registration ----------------------------------------------------------
    register_name_server_period_ms: int = field(
        default=30_000, metadata=_key("registerNameServerPeriod", min=1)
    )
    # RocketMQ 4.9.8's registerBrokerTimeoutMills: one registration round trip.
    register_broker_timeout_ms: int = field(
        default=6_000, metadata=_key("registerBrokerTimeoutMills", min=1)
    )

    # -- consumption (read by tidemq.broker.consumption and its processors) ----------------
    long_polling_enable: bool = field(default=True, metadata=_key("longPollingEnable"))
    short_polling_time_ms: int = field(default=1000, metadata=_key("shortPollingTimeMills", min=0))
    flush_consumer_offset_interval_ms: int = field(
        default=5000, metadata=_key("flushConsumerOffsetInterval", min=1)
    )
    # A client channel not heard from for this long is dropped (RocketMQ: 120 s).
    channel_expired_timeout_ms: int = field(
        default=120_000, metadata=_key("channelExpiredTimeout", min=1)
    )
    notify_consumer_ids_changed_enable: bool = field(
        default=True, metadata=_key("notifyConsumerIdsChangedEnable")
    )
    auto_create_subscription_group: bool = field(
        default=True, metadata=_key("autoCreateSubscriptionGroup")
    )
    slave_read_enable: bool = field(default=False, metadata=_key("slaveReadEnable"))
    # Keep replies (SEND_REPLY_MESSAGE) in <cluster>_REPLY_TOPIC besides pushing them to the
    # requester, as RocketMQ 4.x does by default: they can be looked up and traced later.
    store_reply_message_enable: bool = field(default=True,
                                             metadata=_key("storeReplyMessageEnable"))
    # With slaveReadEnable, a pull whose data lies further behind the commit log's end than
    # this percentage of the machine's memory (no longer likely in the page cache) is told
    # to go to the group's whichBrokerWhenConsumeSlowly (RocketMQ's MessageStoreConfig key
    # and default, 40; docs/protocol.md §13.3).
    access_message_in_memory_max_ratio: int = field(
        default=40, metadata=_key("accessMessageInMemoryMaxRatio", min=0, max=100)
    )
    enable_property_filter: bool = field(default=False, metadata=_key("enablePropertyFilter"))
    # With SQL92 subscriptions, also filter the messages of %RETRY%<group> by the SQL92
    # expression of the topic each was first sent to (RocketMQ's default: retries are not
    # filtered, they were already filtered once).
    filter_support_retry: bool = field(default=False, metadata=_key("filterSupportRetry"))
    # maxNum of a unique-key QUERY_MESSAGE.
    default_query_max_num: int = field(default=32, metadata=_key("defaultQueryMaxNum", min=1))
    # Transactions (docs/protocol.md §11.1, RocketMQ's defaults): a half message is first checked
    # when older than transactionTimeOut, then every transactionCheckInterval, and discarded to
    # TRANS_CHECK_MAX_TIME_TOPIC after transactionCheckMax checks.
    transaction_timeout_ms: int = field(
        default=6_000, metadata=_key("transactionTimeOut", min=1)
    )
    transaction_check_interval_ms: int = field(
        default=60_000, metadata=_key("transactionCheckInterval", min=1)
    )
    transaction_check_max: int = field(default=15, metadata=_key("transactionCheckMax", min=0))
    # tidemq's own: memory for the committed copies (all but the bodies) of open
    # exactly-once ranges, made when their halves are stored so a commit does not parse
    # them again; ranges beyond it are committed from the stored halves alone. 0: none.
    exactly_once_commit_cache_bytes: int = field(
        default=256 * 1024 * 1024, metadata=_key("exactlyOnceCommitCacheBytes", min=0)
    )

    # -- automatic failover (controller mode, docs/failover.md; RocketMQ 5's key names) --------
    # The broker's group gets its master from the controller's records in etcd instead of
    # brokerRole: brokerRole then only says which master flavour (SYNC_MASTER or
    # ASYNC_MASTER) this broker is when elected, and brokerId is its replica id (>= 1;
    # whoever is master registers with the name servers as brokerId 0).
    enable_controller_mode: bool = field(default=False, metadata=_key("enableControllerMode"))
    # etcd's client endpoints, host:port;host:port (RocketMQ 5: the controllers' addresses).
    controller_addr: str | None = field(default=None, metadata=_key("controllerAddr"))
    # Where this cluster's records live in etcd; one prefix per cluster (a marker key refuses
    # a broker of another cluster).
    controller_etcd_prefix: str = field(default="/tidemq", metadata=_key("controllerEtcdPrefix"))
    # The broker process's etcd lease: when it is not renewed for this long, the broker is
    # dead to the controller (RocketMQ 5's controllerHeartBeatTimeoutMills, default 10 s;
    # ours is shorter because an election here costs one etcd transaction). Whole seconds:
    # etcd's lease TTL unit; etcd raises TTLs below its minimum (about 2 s by default).
    controller_heart_beat_timeout_ms: int = field(
        default=3000, metadata=_key("controllerHeartBeatTimeoutMills", min=2000, max=600_000)
    )
    # How often the broker renews its lease and reports its offset (RocketMQ 5's key).
    broker_heartbeat_interval_ms: int = field(
        default=500, metadata=_key("brokerHeartbeatInterval", min=50, max=60_000)
    )
    # A master that could not renew its lease for controllerHeartBeatTimeoutMills minus this
    # margin stops acknowledging writes, so it is fenced before etcd can let the lease expire
    # and the controller elect another master. The margin covers the request's own latency
    # and the event loop's delays; tidemq's own key.
    controller_fence_margin_ms: int = field(
        default=1000, metadata=_key("controllerFenceMarginMills", min=100)
    )
    # A sync-state member that has not caught up for this long is removed from the set (through
    # etcd) so that sends stop waiting for it (RocketMQ 5's haMaxTimeSlaveNotCatchup).
    ha_max_time_slave_not_catchup_ms: int = field(
        default=15_000, metadata=_key("haMaxTimeSlaveNotCatchup", min=100)
    )

    # Prometheus metrics (RocketMQ 5's keys): PROM serves /metrics on
    # metricsPromExporterHost:metricsPromExporterPort (host empty: brokerIP1); DISABLE (the
    # default) serves nothing. docs/monitoring.md lists the metrics.
    metrics_exporter_type: str = field(default="DISABLE", metadata={
        "key": "metricsExporterType", "choices": ("DISABLE", "PROM")})
    metrics_prom_exporter_host: str = field(default="", metadata={
        "key": "metricsPromExporterHost"})
    metrics_prom_exporter_port: int = field(default=5557, metadata={
        "key": "metricsPromExporterPort", "min": 0, "max": 65535})

    def __post_init__(self) -> None:
        try:
            self.broker_role = BrokerRole(str(self.broker_role).upper())
        except ValueError:
            raise ConfigError(
                f"brokerRole={self.broker_role}: expected one of "
                f"{', '.join(role.value for role in BrokerRole)}"
            ) from None
        for key, value in (
            ("brokerClusterName", self.broker_cluster_name),
            ("brokerName", self.broker_name),
        ):
            problem = topic_name_problem(value)
            if problem is not None:
                # Both names become topics (§11.3) and route keys, so they follow topic rules.
                raise ConfigError(f"{key}={value}: {problem}")
        if not self.broker_ip1.strip():
            raise ConfigError("brokerIP1 is empty; give the address clients should connect to")
        if self.enable_controller_mode:
            self._check_controller_mode()
        elif self.broker_role is BrokerRole.SLAVE and self.broker_id == 0:
            raise ConfigError(
                "brokerRole=SLAVE with brokerId=0: a slave needs brokerId > 0 (0 is the master)"
            )
        if (not self.enable_controller_mode and self.broker_role is not BrokerRole.SLAVE
                and self.broker_id != 0):
            raise ConfigError(
                f"brokerId={self.broker_id} with brokerRole={self.broker_role.value}: "
                "a master has brokerId 0; set brokerRole=SLAVE for a slave"
            )
        for key, value in (("namesrvAddr", self.namesrv_addr),):
            if value is not None:
                for address in value.split(";"):
                    host, sep, port = address.strip().rpartition(":")
                    if address.strip() and (not sep or not host or not port.isdigit()):
                        raise ConfigError(
                            f"{key}={value}: {address.strip()!r} is not host:port; "
                            "give name servers as 'host:9876;host2:9876'"
                        )
        self.delay_level_count()  # validates message_delay_level
        BrokerSecurityConfig.__post_init__(self)  # the tls* and inner credentials keys

    def _check_controller_mode(self) -> None:
        """enableControllerMode=true: controllerAddr given, a master flavour, brokerId >= 1,
        timings that fence a master before its lease can expire."""
        from tidemq.controller.etcd import parse_endpoints

        if not self.controller_addr:
            raise ConfigError(
                "enableControllerMode=true needs controllerAddr: etcd's client endpoints, "
                "host:port;host:port (docs/failover.md)")
        parse_endpoints(self.controller_addr)
        if self.broker_role is BrokerRole.SLAVE:
            raise ConfigError(
                "brokerRole=SLAVE with enableControllerMode=true: in controller mode the "
                "controller decides who is master; brokerRole says which master flavour this "
                "broker is when elected: SYNC_MASTER or ASYNC_MASTER")
        if self.broker_id < 1:
            raise ConfigError(
                f"brokerId={self.broker_id} with enableControllerMode=true: give each broker "
                "of the group its own replica id >= 1 (the elected master registers with the "
                "name servers as brokerId 0)")
        ttl = self.controller_heart_beat_timeout_ms
        if ttl % 1000:
            raise ConfigError(
                f"controllerHeartBeatTimeoutMills={ttl}: etcd leases count whole seconds; "
                "give a multiple of 1000")
        if self.broker_heartbeat_interval_ms + self.controller_fence_margin_ms >= ttl:
            raise ConfigError(
                f"brokerHeartbeatInterval={self.broker_heartbeat_interval_ms} plus "
                f"controllerFenceMarginMills={self.controller_fence_margin_ms} must be below "
                f"controllerHeartBeatTimeoutMills={ttl}, or a master would fence itself "
                "between two renewals")
        if not self.controller_etcd_prefix.startswith("/"):
            raise ConfigError(
                f"controllerEtcdPrefix={self.controller_etcd_prefix!r}: give a key prefix "
                "starting with '/', e.g. /tidemq/<clusterName>")

    # -- derived values --------------------------------------------------------------------

    @property
    def broker_address(self) -> str:
        """``brokerIP1:listenPort``: what clients connect to and what records carry."""
        return f"{self.broker_ip1}:{self.listen_port}"

    @property
    def ha_server_address(self) -> str:
        """``brokerIP2:haListenPort``: the replication address sent to the name servers."""
        port = self.ha_listen_port if self.ha_listen_port is not None else self.listen_port + 1
        return f"{self.broker_ip2 or self.broker_ip1}:{port}"

    @property
    def listen_ports(self) -> list[int]:
        """Ports to listen on: listenPort and the "VIP" port listenPort - 2 (§11.7, §15.4).

        Older Java clients (4.4-4.6 era) send to listenPort - 2 by default. With port 0 (a
        test asking for any free port) there is no VIP port.
        """
        if self.listen_port >= 3:
            return [self.listen_port, self.listen_port - 2]
        return [self.listen_port]

    @property
    def namesrv_addresses(self) -> list[str]:
        """The name servers of ``namesrvAddr``, in order, blanks dropped."""
        if not self.namesrv_addr:
            return []
        return [a.strip() for a in self.namesrv_addr.split(";") if a.strip()]

    @property
    def register_period_ms(self) -> int:
        """registerNameServerPeriod clamped into [10 s, 60 s], as RocketMQ does."""
        return max(
            REGISTER_NAME_SERVER_PERIOD_MIN_MS,
            min(self.register_name_server_period_ms, REGISTER_NAME_SERVER_PERIOD_MAX_MS),
        )

    @property
    def is_writable(self) -> bool:
        """True when brokerPermission allows writes and the broker is not a slave."""
        return bool(self.broker_permission & PERM_WRITE) and self.broker_role is not (
            BrokerRole.SLAVE
        )

    @property
    def is_readable(self) -> bool:
        """True when brokerPermission allows reads."""
        return bool(self.broker_permission & PERM_READ)

    def delay_level_count(self) -> int:
        """How many delay levels ``messageDelayLevel`` defines.

        Raises:
            ConfigError: a level is not a number followed by s, m, h or d.
        """
        pieces = self.message_delay_level.split()
        for piece in pieces:
            if len(piece) < 2 or not piece[:-1].isdigit() or piece[-1] not in "smhd":
                raise ConfigError(
                    f"messageDelayLevel={self.message_delay_level}: {piece!r} is not a number "
                    "followed by s, m, h or d (e.g. '1s 5s 10s 30s 1m')"
                )
        if not pieces:
            raise ConfigError("messageDelayLevel is empty; give levels like '1s 5s 10s'")
        return len(pieces)


# -- properties text (GET_BROKER_CONFIG) --------------------------------------------------------

# How a secret setting that is set is shown (fields with ``"secret"`` metadata).
SECRET_SHOWN_AS = "******"

_UNIT_SUFFIXES = ("_ms", "_seconds", "_s", "_hours", "_bytes")


def config_key(config_field: dataclasses.Field[Any]) -> str:
    """The RocketMQ key of a config dataclass field: its ``key`` metadata or a derived name.

    The derivation is the config loader's rule (snake_case to camelCase, unit suffix dropped),
    so ``flush_interval_commit_log_ms`` gives ``flushIntervalCommitLog``.
    """
    explicit = config_field.metadata.get("key")
    if explicit:
        return explicit
    name = config_field.name
    for suffix in _UNIT_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def config_properties(*configs: Any) -> dict[str, str]:
    """Every setting of the given config dataclasses as ``{RocketMQ key: text}``.

    Values are written as a properties file would hold them: booleans ``true``/``false``,
    enums by value, None as an empty string; a secret (a key password, credentials) that is
    set as ``SECRET_SHOWN_AS``. Later configs win on a shared key.
    """
    properties: dict[str, str] = {}
    for config in configs:
        for config_field in dataclasses.fields(config):
            if config_field.metadata.get("config", True) is False:
                continue
            value = getattr(config, config_field.name)
            if config_field.metadata.get("secret") and value:
                text = SECRET_SHOWN_AS  # GET_BROKER_CONFIG is no admin request
            elif isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, enum.Enum):
                text = str(value.value)
            elif value is None:
                text = ""
            else:
                text = str(value)
            properties[config_key(config_field)] = text
    return properties


def properties_text(properties: dict[str, str]) -> str:
    """Render ``{key: value}`` as Java properties text, one ``key=value`` per line, sorted."""
    return "".join(f"{key}={value}\n" for key, value in sorted(properties.items()))
