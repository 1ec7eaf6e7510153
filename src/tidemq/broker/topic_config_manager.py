"""The broker's topics: topics.json, the built-in topics, and topic creation rules.

Topics come from three places (docs/protocol.md §11.3):

- ``<storePathRootDir>/config/topics.json`` (``TopicConfigTable``), written atomically on
  every change;
- the built-in topics every broker has: SELF_TEST_TOPIC (1 queue), TBW102 (the auto-create
  template: defaultTopicQueueNums queues, perm 7, only while autoCreateTopicEnable),
  BenchmarkTest (1024), ``<cluster>`` and ``<brokerName>`` (perm INHERIT, plus read-write
  when clusterTopicEnable / brokerTopicEnable), OFFSET_MOVED_EVENT (1), SCHEDULE_TOPIC_XXXX
  (one queue per delay level, 18), RMQ_SYS_TRACE_TOPIC (when traceTopicEnable) and
  ``<cluster>_REPLY_TOPIC`` (1). A persisted config of a built-in topic wins over the default,
  as in RocketMQ; TBW102 is removed while auto-creation is off, so the name servers do not
  advertise a template no send may use;
- creation on use: a send to an unknown topic copies an inheritable template
  (``create_topic_in_send_process``), and retry / dead-letter topics are created when first
  needed (``create_topic_for_send_back``).

Every change bumps the table's DataVersion, is persisted, and calls ``on_change`` with the
names of the topics created or changed (None when topics were removed; the controller then
registers them with the name servers). Persisting means writing topics.json at once, until
the running broker hands it to a background saver (``defer_persistence``): then a change
only marks the table to be saved, and the save runs in a worker thread, many changes in one
write (``background_saver.py``); a change that is acknowledged to a client (an admin's
create, update or delete) awaits ``saved`` before the answer, so a crash cannot lose it.
Owner: the event loop thread.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

from tidemq.broker.background_saver import SavedConfigTable
from tidemq.broker.config import (
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    TOPIC_QUEUE_NUMS_MAX,
    BrokerConfig,
)
from tidemq.store.config import SCHEDULE_TOPIC
from tidemq.store.config_file import ConfigFile
from tidemq.store.config_tables import (
    TOPIC_FILTER_TYPES,
    DataVersion,
    TopicConfig,
    TopicConfigTable,
)

__all__ = [
    "AUTO_CREATE_TOPIC_KEY_TOPIC",
    "DLQ_GROUP_TOPIC_PREFIX",
    "RETRY_GROUP_TOPIC_PREFIX",
    "TOPIC_FILTER_TYPES",
    "TopicConfig",
    "TopicConfigManager",
    "is_not_allowed_send_topic",
]

log = logging.getLogger("tidemq.broker")

# Topic names of RocketMQ's TopicValidator / MixAll (docs/protocol.md §11.1, §11.3).
AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
BENCHMARK_TOPIC = "BenchmarkTest"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
RMQ_SYS_TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
RMQ_SYS_TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
REPLY_TOPIC_POSTFIX = "REPLY_TOPIC"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"

BENCHMARK_TOPIC_QUEUE_NUMS = 1024
SINGLE_TAG = "SINGLE_TAG"

# Topics the broker writes itself; a producer's send to one is refused (§4.3).
NOT_ALLOWED_SEND_TOPICS = frozenset(
    {
        SCHEDULE_TOPIC,
        RMQ_SYS_TRANS_HALF_TOPIC,
        RMQ_SYS_TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        SELF_TEST_TOPIC,
        OFFSET_MOVED_EVENT,
    }
)

# System topics whatever the broker's names; the built-in topics of a broker join them.
_FIXED_SYSTEM_TOPICS = NOT_ALLOWED_SEND_TOPICS | {AUTO_CREATE_TOPIC_KEY_TOPIC, BENCHMARK_TOPIC}


def is_not_allowed_send_topic(topic: str) -> bool:
    """True for the topics only the broker writes (SCHEDULE_TOPIC_XXXX, the half topics, ...)."""
    return topic in NOT_ALLOWED_SEND_TOPICS


class TopicConfigManager(SavedConfigTable):
    """The topics of one broker, persisted in ``topics.json``.

    Args:
        config: the broker's settings (names and switches of the built-in topics).
        config_dir: ``<storePathRootDir>/config``; topics.json lives there.
        on_change: called after every change of the table (on the caller's thread) with
            the names of the topics created or changed, or None when topics were removed.

    Raises:
        ConfigFileCorrupt: topics.json and its .bak are both unreadable.
    """

    def __init__(
        self,
        config: BrokerConfig,
        config_dir: str | Path,
        *,
        on_change: Callable[[tuple[str, ...] | None], None] | None = None,
    ) -> None:
        self._config = config
        self._file = ConfigFile(Path(config_dir) / TopicConfigTable.file_name)
        self._on_change = on_change
        self._init_saves()
        self._system_topics = set(_FIXED_SYSTEM_TOPICS)
        self._table = TopicConfigTable.load(self._file)
        version_before = self._table.data_version.counter
        for topic_config in self._built_in_topics():
            self._system_topics.add(topic_config.topic_name)
            if topic_config.topic_name not in self._table:
                self._table.put(topic_config)
        if not config.auto_create_topic_enable:
            self._table.remove(AUTO_CREATE_TOPIC_KEY_TOPIC)
        if self._table.data_version.counter != version_before or not self._file_exists():
            self._write_if_dirty()

    def _built_in_topics(self) -> list[TopicConfig]:
        config = self._config
        cluster = config.broker_cluster_name
        topics = [TopicConfig(SELF_TEST_TOPIC, 1, 1)]
        if config.auto_create_topic_enable:
            topics.append(
                TopicConfig(
                    AUTO_CREATE_TOPIC_KEY_TOPIC,
                    config.default_topic_queue_nums,
                    config.default_topic_queue_nums,
                    PERM_INHERIT | PERM_READ | PERM_WRITE,
                )
            )
        topics.append(
            TopicConfig(BENCHMARK_TOPIC, BENCHMARK_TOPIC_QUEUE_NUMS, BENCHMARK_TOPIC_QUEUE_NUMS)
        )
        cluster_perm = PERM_INHERIT | (PERM_READ | PERM_WRITE if config.cluster_topic_enable else 0)
        topics.append(TopicConfig(cluster, perm=cluster_perm))
        broker_perm = PERM_INHERIT | (PERM_READ | PERM_WRITE if config.broker_topic_enable else 0)
        topics.append(TopicConfig(config.broker_name, 1, 1, perm=broker_perm))
        topics.append(TopicConfig(OFFSET_MOVED_EVENT, 1, 1))
        delay_levels = config.delay_level_count()
        topics.append(TopicConfig(SCHEDULE_TOPIC, delay_levels, delay_levels))
        if config.trace_topic_enable:
            topics.append(TopicConfig(config.msg_trace_topic_name, 1, 1))
        topics.append(TopicConfig(f"{cluster}_{REPLY_TOPIC_POSTFIX}", 1, 1))
        return topics

    # -- reading ---------------------------------------------------------------------------

    def get(self, topic: str) -> TopicConfig | None:
        """The topic's config, or None when the broker does not have it."""
        return self._table.get(topic)

    def all(self) -> dict[str, TopicConfig]:
        """Every topic's config, by name (a copy)."""
        return {topic_config.topic_name: topic_config for topic_config in self._table}

    @property
    def data_version(self) -> DataVersion:
        """The table's version; it changes with every change of any topic."""
        return self._table.data_version

    def is_system_topic(self, topic: str) -> bool:
        """True for RocketMQ's system topics and this broker's built-in ones (§11.3)."""
        return topic in self._system_topics or topic.startswith(SYSTEM_TOPIC_PREFIX)

    def serialize_wrapper(self) -> dict:
        """The table as TopicConfigSerializeWrapper JSON data (a fresh dict, safe to change)."""
        return self._table.to_json_object()

    def to_json(self) -> bytes:
        """topics.json's content, compact: the GET_ALL_TOPIC_CONFIG body."""
        return self._table.to_json()

    # -- changing --------------------------------------------------------------------------

    def update(self, topic_config: TopicConfig) -> None:
        """Create or replace a topic's config; persists and reports the change."""
        before = self._table.data_version.counter
        self._table.put(topic_config)
        if self._table.data_version.counter != before:
            self._changed((topic_config.topic_name,))

    def delete(self, topic: str) -> bool:
        """Forget a topic's config; returns False when there was none."""
        if self._table.remove(topic) is None:
            return False
        self._changed(None)
        return True

    def sync_from_master(self, master: TopicConfigTable) -> bool:
        """Become a copy of the master's table (a slave's periodic sync, RocketMQ's
        SlaveSynchronize): replaced whole, with the master's data version, when that version
        differs from ours; persists and reports the change.

        Returns:
            True when the table changed.
        """
        if master.data_version == self._table.data_version:
            return False
        self._table = TopicConfigTable(list(master), DataVersion(
            master.data_version.counter, master.data_version.timestamp_ms))
        self._changed(None)
        return True

    def create_topic_in_send_process(
        self,
        topic: str,
        default_topic: str,
        client_queue_nums: int,
        topic_sys_flag: int = 0,
        *,
        producer_address: str = "",
    ) -> TopicConfig | None:
        """Create ``topic`` for a send by copying the template ``default_topic`` (§11.3).

        The template must exist and carry PERM_INHERIT (TBW102 only while
        autoCreateTopicEnable). The new topic gets min(client queue nums, template write
        queues) queues, the template's permission minus INHERIT and its filter type.

        Returns:
            The topic's config (also when it already existed), or None when no usable
            template allows creating it.
        """
        existing = self._table.get(topic)
        if existing is not None:
            return existing
        template = self._table.get(default_topic)
        if template is None or not template.perm & PERM_INHERIT:
            return None
        if default_topic == AUTO_CREATE_TOPIC_KEY_TOPIC and not (
            self._config.auto_create_topic_enable
        ):
            return None
        queue_nums = max(1, min(client_queue_nums, template.write_queue_nums))
        queue_nums = min(queue_nums, TOPIC_QUEUE_NUMS_MAX)
        topic_config = TopicConfig(
            topic,
            queue_nums,
            queue_nums,
            perm=template.perm & ~PERM_INHERIT,
            topic_filter_type=template.topic_filter_type,
            topic_sys_flag=topic_sys_flag,
        )
        self._table.put(topic_config)
        log.info(
            "topic %s created from template %s for producer %s: %d queues, perm %d",
            topic,
            default_topic,
            producer_address or "?",
            queue_nums,
            topic_config.perm,
        )
        self._changed((topic,))
        return topic_config

    def create_topic_for_send_back(
        self, topic: str, queue_nums: int, perm: int, topic_sys_flag: int = 0
    ) -> TopicConfig:
        """The config of a retry or dead-letter topic, created with these values if absent."""
        existing = self._table.get(topic)
        if existing is not None:
            return existing
        topic_config = TopicConfig(
            topic, queue_nums, queue_nums, perm=perm, topic_sys_flag=topic_sys_flag
        )
        self._table.put(topic_config)
        log.info("topic %s created: %d queues, perm %d", topic, queue_nums, perm)
        self._changed((topic,))
        return topic_config

    def update_perm(self, topic: str, perm: int) -> TopicConfig | None:
        """Change one topic's permission; returns the new config, None if the topic is absent."""
        existing = self._table.get(topic)
        if existing is None:
            return None
        self.update(dataclasses.replace(existing, perm=perm))
        return self._table.get(topic)

    # persistence (defer_persistence, saved, snapshot_if_dirty, write_snapshot):
    # SavedConfigTable.

    # -- internals -------------------------------------------------------------------------

    def _changed(self, topics: tuple[str, ...] | None) -> None:
        self._count_change()
        if self._on_change is not None:
            self._on_change(topics)

    def _file_exists(self) -> bool:
        return self._file.path.exists()
