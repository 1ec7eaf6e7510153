"""The broker's admin requests (mqadmin's and slaves'), served as the default processor.

Every request code that no other processor registered lands here; codes this module does not
know are answered REQUEST_CODE_NOT_SUPPORTED with RocketMQ's remark
``" request type <code> not supported"`` (docs/protocol.md §1.5).

Served (docs/protocol.md §4.16, §5.5, §10.6):

- UPDATE_AND_CREATE_TOPIC (17): create or change a topic, wait until topics.json holds it
  durably, then register with the name servers before answering, so a route lookup right
  after sees it;
- DELETE_TOPIC_IN_BROKER (215): forget the topic, its consume queues and its offsets;
- GET_ALL_TOPIC_CONFIG (21): the topics.json content (TopicConfigSerializeWrapper);
- GET_BROKER_RUNTIME_INFO (28): KVTable of statistics (``runtime_info``);
- GET_TOPIC_STATS_INFO (202): TopicStatsTable, min/max offset and last store time per queue;
- GET_CONSUME_STATS (208): ConsumeStats of a group, broker and consumer offset per queue;
- GET_BROKER_CONFIG (26): the broker's settings as properties text;
- GET_ALL_CONSUMER_OFFSET (43), GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201), GET_ALL_DELAY_OFFSET
  (45): the config files' content (what a slave copies);
- UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200), DELETE_SUBSCRIPTIONGROUP (207).

A change of topics or groups is answered only once the config file holds it durably, as
RocketMQ persists on each update: concurrent changes share one save (group commit,
``background_saver.py``); a failed save answers SYSTEM_ERROR with a remark naming the file.

- GET_CONSUMER_RUNNING_INFO (307), INVOKE_BROKER_TO_RESET_OFFSET (222) and
  INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223): answered by asking the group's consumers
  (``client_admin``).

Maps keyed by MessageQueue are written the fastjson way, with a JSON object as the key
(docs/protocol.md §5): a Java admin tool cannot read them otherwise.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from tidemq.broker.client_admin import ClientAdmin
from tidemq.broker.config import (
    PERM_WRITE,
    TOPIC_QUEUE_NUMS_MAX,
    BrokerConfig,
    config_properties,
    properties_text,
)
from tidemq.broker.runtime_info import runtime_info
from tidemq.broker.topic_config_manager import TOPIC_FILTER_TYPES, TopicConfig
from tidemq.errors import HeaderFieldError, RemoteProtocolError, StoreError
from tidemq.limits import topic_name_problem
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import (
    CreateTopicRequestHeader,
    DeleteSubscriptionGroupRequestHeader,
    DeleteTopicRequestHeader,
    GetConsumeStatsRequestHeader,
    GetTopicStatsInfoRequestHeader,
)
from tidemq.protocol.message import POSITION_SYSFLAG, store_timestamp_position
from tidemq.store.config_tables import SubscriptionGroupConfig
from tidemq.store.interface import GetStatus

if TYPE_CHECKING:
    from tidemq.broker.consumer_offset_manager import ConsumerOffsetManager
    from tidemq.broker.identity import BrokerIdentity
    from tidemq.broker.namesrv_registration import NameServerRegistration
    from tidemq.broker.role import ReplicationRole
    from tidemq.broker.runtime_info import BrokerStats
    from tidemq.broker.schedule_service import ScheduleMessageService
    from tidemq.broker.subscription_group_manager import SubscriptionGroupManager
    from tidemq.broker.topic_config_manager import TopicConfigManager
    from tidemq.remoting.connection import Connection
    from tidemq.remoting.server import RemotingServer
    from tidemq.store.config import StoreConfig
    from tidemq.store.interface import MessageStore

log = logging.getLogger("tidemq.broker")

# Topics of at least this many write queues get their queue files made when created. Not
# all topics: an empty queue's file is opened and mapped at every start (a descriptor each),
# and 10,000 topics of 8 queues never written would hold 80,000; a narrow topic's first
# send makes at most a few files on the loop.
PREPARE_AT_CREATE_MIN_QUEUES = 16

_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")

# Largest record read to learn one message's store time: the whole record comes back, and
# a record is at most maxMessageSize plus its header and properties.
_ONE_RECORD_BYTES_MAX = 8 * 1024 * 1024

AdminHandler = Callable[[RemotingCommand], Awaitable[RemotingCommand]]


class AdminProcessor:
    """Serves the admin request codes of one broker; the server's default processor.

    Args:
        config, store_config: the settings (GET_BROKER_CONFIG, remarks).
        store: queue offsets and store times; topics' consume queues are deleted in it.
        identity: the broker's address (remarks).
        role: a slave refuses topic creation.
        stats: GET_BROKER_RUNTIME_INFO's counters.
        topics, groups, offsets: the tables the admin requests read and change.
        schedule: GET_ALL_DELAY_OFFSET's delayOffset.json.
        registration: a created topic is registered with the name servers before answering.
        client_admin: the requests answered by asking the group's consumers.
    """

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store_config: StoreConfig,
        store: MessageStore,
        identity: BrokerIdentity,
        role: ReplicationRole,
        stats: BrokerStats,
        topics: TopicConfigManager,
        groups: SubscriptionGroupManager,
        offsets: ConsumerOffsetManager,
        schedule: ScheduleMessageService,
        registration: NameServerRegistration,
        client_admin: ClientAdmin,
    ) -> None:
        self._config = config
        self._store_config = store_config
        self._store = store
        self._identity = identity
        self._role = role
        self._stats = stats
        self._topics = topics
        self._groups = groups
        self._offsets = offsets
        self._schedule = schedule
        self._registration = registration
        clients = client_admin
        self._handlers: dict[int, AdminHandler] = {
            RequestCode.UPDATE_AND_CREATE_TOPIC: self._update_and_create_topic,
            RequestCode.DELETE_TOPIC_IN_BROKER: self._delete_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self._get_all_topic_config,
            RequestCode.GET_BROKER_RUNTIME_INFO: self._get_broker_runtime_info,
            RequestCode.GET_TOPIC_STATS_INFO: self._get_topic_stats_info,
            RequestCode.GET_CONSUME_STATS: self._get_consume_stats,
            RequestCode.GET_BROKER_CONFIG: self._get_broker_config,
            RequestCode.GET_ALL_CONSUMER_OFFSET: self._get_all_consumer_offset,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self._get_all_subscription_group,
            RequestCode.GET_ALL_DELAY_OFFSET: self._get_all_delay_offset,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self._update_subscription_group,
            RequestCode.DELETE_SUBSCRIPTIONGROUP: self._delete_subscription_group,
            RequestCode.GET_CONSUMER_RUNNING_INFO: clients.get_consumer_running_info,
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: clients.reset_offset,
            RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS: clients.get_consumer_status,
        }

    @property
    def codes(self) -> list[int]:
        """The request codes this processor serves."""
        return list(self._handlers)

    def register(self, server: RemotingServer) -> None:
        """Make this processor the server's default (every code without its own handler)."""
        server.register_default(self.handle)

    async def handle(self, request: RemotingCommand, connection: Connection) -> RemotingCommand:
        """Answer one admin request; unknown codes get REQUEST_CODE_NOT_SUPPORTED."""
        handler = self._handlers.get(request.code)
        if handler is None:
            return RemotingCommand.response_to(
                request,
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                f" request type {request.code} not supported",
            )
        try:
            return await handler(request)
        except HeaderFieldError as exc:
            return _error(request, ResponseCode.SYSTEM_ERROR, str(exc))

    # -- topics ----------------------------------------------------------------------------

    async def _update_and_create_topic(self, request: RemotingCommand) -> RemotingCommand:
        header = CreateTopicRequestHeader.from_ext_fields(request.ext_fields)
        topic = header.topic
        problem = (
            topic_name_problem(topic)
            or self._system_topic_problem(topic, "created")
            or _queue_nums_problem("readQueueNums", header.read_queue_nums)
            or _queue_nums_problem("writeQueueNums", header.write_queue_nums)
        )
        if problem is None and not 0 <= header.perm <= 0xF:
            problem = f"perm {header.perm} is not a permission (6 = read+write, 4 = read only)"
        if problem is None and header.topic_filter_type not in TOPIC_FILTER_TYPES:
            problem = (
                f"topicFilterType {header.topic_filter_type!r} is not one of "
                f"{', '.join(TOPIC_FILTER_TYPES)}"
            )
        if problem is None and self._role.is_slave:
            problem = (
                f"broker {self._config.broker_name} at {self._identity.address} is a slave; "
                "create topics on its master"
            )
        if problem is not None:
            return _error(request, ResponseCode.SYSTEM_ERROR, f"cannot create topic: {problem}")
        topic_config = TopicConfig(
            topic_name=topic,
            read_queue_nums=header.read_queue_nums,
            write_queue_nums=header.write_queue_nums,
            perm=header.perm,
            topic_filter_type=header.topic_filter_type,
            topic_sys_flag=header.topic_sys_flag or 0,
            order=header.order,
        )
        try:
            self._topics.update(topic_config)
            await self._topics.saved()
        except StoreError as exc:
            return _not_saved(request, f"topic {topic}", exc)
        log.info("topic %s created or updated by an admin request: %s", topic, topic_config)
        if (topic_config.perm & PERM_WRITE
                and topic_config.write_queue_nums >= PREPARE_AT_CREATE_MIN_QUEUES):
            # A wide topic's queue files are made now, in the background, not at its first
            # send (store/queue_file_preparer.py): a producer then sends to every queue at
            # once and the event loop made each file the preparer had not reached yet, a
            # new inode (~1 ms on a busy ext4) per queue.
            self._store.prepare_queue_files(topic, topic_config.write_queue_nums)
        # Only this topic: the whole table would cost the square of the topic count over a
        # run of creates (namesrv_registration.py).
        await self._registration.register_topics([topic])
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    async def _delete_topic(self, request: RemotingCommand) -> RemotingCommand:
        header = DeleteTopicRequestHeader.from_ext_fields(request.ext_fields)
        topic = header.topic
        problem = topic_name_problem(topic) or self._system_topic_problem(topic, "deleted")
        if problem is not None:
            return _error(request, ResponseCode.SYSTEM_ERROR, f"cannot delete topic: {problem}")
        try:
            self._topics.delete(topic)
            await self._topics.saved()
        except StoreError as exc:
            return _not_saved(request, f"deleting topic {topic}", exc)
        # Removing a topic's queue files takes a while for a wide topic (1024 queues: 1.6 s
        # on a busy machine): a worker thread does it, so the event loop keeps serving. The
        # topic is gone from the table first, so no pull or send reaches its queues; the
        # store serializes this with appends under its own lock.
        await asyncio.to_thread(self._store.delete_topic, topic)
        self._offsets.remove_topic(topic)
        log.info("topic %s deleted from broker %s", topic, self._config.broker_name)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    async def _get_all_topic_config(self, request: RemotingCommand) -> RemotingCommand:
        body = self._topics.to_json()
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=body)

    async def _get_topic_stats_info(self, request: RemotingCommand) -> RemotingCommand:
        header = GetTopicStatsInfoRequestHeader.from_ext_fields(request.ext_fields)
        topic = header.topic
        topic_config = self._topics.get(topic)
        if topic_config is None:
            return _error(
                request,
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic {topic} does not exist on broker {self._config.broker_name}",
            )
        store = self._store
        offset_table: dict[Any, dict[str, int]] = {}
        for queue_id in range(topic_config.write_queue_nums):
            min_offset = max(store.min_offset(topic, queue_id), 0)
            max_offset = max(store.max_offset(topic, queue_id), 0)
            last_update = self._store_time_at(topic, queue_id, max_offset - 1)
            offset_table[self._message_queue(topic, queue_id)] = {
                "lastUpdateTimestamp": last_update,
                "maxOffset": max_offset,
                "minOffset": min_offset,
            }
        body = jsonx.dumps({"offsetTable": offset_table})
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=body)

    # -- consumption -----------------------------------------------------------------------

    async def _get_consume_stats(self, request: RemotingCommand) -> RemotingCommand:
        header = GetConsumeStatsRequestHeader.from_ext_fields(request.ext_fields)
        group = header.consumer_group
        offsets = self._offsets
        topics = [header.topic] if header.topic else sorted(offsets.topics_of_group(group))
        offset_table: dict[Any, dict[str, int]] = {}
        for topic in topics:
            topic_config = self._topics.get(topic)
            if topic_config is None:
                continue
            for queue_id in range(topic_config.write_queue_nums):
                broker_offset = max(self._store.max_offset(topic, queue_id), 0)
                consumer_offset = offsets.query_offset(group, topic, queue_id)
                if consumer_offset is None or consumer_offset < 0:
                    consumer_offset = 0
                offset_table[self._message_queue(topic, queue_id)] = {
                    "brokerOffset": broker_offset,
                    "consumerOffset": consumer_offset,
                    "lastTimestamp": self._store_time_at(topic, queue_id, consumer_offset - 1),
                }
        # consumeTps: tidemq does not count pulls per group yet; 0.0 says "unknown" to mqadmin.
        body = jsonx.dumps({"consumeTps": 0.0, "offsetTable": offset_table})
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=body)

    async def _get_all_consumer_offset(self, request: RemotingCommand) -> RemotingCommand:
        body = self._offsets.to_json()
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=body)

    async def _get_all_subscription_group(self, request: RemotingCommand) -> RemotingCommand:
        body = self._groups.to_json()
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=body)

    async def _get_all_delay_offset(self, request: RemotingCommand) -> RemotingCommand:
        body = self._schedule.delay_offset_json()
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=body)

    async def _update_subscription_group(self, request: RemotingCommand) -> RemotingCommand:
        try:
            document = jsonx.loads(request.body or b"")
            if not isinstance(document, dict):
                raise RemoteProtocolError("the body is not a JSON object")
            group_config = SubscriptionGroupConfig.from_json_object(document)
        except (RemoteProtocolError, KeyError, TypeError, ValueError) as exc:
            return _error(
                request,
                ResponseCode.SYSTEM_ERROR,
                f"UPDATE_AND_CREATE_SUBSCRIPTIONGROUP body is not a SubscriptionGroupConfig "
                f"JSON object with a groupName: {exc}",
            )
        try:
            self._groups.update_subscription_group_config(group_config)
            await self._groups.saved()
        except StoreError as exc:
            return _not_saved(request, f"subscription group {group_config.group_name}", exc)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    async def _delete_subscription_group(self, request: RemotingCommand) -> RemotingCommand:
        header = DeleteSubscriptionGroupRequestHeader.from_ext_fields(request.ext_fields)
        try:
            self._groups.delete_subscription_group_config(header.group_name)
            await self._groups.saved()
        except StoreError as exc:
            return _not_saved(request, f"deleting subscription group {header.group_name}", exc)
        if header.remove_offset:
            self._offsets.remove_group(header.group_name)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    # -- broker ----------------------------------------------------------------------------

    async def _get_broker_runtime_info(self, request: RemotingCommand) -> RemotingCommand:
        table = runtime_info(self._stats, self._store, self._store_config.store_path_root_dir)
        table.update(self._role.runtime_info())  # brokerRole and the HA keys (broker/ha/)
        body = jsonx.dumps({"table": table})
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=body)

    async def _get_broker_config(self, request: RemotingCommand) -> RemotingCommand:
        properties = config_properties(self._store_config, self._config)
        # The role and id now (a role switch changes both; role.py), not the config's.
        properties["brokerRole"] = self._role.role.value
        properties["brokerId"] = str(self._role.broker_id)
        text = properties_text(properties)
        version = jsonx.dumps({"counter": 0, "timestamp": self._stats.boot_timestamp_ms})
        return RemotingCommand.response_to(
            request,
            ResponseCode.SUCCESS,
            ext_fields={"version": version.decode()},
            body=text.encode("utf-8"),
        )

    # -- helpers ---------------------------------------------------------------------------

    def _system_topic_problem(self, topic: str, verb: str) -> str | None:
        if self._topics.is_system_topic(topic):
            return f"{topic} is a system topic the broker manages itself; it cannot be {verb}"
        return None

    def _message_queue(self, topic: str, queue_id: int) -> jsonx.JsonObjectKey:
        return jsonx.JsonObjectKey(
            {"brokerName": self._config.broker_name, "queueId": queue_id, "topic": topic}
        )

    def _store_time_at(self, topic: str, queue_id: int, offset: int) -> int:
        """Store time (ms) of the message at ``offset`` of a queue; 0 when there is none."""
        if offset < 0:
            return 0
        result = self._store.get_messages(topic, queue_id, offset, 1, _ONE_RECORD_BYTES_MAX)
        if result.status is not GetStatus.FOUND or len(result.body) < 64:
            return 0
        sysflag = _INT32.unpack_from(result.body, POSITION_SYSFLAG)[0]
        return _INT64.unpack_from(result.body, store_timestamp_position(sysflag))[0]


def _error(request: RemotingCommand, code: int, remark: str) -> RemotingCommand:
    return RemotingCommand.response_to(request, code, remark)


def _not_saved(request: RemotingCommand, what: str, exc: StoreError) -> RemotingCommand:
    """SYSTEM_ERROR for a change the config file could not hold (``exc`` names the file)."""
    return _error(
        request,
        ResponseCode.SYSTEM_ERROR,
        f"{what}: the change is in memory but not saved ({exc}); it is saved again with the "
        "next change or at shutdown, or repeat the request once the file can be written",
    )


def _queue_nums_problem(key: str, value: int) -> str | None:
    if not 1 <= value <= TOPIC_QUEUE_NUMS_MAX:
        return f"{key} is {value}; give a number from 1 to {TOPIC_QUEUE_NUMS_MAX}"
    return None
