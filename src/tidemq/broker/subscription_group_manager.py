"""Subscription groups: each consumer group's settings, in subscriptionGroup.json.

A group's settings (docs/protocol.md §5.5: consumeEnable, consumeBroadcastEnable,
retryQueueNums 1, retryMaxTimes 16, brokerId, whichBrokerWhenConsumeSlowly,
notifyConsumerIdsChangedEnable) decide whether its pulls are served, how many queues its
retry topic gets, when its messages go to the dead-letter topic and where it should read.

A group is created with the defaults the first time it is seen (a heartbeat, a pull, a
send-back) when ``autoCreateSubscriptionGroup=true`` (the default), and always for RocketMQ's
system groups (``CID_RMQ_SYS_`` prefix). With auto-creation off, an admin creates groups with
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (``tidemq admin updateSubGroup``).

Changes are written to ``<storePathRootDir>/config/subscriptionGroup.json`` (atomically, with
a .bak): at once, as RocketMQ does, until the running broker hands the writing to a
background saver (``defer_persistence``, ``background_saver.py``), which writes many changes
in one save off the event loop: every new consumer group is a change, and at a thousand
groups writing the whole file on the loop made each new group's first heartbeat slow. An
admin's update or delete awaits ``saved`` before it is answered (group commit with other
callers), so an acknowledged change survives a crash; a group auto-created for a heartbeat
rides the next save.

Ownership: the event-loop thread.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from tidemq.broker.background_saver import SavedConfigTable
from tidemq.errors import StoreError
from tidemq.store.config_file import ConfigFile
from tidemq.store.config_tables import (
    DataVersion,
    SubscriptionGroupConfig,
    SubscriptionGroupTable,
)

if TYPE_CHECKING:
    from tidemq.broker.config import BrokerConfig

log = logging.getLogger("tidemq.broker")

# MixAll.isSysConsumerGroup: groups the broker itself relies on are created whatever the
# autoCreateSubscriptionGroup setting says.
SYSTEM_CONSUMER_GROUP_PREFIX = "CID_RMQ_SYS_"

# Groups every RocketMQ broker knows from the start (SubscriptionGroupManager.init): the admin
# tool's own group, the self-test group, the transaction checker's.
BUILT_IN_GROUPS = ("TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP",
                   "CID_RMQ_SYS_TRANS")


class SubscriptionGroupManager(SavedConfigTable):
    """Consumer groups' settings with auto-creation and immediate persistence.

    Args:
        path: the subscriptionGroup.json file (need not exist yet).
        config: the broker's config (``auto_create_subscription_group`` is read on each use,
            so a config update takes effect at once).

    Raises:
        ConfigFileCorrupt: the file and its .bak are both unreadable.
    """

    def __init__(self, path: str | os.PathLike[str], config: BrokerConfig) -> None:
        self._file = ConfigFile(path)
        self._config = config
        self._table = SubscriptionGroupTable.load(self._file)
        self._init_saves()
        for group in BUILT_IN_GROUPS:
            if self._table.get(group) is None:
                self._table.put(SubscriptionGroupConfig(group))

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's settings, or None (never creates)."""
        return self._table.get(group)

    def find_subscription_group_config(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's settings, created with the defaults when allowed; None otherwise."""
        found = self._table.get(group)
        if found is not None:
            return found
        if not (
            self._config.auto_create_subscription_group
            or group.startswith(SYSTEM_CONSUMER_GROUP_PREFIX)
        ):
            return None
        created = SubscriptionGroupConfig(group)
        self._table.put(created)
        log.info("created subscription group %s with the default settings", group)
        try:
            self.persist()
        except StoreError as e:
            # The request that needed the group (a pull, say) must not fail for it: the
            # group is in memory and is saved with the next change or at shutdown.
            log.warning("subscription group %s is not saved yet: %s", group, e)
        return created

    def update_subscription_group_config(self, config: SubscriptionGroupConfig) -> None:
        """Create or replace a group's settings (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP)."""
        old = self._table.get(config.group_name)
        if old == config:
            return
        self._table.put(config)
        log.info("%s subscription group %s: %s", "updated" if old else "created",
                 config.group_name, config)
        self.persist()

    def delete_subscription_group_config(self, group: str) -> bool:
        """Forget a group's settings (DELETE_SUBSCRIPTIONGROUP); True when it existed."""
        removed = self._table.remove(group)
        if removed is None:
            return False
        log.info("deleted subscription group %s", group)
        self.persist()
        return True

    def sync_from_master(self, master: SubscriptionGroupTable) -> bool:
        """Become a copy of the master's table (a slave's periodic sync): replaced whole, with
        the master's data version, when that version differs from ours; persists.

        Returns:
            True when the table changed.
        """
        if master.data_version == self._table.data_version:
            return False
        self._table = SubscriptionGroupTable(list(master), DataVersion(
            master.data_version.counter, master.data_version.timestamp_ms))
        self.persist()
        return True

    def all(self) -> list[SubscriptionGroupConfig]:
        """Every group's settings."""
        return list(self._table)

    @property
    def data_version(self) -> int:
        """The table's change counter."""
        return self._table.data_version.counter

    def to_json(self) -> bytes:
        """The table as compact JSON: the GET_ALL_SUBSCRIPTIONGROUP_CONFIG body."""
        return self._table.to_json()

    def persist(self) -> None:
        """Record a change: write subscriptionGroup.json now (atomically, keeping a .bak), or
        have the background saver write it soon (``defer_persistence``).

        Raises:
            StoreFull, StoreError: the write failed (the change stays in memory).
        """
        self._count_change()

