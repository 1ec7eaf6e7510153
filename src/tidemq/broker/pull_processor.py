"""PULL_MESSAGE (11): read a queue for a consumer group, or park the pull until data arrives.

A pull goes through RocketMQ's checks in RocketMQ's order (docs/protocol.md §4.4), each failing
with RocketMQ's response code and a remark that names the thing and the fix:

1. the request header parses (else SYSTEM_ERROR naming the field);
2. the broker is readable (brokerPermission)                    NO_PERMISSION
3. the subscription group exists or may be auto-created         SUBSCRIPTION_GROUP_NOT_EXIST
4. the group may consume (consumeEnable)                        NO_PERMISSION
5. the topic exists                                             TOPIC_NOT_EXIST
6. the topic is readable (perm)                                 NO_PERMISSION
7. 0 <= queueId < readQueueNums                                 SYSTEM_ERROR
8. the subscription: from the ``subscription`` header when the SUBSCRIPTION flag is set,
   else from the group's heartbeats: group known, topic subscribed, heartbeat version not
   older than the pull's                                       SUBSCRIPTION_NOT_EXIST /
                                                                SUBSCRIPTION_NOT_LATEST;
   broadcasting only when consumeBroadcastEnable                NO_PERMISSION
9. SQL92 only with enablePropertyFilter                         SYSTEM_ERROR
10. SQL92: the group's compiled filter (``ConsumerFilterTable``): a ``subscription`` header
    that does not compile                                      SUBSCRIPTION_PARSE_FAILED;
    a heartbeat expression that does not compile               FILTER_DATA_NOT_EXIST;
    filter older than the pull's subVersion                    FILTER_DATA_NOT_LATEST

Then the store is read (TAG subscriptions filter by tag code; ``*`` and SQL92 read
everything) and the store's status becomes the response code, always with the four header
fields suggestWhichBrokerId, nextBeginOffset, minOffset and maxOffset. A SQL92 subscription
then keeps the records whose properties (TAGS included) the expression matches; the others
are skipped as a tag filter skips them: nextBeginOffset still moves past them, and a read
whose records all fail the filter is a NO_MATCHED_MESSAGE. With filterSupportRetry, the
records of ``%RETRY%<group>`` are filtered by the group's SQL92 expression of the topic each
was first sent to (RETRY_TOPIC); without it (the default, as RocketMQ) they are not. TAG
subscriptions take no per-message step here.

    FOUND                                        SUCCESS (0), body = the stored records as they are
    NO_MATCHED_MESSAGE, MESSAGE_WAS_REMOVING     PULL_RETRY_IMMEDIATELY (20)
    NO_MESSAGE_IN_QUEUE, NO_MATCHED_LOGIC_QUEUE  PULL_OFFSET_MOVED (21) if offset != 0, else 19
    OFFSET_TOO_SMALL, OFFSET_OVERFLOW_BADLY      PULL_OFFSET_MOVED (21)
    OFFSET_OVERFLOW_ONE, OFFSET_FOUND_NULL       PULL_NOT_FOUND (19)

On a slave (as RocketMQ 4.9): the pull is served whatever slaveReadEnable says (a consumer
whose master is gone reads on from the slave); PULL_OFFSET_MOVED becomes
PULL_RETRY_IMMEDIATELY at the requested offset (a lagging copy is no reason to move the
consumer); the COMMIT_OFFSET flag is ignored. suggestWhichBrokerId follows §13.3: 0 without
slaveReadEnable; with it, the group's whichBrokerWhenConsumeSlowly when the data pulled lies
further behind the commit log's end than accessMessageInMemoryMaxRatio percent of the
machine's memory, else the group's brokerId.

A PULL_NOT_FOUND with the SUSPEND flag is parked in the ``PullRequestHoldService`` (long
polling) instead of answered. With the COMMIT_OFFSET flag the consumer's ``commitOffset`` is
stored for the group (not on a slave), once, when the pull first arrives.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from tidemq.broker.client_manager import (
    BROADCASTING,
    EXPRESSION_TYPE_SQL92,
    EXPRESSION_TYPE_TAG,
    SubscriptionData,
    build_subscription,
)
from tidemq.broker.config import PERM_READ
from tidemq.broker.pull_hold_service import PullMode
from tidemq.errors import CorruptRecord, HeaderFieldError
from tidemq.filter.consumer_filters import FilterData
from tidemq.filter.record_filter import filter_records
from tidemq.protocol.codes import (
    FLAG_RESPONSE,
    TIDEMQ_VERSION,
    LanguageCode,
    RequestCode,
    ResponseCode,
)
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import PullMessageRequestHeader
from tidemq.protocol.message import POSITION_PHYSICAL_OFFSET, PROPERTY_RETRY_TOPIC
from tidemq.protocol.pull_request_reader import PullRequestReader
from tidemq.store.interface import GetResult, GetStatus

if TYPE_CHECKING:
    from tidemq.broker.clients import Clients
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.consumer_offset_manager import ConsumerOffsetManager
    from tidemq.broker.identity import BrokerIdentity
    from tidemq.broker.pull_hold_service import PullRequestHoldService
    from tidemq.broker.role import ReplicationRole
    from tidemq.broker.runtime_info import BrokerStats
    from tidemq.broker.subscription_group_manager import SubscriptionGroupManager
    from tidemq.broker.topic_config_manager import TopicConfigManager
    from tidemq.remoting.connection import Connection
    from tidemq.remoting.server import RemotingServer
    from tidemq.store.config_tables import SubscriptionGroupConfig
    from tidemq.store.interface import MessageStore

log = logging.getLogger("tidemq.broker")

# PullSysFlag bits (docs/protocol.md §4.4).
PULL_FLAG_COMMIT_OFFSET = 0x1
PULL_FLAG_SUSPEND = 0x2
PULL_FLAG_SUBSCRIPTION = 0x4
PULL_FLAG_CLASS_FILTER = 0x8
PULL_FLAG_LITE_PULL = 0x10

MASTER_ID = 0

# When the memory size cannot be read, assume 8 GiB (a common broker host).
MEMORY_BYTES_UNKNOWN = 8 * 1024**3

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"

# A record filter: the properties of one stored message -> deliver it?
RecordTest = Callable[[dict[str, str]], bool]

# Per-pull transfer bounds. RocketMQ stops at 32 messages / 256 KiB when the data is in
# memory; Java and C++ consumers ask for 32 anyway. We let a client that asks for more (the
# Spark reader, the bench consumer) get up to 1024 messages / 1 MiB per round trip, because in
# Python the fixed cost of a pull, not the bytes, bounds consuming throughput.
PULL_TRANSFER_COUNT_MAX = 1024
PULL_TRANSFER_BYTES_MAX = 1024 * 1024

# Longest a pull may be held. Java push consumers ask 15 s and lite pull 20 s with a 30 s
# socket timeout; anything above minutes is a client bug that would pin the request.
SUSPEND_TIMEOUT_MAX_MS = 300_000

# A parked pull is re-read from its offset on every arrival. When this many entries that do not
# match its filter have piled up, it is answered PULL_RETRY_IMMEDIATELY instead, so that the
# consumer moves past them and later re-reads stay short.
WAKE_SKIPPED_ENTRIES_MAX = 256

# Subscriptions built from pull headers, cached by (topic, expression, type): a C++ or ali-ons
# consumer sends its expression with every pull. Cleared when it grows past this.
_SUBSCRIPTION_CACHE_MAX = 4096

_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")

_CODE_BY_STATUS = {
    GetStatus.FOUND: ResponseCode.SUCCESS,
    GetStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetStatus.MESSAGE_WAS_REMOVING: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
    GetStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetStatus.OFFSET_FOUND_NULL: ResponseCode.PULL_NOT_FOUND,
    # NO_MESSAGE_IN_QUEUE and NO_MATCHED_LOGIC_QUEUE depend on the offset asked for.
}

_STATUS_EXPLANATION = {
    GetStatus.NO_MATCHED_MESSAGE: "no message from offset {offset} on matches the subscription "
    "{expression!r}; pull again from nextBeginOffset",
    GetStatus.MESSAGE_WAS_REMOVING: "the messages at offset {offset} are being deleted by "
    "retention; pull again from nextBeginOffset",
    GetStatus.OFFSET_TOO_SMALL: "offset {offset} is below the queue's min offset {min}; its "
    "messages were deleted by retention, continue from nextBeginOffset",
    GetStatus.OFFSET_OVERFLOW_BADLY: "offset {offset} is beyond the queue's max offset {max}; "
    "continue from nextBeginOffset",
    GetStatus.OFFSET_OVERFLOW_ONE: "no new message after offset {offset}",
    GetStatus.OFFSET_FOUND_NULL: "no consume-queue entry at offset {offset}; pull again from "
    "nextBeginOffset",
    GetStatus.NO_MESSAGE_IN_QUEUE: "the queue holds no message yet (max offset 0)",
    GetStatus.NO_MATCHED_LOGIC_QUEUE: "the queue has never been written",
}


class PullMessageProcessor:
    """Serves PULL_MESSAGE for one broker.

    Args:
        config: brokerPermission, slaveReadEnable, longPollingEnable, shortPollingTimeMills,
            enablePropertyFilter, filterSupportRetry, brokerName (remarks).
        store: read for the messages.
        identity: the broker's address (remarks).
        role: a slave serves pulls only with slaveReadEnable and stores no offsets.
        stats: counts the messages handed out.
        topics, groups, offsets: topic configs, subscription groups, committed offsets.
        clients: the consumers' heartbeats (subscriptions) and SQL92 filters.
        pull_holds: where a pull with nothing to read is parked (long polling).
    """

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        identity: BrokerIdentity,
        role: ReplicationRole,
        stats: BrokerStats,
        topics: TopicConfigManager,
        groups: SubscriptionGroupManager,
        offsets: ConsumerOffsetManager,
        clients: Clients,
        pull_holds: PullRequestHoldService,
    ) -> None:
        self._config = config
        self._store = store
        self._identity = identity
        self._role = role
        self._stats = stats
        self._topics = topics
        self._groups = groups
        self._offsets = offsets
        self._clients = clients
        self._pull_holds = pull_holds
        self._subscription_cache: dict[tuple[str, str | None, str | None], SubscriptionData] = {}
        # A consumer repeats all but the queue and offsets of its pulls: their shape is
        # parsed once (protocol/pull_request_reader.py).
        self._read_header = PullRequestReader().read

    def register(self, server: RemotingServer) -> None:
        """Register the PULL_MESSAGE handler on ``server``: an immediate one (a pull reads
        the store or parks, and never waits), so no task is made per pull; the pulls of one
        read go to ``handle_group`` together."""
        server.register(RequestCode.PULL_MESSAGE, self.handle, immediate=True,
                        group_handler=self.handle_group)

    def handle(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand | None:
        """The PULL_MESSAGE handler (a plain function, run as the request is dispatched): a
        response, or None when the pull was parked."""
        return self.process(request, connection, _FIRST)

    def handle_group(
        self, requests: list[RemotingCommand], connection: Connection
    ) -> list[RemotingCommand | None]:
        """The pulls of one read, each answered (or parked: None) as ``handle`` would, in
        order.

        A consumer that owns several queues re-pulls them together (tidemq's PullConsumer at
        20,000 msg/s: its 8 queues' pulls in one read, after one write of the woken
        answers): one call instead of a dispatch each, and the checks of the module
        docstring but the queue id's (step 7) are made once for the pulls alike in what
        they read (group, topic, subscription). Nothing else runs on the loop meanwhile, so
        what they read cannot change between those pulls.
        """
        passed: dict[tuple[object, ...], tuple[SubscriptionData, SubscriptionGroupConfig,
                                              int]] = {}
        return [self.process(request, connection, _FIRST, None, passed)
                for request in requests]

    def process(
        self, request: RemotingCommand, connection: Connection, mode: PullMode,
        header: PullMessageRequestHeader | None = None,
        passed: dict[tuple[object, ...], tuple[SubscriptionData, SubscriptionGroupConfig,
                                               int]] | None = None,
    ) -> RemotingCommand | None:
        """Run one pull.

        Args:
            mode: FIRST for a pull as it arrives (may park it, commits the offset); WAKE for
                a parked pull re-run after an arrival (returns None while nothing new matched);
                FINAL for a parked pull at its deadline (always answers).
            header: ``request``'s header parsed already (a parked pull's re-run), or None to
                parse it here.
            passed: the outcomes of the checks (``_check``) that earlier pulls served with
                this dict passed, by what they read but the queue id: the pulls of one read
                (``handle_group``) or of one pass of the hold service (its shared dict,
                ``PullExecutor``); None to make them for this pull alone.
        Returns:
            The response, or None (parked, or keep waiting).
        """
        if header is None:
            try:
                header = self._read_header(request.ext_fields)
            except HeaderFieldError as e:
                return _error(request, ResponseCode.SYSTEM_ERROR, str(e))
        key = None
        shared = None
        if passed is not None:
            key = (header.consumer_group, header.topic, header.sys_flag & PULL_FLAG_SUBSCRIPTION,
                   header.subscription, header.expression_type, header.sub_version)
            shared = passed.get(key)
        if shared is None:
            refusal, shared = self._check(request, connection, header)
            if refusal is not None:
                return refusal
            assert shared is not None
            if key is not None:
                passed[key] = shared  # type: ignore[index]
        elif not 0 <= header.queue_id < shared[2]:
            return self._illegal_queue(request, connection, header, shared[2])
        subscription, group_config, _ = shared
        record_test: RecordTest | None = None
        if subscription.expression_type == EXPRESSION_TYPE_SQL92:
            refusal, record_test = self._sql_filter(request, header, subscription)
            if refusal is not None:
                return refusal
        elif self._config.filter_support_retry and header.topic.startswith(
            RETRY_GROUP_TOPIC_PREFIX
        ):
            record_test = self._retry_filter(header.consumer_group)
        result = self._store.get_messages(
            header.topic,
            header.queue_id,
            header.queue_offset,
            min(max(header.max_msg_nums, 1), PULL_TRANSFER_COUNT_MAX),
            PULL_TRANSFER_BYTES_MAX,
            subscription.code_set,
        )
        status = result.status
        if status is _FOUND:
            if record_test is not None:
                result = _filter_result(result, record_test, header)
                status = result.status
            code = _SUCCESS if status is _FOUND else _response_code(result, header.queue_offset)
        elif status is _OFFSET_OVERFLOW_ONE:  # nothing after the offset: the usual miss
            code = _PULL_NOT_FOUND
        else:
            code = _response_code(result, header.queue_offset)
        if code == _PULL_NOT_FOUND:
            if mode is _FIRST:
                if header.sys_flag & PULL_FLAG_COMMIT_OFFSET:
                    self._commit_offset_of(header)
                if header.sys_flag & PULL_FLAG_SUSPEND:
                    # Parked before its answer is built: nobody would be sent it.
                    return self._park(request, connection, header)
            elif mode is _WAKE:
                return None  # nothing new yet: keep the pull parked
        elif mode is _WAKE and (
            status is _NO_MATCHED_MESSAGE
            and result.next_begin_offset - header.queue_offset < WAKE_SKIPPED_ENTRIES_MAX
        ):
            return None  # nothing new matched yet: keep the pull parked
        elif mode is _FIRST and header.sys_flag & PULL_FLAG_COMMIT_OFFSET:
            self._commit_offset_of(header)
        config = self._config
        suggest = (self._suggested_broker_id(group_config, result) if config.slave_read_enable
                   else MASTER_ID)
        next_begin_offset = result.next_begin_offset
        if code == _PULL_OFFSET_MOVED and self._role.is_slave:
            # A slave may lag its master: its view of the queue is no reason to move the
            # consumer (RocketMQ without offsetCheckInSlave).
            code, next_begin_offset = ResponseCode.PULL_RETRY_IMMEDIATELY, header.queue_offset
        # PullMessageResponseHeader's extFields (its to_ext_fields, in its field order, which
        # the ROCKETMQ header keeps), written out: the typed header cost ~0.9 us a pull.
        ext_fields = {
            "suggestWhichBrokerId": str(suggest),
            "nextBeginOffset": str(next_begin_offset),
            "minOffset": str(result.min_offset),
            "maxOffset": str(result.max_offset),
        }
        if code == _SUCCESS:
            self._stats.record_get(result.message_count, header.topic, header.consumer_group,
                                   len(result.body))
            # RemotingCommand.response_to without its copy of the fresh ext_fields dict.
            return RemotingCommand(_SUCCESS, request.opaque, FLAG_RESPONSE, _FOUND_REMARK,
                                   ext_fields, result.body, _PYTHON, TIDEMQ_VERSION,
                                   request.serialize_type)
        return RemotingCommand(int(code), request.opaque, FLAG_RESPONSE,
                               _remark(result, header, subscription), ext_fields, None,
                               _PYTHON, TIDEMQ_VERSION, request.serialize_type)

    def _commit_offset_of(self, header: PullMessageRequestHeader) -> None:
        """Commit the offset a pull with the COMMIT_OFFSET flag carries, once, as it
        arrives; a slave keeps no consumer offsets of its own."""
        if not self._role.is_slave:
            self._offsets.commit_offset(
                header.consumer_group, header.topic, header.queue_id, header.commit_offset
            )

    def _park(self, request: RemotingCommand, connection: Connection,
              header: PullMessageRequestHeader) -> RemotingCommand | None:
        """Park a suspended pull that found nothing new (None), or the SYSTEM_BUSY answer
        when the hold service holds all it may."""
        config = self._config
        timeout_ms = (
            header.suspend_timeout_millis if config.long_polling_enable
            else config.short_polling_time_ms
        )
        hold = self._pull_holds
        parked = hold.park(
            request, connection, header.topic, header.queue_id, header.queue_offset,
            min(max(timeout_ms, 0), SUSPEND_TIMEOUT_MAX_MS), self.process, header,
        )
        if parked:
            return None
        return _error(
            request, ResponseCode.SYSTEM_BUSY,
            f"[REJECTREQUEST]system busy, {hold.parked_count} pull requests are already "
            f"waiting for messages (limit {hold.parked_max}); pull again later",
        )

    def _suggested_broker_id(self, group_config: SubscriptionGroupConfig,
                             result: GetResult) -> int:
        """suggestWhichBrokerId (docs/protocol.md §13.3): the master (0) unless slaveReadEnable;
        with it, the group's whichBrokerWhenConsumeSlowly when the pulled data lies further
        behind the log's end than accessMessageInMemoryMaxRatio of the memory, else the
        group's brokerId.

        As RocketMQ 4.9, a slave serves the pulls it receives whatever slaveReadEnable says
        (a consumer whose master is gone reads on from it); the setting only decides where
        consumers are told to go next.
        """
        config = self._config
        if not config.slave_read_enable:
            return MASTER_ID  # (process does not call this then: the common case inline)
        if result.status is GetStatus.FOUND and self._behind_memory(result.body):
            return group_config.which_broker_when_consume_slowly
        return group_config.broker_id

    def _behind_memory(self, body: bytes) -> bool:
        """True when the last record of ``body`` starts further from the commit log's end
        than accessMessageInMemoryMaxRatio percent of the machine's memory."""
        last = last_physical_offset(body)
        if last is None:
            return False
        threshold = MEMORY_BYTES * self._config.access_message_in_memory_max_ratio // 100
        return self._store.commit_log_max_offset() - last > threshold

    # -- checks -------------------------------------------------------------------------------

    def _check(
        self, request: RemotingCommand, connection: Connection, header: PullMessageRequestHeader
    ) -> tuple[RemotingCommand | None,
               tuple[SubscriptionData, SubscriptionGroupConfig, int] | None]:
        """RocketMQ's pre-checks in order: (refusal, None) or (None, (subscription, group
        config, the topic's readQueueNums)).

        Of the request they read the group, the topic, the queue id, the sysFlag's
        SUBSCRIPTION bit, the subscription, its expression type and subVersion; all but the
        queue id (step 7) give the same outcome to pulls alike in the others, so a pull
        alike one that passed needs only the queue id's check (``process``, ``passed``).
        """
        config = self._config
        group = header.consumer_group
        topic = header.topic
        if not config.is_readable:
            return _error(
                request, ResponseCode.NO_PERMISSION,
                f"the broker {self._identity.address} does not allow pulls "
                f"(brokerPermission={config.broker_permission} lacks read 4); set "
                "brokerPermission=6",
            ), None
        group_manager = self._groups
        group_config = group_manager.find_subscription_group_config(group)
        if group_config is None:
            return _error(
                request, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group {group} does not exist on broker {config.broker_name}; "
                "create it with `tidemq admin updateSubGroup` or set "
                "autoCreateSubscriptionGroup=true",
            ), None
        if not group_config.consume_enable:
            return _error(
                request, ResponseCode.NO_PERMISSION,
                f"subscription group {group} may not consume (consumeEnable=false); enable it "
                "with `tidemq admin updateSubGroup`",
            ), None
        topic_config = self._topics.get(topic)
        if topic_config is None:
            return _error(
                request, ResponseCode.TOPIC_NOT_EXIST,
                f"topic {topic} does not exist on broker {config.broker_name}; create it "
                "with `tidemq admin updateTopic` first",
            ), None
        if not topic_config.perm & PERM_READ:
            return _error(
                request, ResponseCode.NO_PERMISSION,
                f"topic {topic} may not be read (perm={topic_config.perm} lacks read 4); "
                "update its perm with `tidemq admin updateTopic -p 6`",
            ), None
        read_queue_nums = topic_config.read_queue_nums
        if not 0 <= header.queue_id < read_queue_nums:
            return self._illegal_queue(request, connection, header, read_queue_nums), None
        if header.sys_flag & PULL_FLAG_SUBSCRIPTION:
            subscription = self._subscription_from_header(header)
        else:
            consumers = self._clients.consumers
            info = consumers.get(group)
            if info is None:
                return _error(
                    request, ResponseCode.SUBSCRIPTION_NOT_EXIST,
                    f"consumer group {group} has sent no heartbeat to broker "
                    f"{config.broker_name}; send HEART_BEAT before pulling",
                ), None
            if info.message_model == BROADCASTING and not group_config.consume_broadcast_enable:
                return _error(
                    request, ResponseCode.NO_PERMISSION,
                    f"consumer group {group} may not consume by broadcasting "
                    "(consumeBroadcastEnable=false)",
                ), None
            subscription = info.find_subscription(topic)
            if subscription is None:
                return _error(
                    request, ResponseCode.SUBSCRIPTION_NOT_EXIST,
                    f"consumer group {group} does not subscribe to topic {topic} in its "
                    "heartbeat; subscribe to it and send HEART_BEAT before pulling",
                ), None
            if subscription.sub_version < header.sub_version:
                return _error(
                    request, ResponseCode.SUBSCRIPTION_NOT_LATEST,
                    f"the subscription of group {group} to {topic} is version "
                    f"{subscription.sub_version}, older than the pull's {header.sub_version}; "
                    "send HEART_BEAT with the new subscription",
                ), None
        refusal = self._check_expression_type(request, subscription)
        if refusal is not None:
            return refusal, None
        return None, (subscription, group_config, read_queue_nums)

    def _illegal_queue(self, request: RemotingCommand, connection: Connection,
                       header: PullMessageRequestHeader, read_queue_nums: int
                       ) -> RemotingCommand:
        """Step 7's refusal: the queue id is not one of the topic's read queues."""
        return _error(
            request, ResponseCode.SYSTEM_ERROR,
            f"queueId {header.queue_id} is illegal for topic {header.topic}: it has "
            f"{read_queue_nums} read queues (0...{read_queue_nums - 1}); consumer "
            f"{connection.remote_address}",
        )

    def _check_expression_type(
        self, request: RemotingCommand, subscription: SubscriptionData
    ) -> RemotingCommand | None:
        kind = subscription.expression_type
        if kind == EXPRESSION_TYPE_TAG:
            return None
        if kind != EXPRESSION_TYPE_SQL92:
            return _error(
                request, ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                f"expression type {kind!r} of the subscription to {subscription.topic} is "
                "unknown; use TAG or SQL92",
            )
        if not self._config.enable_property_filter:
            return _error(
                request, ResponseCode.SYSTEM_ERROR,
                "SQL92 filter is not enabled (set enablePropertyFilter=true)",
            )
        return None

    def _sql_filter(
        self,
        request: RemotingCommand,
        header: PullMessageRequestHeader,
        subscription: SubscriptionData,
    ) -> tuple[RemotingCommand | None, RecordTest | None]:
        """The group's compiled SQL92 filter of the topic, or the refusal (step 10)."""
        table = self._clients.filters
        group = header.consumer_group
        from_header = bool(header.sys_flag & PULL_FLAG_SUBSCRIPTION)
        data = table.get(group, header.topic)
        if data is None or data.text != subscription.sub_string or (
            data.sub_version < subscription.sub_version
        ):
            data = table.register(group, header.topic, subscription.sub_string,
                                  subscription.sub_version)
        if data.problem is not None:
            code = (ResponseCode.SUBSCRIPTION_PARSE_FAILED if from_header
                    else ResponseCode.FILTER_DATA_NOT_EXIST)
            return _error(
                request, code,
                f"the SQL92 subscription of group {group} to {header.topic} does not compile, "
                f"so the broker has no filter for it: {data.problem}",
            ), None
        if not from_header and data.sub_version < header.sub_version:
            return _error(
                request, ResponseCode.FILTER_DATA_NOT_LATEST,
                f"the SQL92 filter of group {group} on {header.topic} is version "
                f"{data.sub_version}, older than the pull's {header.sub_version}; send "
                "HEART_BEAT with the new subscription",
            ), None
        return None, _matches(data)

    def _retry_filter(self, group: str) -> RecordTest | None:
        """filterSupportRetry: test retried messages against the group's SQL92 filter of the
        topic each was first sent to; None when the group has no SQL92 subscription."""
        info = self._clients.consumers.get(group)
        if info is None:
            return None
        table = self._clients.filters
        filters: dict[str, RecordTest] = {}
        for topic, subscription in info.subscriptions.items():
            if subscription.expression_type != EXPRESSION_TYPE_SQL92:
                continue
            data = table.get(group, topic)
            if data is None or data.text != subscription.sub_string:
                data = table.register(group, topic, subscription.sub_string,
                                      subscription.sub_version)
            if data.expression is not None:
                filters[topic] = _matches(data)
        if not filters:
            return None

        def test(properties: dict[str, str]) -> bool:
            original = filters.get(properties.get(PROPERTY_RETRY_TOPIC, ""))
            return original is None or original(properties)

        return test

    def _subscription_from_header(self, header: PullMessageRequestHeader) -> SubscriptionData:
        key = (header.topic, header.subscription, header.expression_type)
        subscription = self._subscription_cache.get(key)
        if subscription is None:
            if len(self._subscription_cache) >= _SUBSCRIPTION_CACHE_MAX:
                self._subscription_cache.clear()
            subscription = build_subscription(
                header.topic, header.subscription, header.expression_type, header.sub_version
            )
            self._subscription_cache[key] = subscription
        return subscription


