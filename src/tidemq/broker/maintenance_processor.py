"""The broker's maintenance requests: change settings at run time, show raw consume-queue
entries, and drop consume queues nothing points at any more.

- UPDATE_BROKER_CONFIG (25): the body is ``key=value`` lines. Only ``RUNTIME_KEYS`` may
  change while the broker runs (each is read where it is used, on every request or retention
  run); any other key, an unknown key or a bad value refuses the whole request, naming it.
  What changed is kept in ``<storePathRootDir>/config/runtimeSettings.properties``, which the
  broker reads at start after its config file and before command-line options, so the
  change survives a restart (the operator's own config file is never rewritten).
- QUERY_CONSUME_QUEUE (321): up to ``count`` raw entries of a queue from ``index``, as
  ``queueData`` objects (``physicOffset``, ``physicSize``, ``tagsCode``) with the queue's
  ``minQueueIndex`` / ``maxQueueIndex``.
- CLEAN_EXPIRED_CONSUMEQUEUE (306): delete consume-queue segments that point only below the
  commit log's first record.
- CLEAN_UNUSED_TOPIC (316): delete the consume queues of topics this broker no longer has
  (deleted topics whose queue files were left behind).

Request and body layouts: docs/protocol.md, "Admin requests".
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidemq.config_loader import apply_runtime_settings, parse_properties
from tidemq.errors import ConfigError, StoreError
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.store.config_file import ConfigFile

if TYPE_CHECKING:
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.namesrv_registration import NameServerRegistration
    from tidemq.broker.topic_config_manager import TopicConfigManager
    from tidemq.remoting.connection import Connection
    from tidemq.remoting.server import RemotingServer
    from tidemq.store.config import StoreConfig
    from tidemq.store.interface import MessageStore

log = logging.getLogger("tidemq.broker")

RUNTIME_SETTINGS_FILE = "runtimeSettings.properties"

# The keys UPDATE_BROKER_CONFIG may change: each is read where it is used, so a change takes
# effect on the next request (or retention run) without a restart. The others size files,
# bind ports or start timers when the broker starts.
RUNTIME_KEYS = frozenset({
    "brokerPermission",  # a registration round follows the change
    "autoCreateTopicEnable",
    "autoCreateSubscriptionGroup",
    "slaveReadEnable",
    "maxMessageSize",
    "fileReservedTime",
    "deleteWhen",
    "diskMaxUsedSpaceRatio",
    "storeReplyMessageEnable",
})

# Entries one QUERY_CONSUME_QUEUE answers at most: the response stays small whatever count
# asks (mqadmin's queryCq asks 10 by default).
QUERY_CONSUME_QUEUE_COUNT_MAX = 1000


def runtime_settings_path(store_path_root_dir: str | Path) -> Path:
    """Where the settings changed at run time are kept."""
    return Path(store_path_root_dir) / "config" / RUNTIME_SETTINGS_FILE


def load_runtime_settings(store_path_root_dir: str | Path) -> dict[str, str]:
    """The settings changed at run time and kept for the next start (empty when none).

    Raises:
        ConfigFileCorrupt: the file and its .bak copy are both unreadable.
    """
    data = ConfigFile(runtime_settings_path(store_path_root_dir)).load()
    if data is None:
        return {}
    return parse_properties(data.decode("utf-8", "replace"))


class MaintenanceProcessor:
    """Serves UPDATE_BROKER_CONFIG, QUERY_CONSUME_QUEUE, CLEAN_EXPIRED_CONSUMEQUEUE and
    CLEAN_UNUSED_TOPIC.

    Args:
        config, store_config: the settings changed in place by UPDATE_BROKER_CONFIG.
        store: the consume queues read and cleaned.
        topics: which topics the broker has (CLEAN_UNUSED_TOPIC keeps their queues).
        registration: told to register again after brokerPermission changes.
        config_dir: ``<storePathRootDir>/config`` (the runtime settings file).
    """

    def __init__(self, *, config: BrokerConfig, store_config: StoreConfig,
                 store: MessageStore, topics: TopicConfigManager,
                 registration: NameServerRegistration, config_dir: Path) -> None:
        self._config = config
        self._store_config = store_config
        self._store = store
        self._topics = topics
        self._registration = registration
        self._settings_file = ConfigFile(config_dir / RUNTIME_SETTINGS_FILE)

    def register(self, server: RemotingServer) -> None:
        """Register the four request codes on ``server``."""
        server.register(RequestCode.UPDATE_BROKER_CONFIG, self.update_broker_config)
        server.register(RequestCode.QUERY_CONSUME_QUEUE, self.query_consume_queue)
        server.register(RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, self.clean_expired_cq)
        server.register(RequestCode.CLEAN_UNUSED_TOPIC, self.clean_unused_topic)

    async def update_broker_config(self, request: RemotingCommand,
                                   connection: Connection) -> RemotingCommand:
        """UPDATE_BROKER_CONFIG (25): apply, keep, and re-register when the permission moved."""
        text = (request.body or b"").decode("utf-8", "replace")
        permission_before = self._config.broker_permission
        try:
            applied = apply_runtime_settings([self._config, self._store_config], text,
                                             RUNTIME_KEYS)
        except ConfigError as e:
            return _error(request, ResponseCode.SYSTEM_ERROR, f"update broker config: {e}")
        try:
            self._persist(applied)
        except StoreError as e:
            # Applied but not kept: say so, the operator must repeat it after a restart.
            return _error(request, ResponseCode.SYSTEM_ERROR,
                          f"settings applied but not saved, a restart loses them: {e}")
        log.info("settings changed at run time by %s: %s", connection.remote_address,
                 ", ".join(f"{k}={v}" for k, v in applied.items()))
        if self._config.broker_permission != permission_before:
            # A new table version makes the name servers take the registration's queue
            # data (with the new permission) instead of skipping it as unchanged.
            self._topics.data_version.bump()
            self._registration.trigger()
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    def _persist(self, applied: dict[str, str]) -> None:
        data = self._settings_file.load()
        kept = parse_properties(data.decode("utf-8", "replace")) if data else {}
        kept.update(applied)
        text = ("# settings changed at run time (tidemq admin updateBrokerConfig); read at "
                "start after the config file\n"
                + "".join(f"{key}={value}\n" for key, value in sorted(kept.items())))
        self._settings_file.save(text.encode("utf-8"))

    async def query_consume_queue(self, request: RemotingCommand,
                                  connection: Connection) -> RemotingCommand:
        """QUERY_CONSUME_QUEUE (321): raw entries of one queue."""
        fields = request.ext_fields or {}
        try:
            topic = fields["topic"]
            queue_id = int(fields["queueId"])
            index = int(fields["index"])
            count = int(fields["count"])
        except (KeyError, ValueError) as e:
            return _error(request, ResponseCode.SYSTEM_ERROR,
                          f"QUERY_CONSUME_QUEUE needs topic, queueId, index and count: {e}")
        if self._topics.get(topic) is None:
            return _error(request, ResponseCode.TOPIC_NOT_EXIST,
                          f"topic {topic} does not exist on broker {self._config.broker_name}")
        count = max(0, min(count, QUERY_CONSUME_QUEUE_COUNT_MAX))
        entries = self._store.consume_queue_entries(topic, queue_id, index, count)
        body: dict[str, Any] = {
            "queueData": [{"physicOffset": physical_offset, "physicSize": size,
                           "tagsCode": tags_code, "eval": False}
                          for physical_offset, size, tags_code in entries],
            "minQueueIndex": self._store.min_offset(topic, queue_id),
            "maxQueueIndex": self._store.max_offset(topic, queue_id),
        }
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS,
                                           body=jsonx.dumps(body))

    async def clean_expired_cq(self, request: RemotingCommand,
                               connection: Connection) -> RemotingCommand:
        """CLEAN_EXPIRED_CONSUMEQUEUE (306)."""
        deleted = self._store.clean_expired_consume_queues()
        log.info("cleaned %d expired consume-queue segments (asked by %s)", deleted,
                 connection.remote_address)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    async def clean_unused_topic(self, request: RemotingCommand,
                                 connection: Connection) -> RemotingCommand:
        """CLEAN_UNUSED_TOPIC (316)."""
        unused = sorted(topic for topic in self._store.queue_topics()
                        if self._topics.get(topic) is None)
        for topic in unused:
            self._store.delete_topic(topic)
        log.info("deleted the consume queues of %d unused topics (asked by %s): %s",
                 len(unused), connection.remote_address, ", ".join(unused) or "none")
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)


def _error(request: RemotingCommand, code: int, remark: str) -> RemotingCommand:
    return RemotingCommand.response_to(request, code, remark=remark)

