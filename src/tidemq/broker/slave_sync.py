"""A slave's metadata follows its master: topics, offsets, delay offsets, subscription groups.

Every SLAVE_SYNC_INTERVAL_MS (10 s; every second while it holds offsets the master lacks) a
slave that knows its master's address (from the name server's REGISTER_BROKER answer,
``ReplicationRole.master_address``) asks it, in this order:

    GET_ALL_TOPIC_CONFIG               topics.json            replaced when its version differs
    GET_ALL_CONSUMER_OFFSET            consumerOffset.json    merged (below)
    GET_ALL_DELAY_OFFSET               delayOffset.json       replaced
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG   subscriptionGroup.json replaced when its version differs

The bodies are RocketMQ's (store/config_tables.py), so a tidemq slave follows an Apache
RocketMQ master and the other way round. A table that fails (master gone, bad body) is
skipped and logged once per outage; the others are still copied.

Offsets committed to the slave are not thrown away (RocketMQ 4.x replaces the slave's table
with the master's, so what consumers committed to the slave while the master was down is
lost when it returns, and a consumer that restarts then reads those messages again). Here
the slave remembers every offset committed to it (``ConsumerOffsetManager`` with
``remember_local_commits``, saved in consumerOffset.json so a restart keeps them); a sync
keeps, per queue, the larger of the master's offset and the local commit, and hands each
local commit still ahead of the master back to it with UPDATE_CONSUMER_OFFSET carrying
``tidemqKeepLarger=true``, which the master applies as "keep the larger". A local commit is
forgotten once the master's table has reached it. docs/operations.md ("Reading from slaves,
and offsets through a master outage") tells operators the same.

Ownership: one task on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidemq.broker.consumer_offset_manager import KEEP_LARGER_EXT_FIELD
from tidemq.broker.outgoing import refusal_hint
from tidemq.errors import StoreError, TidemqError
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import UpdateConsumerOffsetRequestHeader
from tidemq.remoting.errors import RemotingError
from tidemq.store.config_tables import (
    ConsumerOffsetTable,
    DelayOffsetTable,
    SubscriptionGroupTable,
    TopicConfigTable,
)

if TYPE_CHECKING:
    from tidemq.broker.consumer_offset_manager import ConsumerOffsetManager
    from tidemq.broker.role import ReplicationRole
    from tidemq.broker.schedule_service import ScheduleMessageService
    from tidemq.broker.subscription_group_manager import SubscriptionGroupManager
    from tidemq.broker.topic_config_manager import TopicConfigManager
    from tidemq.remoting.client import RemotingClient

log = logging.getLogger("tidemq.broker")

# The period (RocketMQ 4.x runs SlaveSynchronize.syncAll 10 s after start, then
# every 60 s; consumers that fail over want fresher offsets than that).
SLAVE_SYNC_INTERVAL_MS = 10_000
# While the slave holds offsets its master lacks (committed here while the master was away),
# it tries every second, so a master back from a restart has them almost at once.
SLAVE_SYNC_HAND_BACK_INTERVAL_MS = 1_000
# One GET_ALL_* round trip; a master answering slower is treated as away for this round.
SLAVE_SYNC_TIMEOUT_MS = 3_000


class SlaveSynchronizer:
    """Copies the master's four tables to this slave (module docstring).

    Args:
        role: the master's address (None until a name server told it).
        topics, offsets, groups: this slave's tables.
        schedule: the delay scheduler, whose offsets are replaced.
        client: the broker's remoting client.
        interval_ms, timeout_ms: period and per-request timeout.
    """

    def __init__(
        self,
        *,
        role: ReplicationRole,
        topics: TopicConfigManager,
        offsets: ConsumerOffsetManager,
        groups: SubscriptionGroupManager,
        schedule: ScheduleMessageService,
        client: RemotingClient,
        interval_ms: int = SLAVE_SYNC_INTERVAL_MS,
        timeout_ms: int = SLAVE_SYNC_TIMEOUT_MS,
    ) -> None:
        self._role = role
        self._topics = topics
        self._offsets = offsets
        self._groups = groups
        self._schedule = schedule
        self._client = client
        self._interval_s = interval_ms / 1000
        self._timeout_ms = timeout_ms
        self._task: asyncio.Task[None] | None = None
        self._failing: set[str] = set()  # tables whose last copy failed (log once)
        self.rounds_completed = 0

    async def start(self) -> None:
        """Start the periodic task."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="tidemq-slave-sync")

    async def stop(self) -> None:
        """Stop the periodic task (a round in progress is cancelled)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def sync_all(self) -> bool:
        """One round now: copy the four tables from the master.

        Returns:
            False when no master address is known yet, True when the round ran (a table
            that failed is logged and left as it was).
        """
        master = self._role.master_address
        if not master:
            return False
        await self._copy(master, RequestCode.GET_ALL_TOPIC_CONFIG, "topics",
                         TopicConfigTable.from_json, self._topics.sync_from_master)
        await self._copy(master, RequestCode.GET_ALL_CONSUMER_OFFSET, "consumer offsets",
                         ConsumerOffsetTable.from_json, self._merge_offsets(master))
        await self._copy(master, RequestCode.GET_ALL_DELAY_OFFSET, "delay offsets",
                         DelayOffsetTable.from_json, self._schedule.sync_from_master)
        await self._copy(master, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
                         "subscription groups", SubscriptionGroupTable.from_json,
                         self._groups.sync_from_master)
        self.rounds_completed += 1
        return True

    # -- internals ----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            pending = bool(self._offsets.local_commits)
            await asyncio.sleep(min(self._interval_s, SLAVE_SYNC_HAND_BACK_INTERVAL_MS / 1000)
                                if pending else self._interval_s)
            try:
                await self.sync_all()
            except Exception:  # a bug here must not end the copying for good
                log.exception("copying metadata from the master failed; retrying in %g s",
                              self._interval_s)

    async def _copy(self, master: str, code: int, what: str, parse: Callable[[bytes], Any],
                    apply: Callable[[Any], Any]) -> None:
        try:
            response = await self._client.invoke(
                master, RemotingCommand.request(code), self._timeout_ms)
            if response.code != ResponseCode.SUCCESS:
                raise TidemqError(f"it answered code {response.code}: {response.remark or ''}"
                                  f"{refusal_hint(response.code)}")
            table = parse(response.body or b"")
        except (RemotingError, TidemqError, ValueError) as exc:
            self._failed(what, f"slave could not copy the {what} of master {master}: {exc}; "
                               f"keeping its own and retrying every {self._interval_s:g} s")
            return
        try:
            outcome = apply(table)
            if asyncio.iscoroutine(outcome):
                outcome = await outcome
        except StoreError as exc:
            # Taken in memory, but the file write failed (a full disk): the message names
            # the file and the fix. "keeping its own" would be wrong here.
            self._failed(what, f"slave took the {what} of master {master} but could not save "
                               f"them: {exc}; they are kept in memory and saved with the "
                               "next change")
            return
        except (RemotingError, TidemqError, ValueError) as exc:
            self._failed(what, f"slave could not copy the {what} of master {master}: {exc}; "
                               f"keeping its own and retrying every {self._interval_s:g} s")
            return
        if what in self._failing:
            self._failing.discard(what)
            log.info("slave copies the %s of master %s again", what, master)
        if outcome:
            log.debug("slave copied the %s of master %s", what, master)

    def _failed(self, what: str, message: str) -> None:
        # Once per outage of a table: a master away for an hour is one line, not 360.
        if what not in self._failing:
            self._failing.add(what)
            log.warning("%s", message)

    def _merge_offsets(self, master: str) -> Callable[[ConsumerOffsetTable], Any]:
        async def merge(table: ConsumerOffsetTable) -> bool:
            ahead = self._offsets.merge_from_master(table)
            for group, topic, queue_id, offset in ahead:
                await self._hand_back(master, group, topic, queue_id, offset)
            return bool(ahead)

        return merge

    async def _hand_back(self, master: str, group: str, topic: str, queue_id: int,
                         offset: int) -> None:
        """Tell the master an offset a consumer committed here while it was away."""
        fields = UpdateConsumerOffsetRequestHeader(
            consumer_group=group, topic=topic, queue_id=queue_id, commit_offset=offset,
        ).to_ext_fields()
        fields[KEEP_LARGER_EXT_FIELD] = "true"
        response = await self._client.invoke(
            master, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, fields),
            self._timeout_ms)
        if response.code != ResponseCode.SUCCESS:
            raise TidemqError(f"the master refused offset {offset} of group {group}, {topic} "
                              f"queue {queue_id}: code {response.code} {response.remark or ''}")
        log.info("slave handed offset %d of group %s, %s queue %d (committed here while the "
                 "master was away) back to master %s", offset, group, topic, queue_id, master)