def last_physical_offset(body: bytes) -> int | None:
    """The commit-log offset of the last record of a pull body (records back to back, each
    starting with its int32 total size; the physical offset at POSITION_PHYSICAL_OFFSET)."""
    position = 0
    last = None
    end = len(body)
    while position + POSITION_PHYSICAL_OFFSET + 8 <= end:
        size = _INT32.unpack_from(body, position)[0]
        if size <= 0:
            break
        last = position
        position += size
    if last is None:
        return None
    return _INT64.unpack_from(body, last + POSITION_PHYSICAL_OFFSET)[0]


def _memory_bytes() -> int:
    """The machine's physical memory (RocketMQ's TOTAL_PHYSICAL_MEMORY_SIZE)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return MEMORY_BYTES_UNKNOWN


def _matches(data: FilterData) -> RecordTest:
    expression = data.expression
    assert expression is not None
    return expression.matches


def _filter_result(
    result: GetResult, record_test: RecordTest, header: PullMessageRequestHeader
) -> GetResult:
    """Keep the records of a FOUND read that pass ``record_test``; none -> NO_MATCHED_MESSAGE.

    The offsets stay those of the read: the consumer moves past the skipped records.
    """
    try:
        body, kept, dropped = filter_records(result.body, record_test)
    except CorruptRecord as e:
        # Not the consumer's doing, and no reason to hand it records it did not ask for:
        # skip this read as unmatched and say why in the log.
        log.error("pull of %s queue %d at offset %d: %s", header.topic, header.queue_id,
                  header.queue_offset, e)
        body, kept, dropped = b"", 0, result.message_count
    if not dropped:
        return result
    status = GetStatus.FOUND if kept else GetStatus.NO_MATCHED_MESSAGE
    return GetResult(status, result.next_begin_offset, result.min_offset, result.max_offset,
                     body, kept)


# Bound once: an Enum member looked up on its class, or its ``value`` (a property), is a
# Python-level step on every pull.
_FOUND = GetStatus.FOUND
_OFFSET_OVERFLOW_ONE = GetStatus.OFFSET_OVERFLOW_ONE
_NO_MATCHED_MESSAGE = GetStatus.NO_MATCHED_MESSAGE
_FOUND_REMARK = GetStatus.FOUND.value
_SUCCESS = int(ResponseCode.SUCCESS)
_PULL_NOT_FOUND = int(ResponseCode.PULL_NOT_FOUND)
_PULL_OFFSET_MOVED = int(ResponseCode.PULL_OFFSET_MOVED)
_FIRST = PullMode.FIRST
_WAKE = PullMode.WAKE
_PYTHON = LanguageCode.PYTHON

# Keyed by the status's value: hashing a str is cheaper than hashing an Enum member, and this
# runs for every pull.
_CODE_BY_STATUS_VALUE = {status.value: code for status, code in _CODE_BY_STATUS.items()}


def _response_code(result: GetResult, requested_offset: int) -> ResponseCode:
    status = result.status
    if status is _FOUND:  # the common answer, without the table
        return ResponseCode.SUCCESS
    code = _CODE_BY_STATUS_VALUE.get(status.value)
    if code is not None:
        return code
    # NO_MESSAGE_IN_QUEUE / NO_MATCHED_LOGIC_QUEUE: an empty queue is "nothing new" for a
    # consumer at 0, but a consumer elsewhere must be moved back (RocketMQ's rule).
    return ResponseCode.PULL_OFFSET_MOVED if requested_offset != 0 else ResponseCode.PULL_NOT_FOUND


def _remark(
    result: GetResult, header: PullMessageRequestHeader, subscription: SubscriptionData
) -> str:
    explanation = _STATUS_EXPLANATION.get(result.status, "")
    text = explanation.format(
        offset=header.queue_offset, min=result.min_offset, max=result.max_offset,
        expression=subscription.sub_string,
    )
    return f"{result.status.value}: {header.topic} queue {header.queue_id}: {text}"


def _error(request: RemotingCommand, code: int, remark: str) -> RemotingCommand:
    return RemotingCommand.response_to(request, code, remark=remark)


MEMORY_BYTES = _memory_bytes()
