"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320).

Theory of operation
-------------------
A send is checked completely before the store is touched (docs/protocol.md §4.3), in this order,
each failure answered with RocketMQ's code and a remark naming the thing and the fix:

1. the header parses (a missing or unparsable field -> SYSTEM_ERROR naming the field);
2. the broker takes writes (a slave -> SERVICE_NOT_AVAILABLE; brokerPermission without write
   -> NO_PERMISSION);
3. body and properties fit (larger than maxMessageSize / 32767 bytes -> MESSAGE_ILLEGAL);
4. the topic name is valid and not a system topic the broker writes itself (SYSTEM_ERROR);
5. the topic exists, or is created from the ``defaultTopic`` template (TBW102) when
   autoCreateTopicEnable allows (§11.3), or as a retry topic; else TOPIC_NOT_EXIST;
6. the topic is writable here (NO_PERMISSION) and the queue id is in range (SYSTEM_ERROR;
   a negative queue id picks a random writable queue).

Then the message is shaped for storage (§6.2): WAIT is removed (and decides whether a
SYNC_FLUSH send waits for the disk), CLUSTER is added, a missing UNIQ_KEY is generated, the
MULTI_TAGS bit follows the topic's filter type, the born host is the producer's socket
address. A send to ``%RETRY%<group>`` past the group's max reconsume times goes to
``%DLQ%<group>``, undelayed, by the same rule as CONSUMER_SEND_MSG_BACK
(send_back_processor.py). Every single message passes through ``redirect_special_delivery``:
a delayed one (DELAY > 0) is stored in SCHEDULE_TOPIC_XXXX until due (schedule_service.py);
a transactional one (TRAN_MSG) is stored as a half until its producer ends it
(broker/transaction/). The response names the queue the producer chose, not the schedule or
half queue, as RocketMQ's does.

A batch body (§6.5) becomes one ``MessageBatch``: each entry gets the batch-level
properties (header ``i``) and CLUSTER appended; batches cannot be delayed or sent to a retry
topic (MESSAGE_ILLEGAL). The batches served in one loop iteration are appended together, at
its end (batch_appender.py; under SYNC_FLUSH a chunk at a time, so the disk syncs one chunk
while the loop appends the next), each answered with its own offsets and msg ids; a direct store
write for a send (a single message, a batch outside the column path) appends the queued
batches first, so the store sees the sends in the order they were served. A batch whose
batch-level properties say TRAN_MSG=true (a tidemq extension, sent by the exactly-once Spark
sink) is stored as half messages in one put by ``ExactlyOnceService.prepare_batch``
(broker/exactly_once/); the transactional sysflag without TRAN_MSG is refused.

Under SYNC_FLUSH the response waits for the store's durable future (group commit), at most
``syncFlushTimeout``; past it the answer is FLUSH_DISK_TIMEOUT (10), which clients count as
stored. Without a slave to wait for, such a send is answered by a ``LaterResponse``: the
response is written the moment the loop learns of the sync (``ReplicationRole.
answer_when_stored``, broker/ha/flush_waits.py), each send handler first answering the
syncs completed while the loop was busy (``settle_ready``), and the responses of one sync
leave in one write per connection. On a SYNC_MASTER it also waits for a slave's
acknowledgement (broker/ha/): past ``syncFlushTimeout`` FLUSH_SLAVE_TIMEOUT (12), and
SLAVE_NOT_AVAILABLE (11) at once when no slave is in sync; both are "stored" too
(``ReplicationRole.stored_status``). Everything runs on the event loop; the store call
itself is a quick mmap write.

Sends that arrive in one read (a producer with many in flight) are served by ``handle_group``:
each is checked and shaped as above, then the single messages go to the store together
(``put_message_group``: one append for all of them, each queue in arrival order) and each
gets the response ``handle`` would have given. A batch request among them is stored in its
place in the order. A group of plain single sends (tidemq's producer's, all alike: see
plain_sends.py) is read by columns instead, checked once, handed to the store in columns
(``put_send_columns``: the same records, no message or result object per send) and, when
none waits for the disk or a slave, answered with its responses encoded together from the
store's columns (``serve_group_now``, ``protocol.send_answers``); the general path serves
every other group.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from tidemq.broker.batch_appender import SYNC_CHUNK_MESSAGES, BatchAppender
from tidemq.broker.config import PERM_READ, PERM_WRITE
from tidemq.broker.exactly_once.records import EOS_COMMIT_DROPPED
from tidemq.broker.ha.flush_waits import settle_ready
from tidemq.broker.plain_sends import (
    PlainSends,
    plain_messages,
    read_plain_sends,
    read_send_run,
    send_columns,
)
from tidemq.broker.schedule_service import PROPERTY_DELAY_QUEUE_OFFSET, redirect_delayed
from tidemq.broker.send_back_processor import (
    DLQ_QUEUE_NUMS,
    dead_letter_due,
    dead_letter_topic_for,
    max_reconsume_times_of,
)
from tidemq.broker.topic_config_manager import (
    RETRY_GROUP_TOPIC_PREFIX,
    TopicConfig,
    is_not_allowed_send_topic,
)
from tidemq.errors import HeaderFieldError, RemoteProtocolError
from tidemq.limits import PROPERTIES_SIZE_MAX, topic_name_problem
from tidemq.protocol.codes import (
    FLAG_RESPONSE,
    TIDEMQ_VERSION,
    LanguageCode,
    RequestCode,
    ResponseCode,
)
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import SendMessageRequestHeader
from tidemq.protocol.message import (
    PROPERTY_CLUSTER,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_MSG_REGION,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRACE_SWITCH,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    PROPERTY_WAIT_STORE_MSG_OK,
    SYSFLAG_MULTI_TAGS,
    SYSFLAG_TRANSACTION_MASK,
    TRANSACTION_NOT_TYPE,
    BatchColumns,
    decode_batch_columns,
    decode_properties,
)
from tidemq.protocol.msgid import new_unique_key, new_unique_keys
from tidemq.protocol.send_answers import encode_offset_send_answers, encode_send_answers
from tidemq.protocol.send_run import SendRun
from tidemq.remoting.dispatch import EncodedAnswers, LaterResponse
from tidemq.store.batch_properties import merge_batch_properties
from tidemq.store.config import FlushDiskType
from tidemq.store.interface import (
    MessageBatch,
    PutResult,
    PutStatus,
    SendColumnsPut,
    StoreMessage,
    joined_msg_ids,
)

if TYPE_CHECKING:
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.exactly_once.service import ExactlyOnceService
    from tidemq.broker.identity import BrokerIdentity
    from tidemq.broker.pull_hold_service import PullRequestHoldService
    from tidemq.broker.role import ReplicationRole
    from tidemq.broker.runtime_info import BrokerStats
    from tidemq.broker.schedule_service import ScheduleMessageService
    from tidemq.broker.subscription_group_manager import SubscriptionGroupManager
    from tidemq.broker.topic_config_manager import TopicConfigManager
    from tidemq.broker.transaction.service import TransactionService
    from tidemq.remoting.connection import Connection
    from tidemq.remoting.server import RemotingServer
    from tidemq.store.config import StoreConfig
    from tidemq.store.interface import MessageStore

log = logging.getLogger("tidemq.broker")

MULTI_TAG = "MULTI_TAG"

# Topic names remembered as sendable (``SendMessageProcessor._check``), at most this many (the
# set starts over past it): far more topics than a broker serves at once, a few MB at most.
SENDABLE_TOPIC_NAMES_MAX = 10_000


_STATUS_CODES = {
    PutStatus.PUT_OK: ResponseCode.SUCCESS,
    PutStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    PutStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
    PutStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutStatus.UNKNOWN_ERROR: ResponseCode.SYSTEM_ERROR,
}
# Every one of these means "stored" (the client reports it as a SendStatus, not an error).
_STORED_CODES = frozenset({ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT,
                           ResponseCode.FLUSH_SLAVE_TIMEOUT, ResponseCode.SLAVE_NOT_AVAILABLE})
# Bound once: an Enum member looked up on its class costs ~0.1 us, on every send.
_PUT_OK = PutStatus.PUT_OK
_SUCCESS = int(ResponseCode.SUCCESS)
_PYTHON = LanguageCode.PYTHON
_SEND_BATCH_MESSAGE = int(RequestCode.SEND_BATCH_MESSAGE)
_PutArg = TypeVar("_PutArg")
_PutResult = TypeVar("_PutResult")
# A group's put results read by columns (``_serve_plain``).
_STATUS = attrgetter("status")
_DURABLE = attrgetter("durable")
_MSG_IDS = attrgetter("msg_ids")
_QUEUE_OFFSET = attrgetter("queue_offset")
_WROTE_BYTES = attrgetter("wrote_bytes")
_FIRST = itemgetter(0)
# ``redirect_special_delivery`` leaves a message without any of these properties as it is
# (not transactional, not delayed, no scheduler mark to drop): most sends skip its calls.
_SPECIAL_DELIVERY_KEYS = frozenset(
    {PROPERTY_TRANSACTION_PREPARED, PROPERTY_DELAY_TIME_LEVEL, PROPERTY_DELAY_QUEUE_OFFSET}
)


class _Stored(NamedTuple):
    result: PutResult
    wait: bool  # the producer asked to be answered only once the message is durable
    queue_id: int


class _QueuedBatch(NamedTuple):
    """A batch send checked and shaped, queued for the iteration's append."""

    result: asyncio.Future[PutResult]
    wait: bool
    queue_id: int


class _Single(NamedTuple):
    """A single send checked and shaped, waiting to be stored with the others of its read."""

    message: StoreMessage
    wait: bool
    queue_id: int  # the producer's queue, answered even when the message is delayed
    position: int  # of its request among those served together


class SendRefused(Exception):
    """A check failed: ``code`` and ``remark`` are the response to send."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


def redirect_special_delivery(
    message: StoreMessage, transactions: TransactionService, delay_level_count: int
) -> StoreMessage:
    """The hook where delayed and transactional messages are rerouted before storing.

    - DELAY level > 0 (not a half message): topic and queue saved in REAL_TOPIC / REAL_QID,
      stored in SCHEDULE_TOPIC_XXXX queue level - 1, the level capped at the configured
      level count (``schedule_service.redirect_delayed``); a DELAY_QUEUE_OFFSET property,
      which only the delay scheduler may write, is dropped from every message;
    - TRAN_MSG=true: stored as a transaction half in RMQ_SYS_TRANS_HALF_TOPIC queue 0, with
      REAL_TOPIC / REAL_QID saved and the transaction bits of the sysflag cleared
      (``TransactionService.prepare``); a half is never delayed (a DELAY applies to
      the message its commit stores).

    Raises:
        SendRefused: DELAY is not an integer (MESSAGE_ILLEGAL).
    """
    half = transactions.prepare(message)
    if half is not message:
        return half
    try:
        return redirect_delayed(message, delay_level_count)
    except ValueError as exc:
        raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None


class SendMessageProcessor:
    """Serves the three send codes for one broker.

    Args:
        config: brokerPermission, brokerName, brokerClusterName, regionId, traceOn,
            autoCreateTopicEnable.
        store_config: maxMessageSize, syncFlushTimeout.
        store: where messages are put.
        identity: the broker's address (remarks).
        role: a slave refuses sends.
        stats: put counters.
        topics: topics found or created on send.
        groups: a send to a retry topic reads its group's max reconsume times.
        schedule: the delay levels' count (delayed messages wait in SCHEDULE_TOPIC_XXXX).
        transactions: stores transactional sends as half messages.
        exactly_once: stores transactional batches (the exactly-once sink's) as halves.
        pull_holds: long polls woken by what a send stored are answered before the send.
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
        schedule: ScheduleMessageService,
        transactions: TransactionService,
        exactly_once: ExactlyOnceService,
        pull_holds: PullRequestHoldService | None = None,
    ) -> None:
        self._config = config
        self._store_config = store_config
        self._store = store
        self._identity = identity
        self._role = role
        self._stats = stats
        self._topics = topics
        self._groups = groups
        self._schedule = schedule
        self._transactions = transactions
        self._exactly_once = exactly_once
        self._pull_holds = pull_holds
        self._random = random.Random()
        # Topic names that passed the name rules and are no broker-only topic: both depend on
        # the name alone, and a lone send (every send at 2,000 msg/s) ran the regular
        # expression each time, cold.
        self._sendable_topic_names: set[str] = set()
        # SYNC_FLUSH: the disk syncs one chunk of an iteration's batches while the loop
        # appends the next (batch_appender.py).
        chunk = (SYNC_CHUNK_MESSAGES if store_config.flush_disk_type is FlushDiskType.SYNC_FLUSH
                 else None)
        self._batches = BatchAppender(store, stats, self._batch_refusal, self._wake_consumers,
                                      chunk)

    def register(self, server: RemotingServer) -> None:
        """Register the send handlers on ``server``."""
        for code in (
            RequestCode.SEND_MESSAGE,
            RequestCode.SEND_MESSAGE_V2,
            RequestCode.SEND_BATCH_MESSAGE,
        ):
            server.register(code, self.handle_now, group_handler=self.serve_group_now,
                            immediate=True)

    async def handle(self, request: RemotingCommand, connection: Connection
                     ) -> RemotingCommand | LaterResponse:
        """Answer one send request (single or batch). Never raises for bad input."""
        answer = self.handle_now(request, connection)
        if isinstance(answer, RemotingCommand | LaterResponse):
            return answer
        return await answer

    def handle_now(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand | LaterResponse | Awaitable[RemotingCommand | LaterResponse]:
        """A lone send request, served as it is read (the server's immediate handler): the
        response of ``handle``, or, when the send must wait for more than the store's put
        (a batch queued for the iteration's append, a SYNC_MASTER's slave), a
        ``LaterResponse`` or a coroutine of the response. A send alone costs no task: at
        low rates every send arrives alone, and a task per send (its creation, its step a
        loop callback later, its coroutines) was a good part of the send's broker time.
        Never raises for bad input."""
        settle_ready(connection.loop)  # answers of syncs done meanwhile go out first
        ext_fields = self._response_fields()
        try:
            header = SendMessageRequestHeader.from_ext_fields(request.ext_fields, request.code)
            is_batch = request.code == _SEND_BATCH_MESSAGE or header.batch
            if is_batch:
                outcome = self._put_batch(header, request, connection)
            else:
                outcome = self._put_single(header, request, connection)
        except HeaderFieldError as exc:
            return RemotingCommand.response_to(
                request, ResponseCode.SYSTEM_ERROR, str(exc), ext_fields
            )
        except SendRefused as refused:
            return RemotingCommand.response_to(request, refused.code, refused.remark, ext_fields)
        if isinstance(outcome, _QueuedBatch):
            return self._answer_appended(request, outcome, ext_fields, connection)
        if is_batch:
            self._wake_consumers()  # a batch stored directly (single sends woke in _put_single)
        return self._answer(request, outcome, ext_fields, connection)

    async def _answer_appended(self, request: RemotingCommand, queued: _QueuedBatch,
                               ext_fields: dict[str, str], connection: Connection
                               ) -> RemotingCommand | LaterResponse:
        """The answer to a batch send queued for the iteration's append, once appended."""
        answer = self._answer(request, await _appended(queued), ext_fields, connection)
        if isinstance(answer, RemotingCommand | LaterResponse):
            return answer
        return await answer

    def _answer(self, request: RemotingCommand, stored: _Stored, ext_fields: dict[str, str],
                connection: Connection
                ) -> RemotingCommand | LaterResponse | Awaitable[RemotingCommand]:
        """The response to a stored send: now when nothing is left to wait for, else a
        ``LaterResponse`` (the disk's sync alone, ``_answer_later``) or a coroutine."""
        result = stored.result
        status = self._role.stored_status_now(result) if stored.wait else result.status
        if status is not None:
            return self._response(request, stored, status, ext_fields)
        return (self._answer_later(request, stored, connection)
                or self._respond(request, stored, ext_fields))

    async def handle_group(
        self, requests: list[RemotingCommand], connection: Connection
    ) -> list[RemotingCommand | LaterResponse | None]:
        """Answer send requests that arrived together, in order: the responses ``handle``
        would give one by one, with the single messages stored in one append (module
        docstring). Never raises for bad input."""
        answered = self.handle_group_now(requests, connection)
        if isinstance(answered, list):
            return answered
        return await answered

    def serve_group_now(
        self, requests: list[RemotingCommand], connection: Connection
    ) -> (EncodedAnswers | list[RemotingCommand | LaterResponse | None]
          | Awaitable[list[RemotingCommand | LaterResponse | None]]):
        """The server's group handler: a group of plain single sends (plain_sends.py) read
        by columns and, when every one is stored and nothing is left to wait for, answered
        with their frames encoded together; any other group as ``handle_group_now``."""
        settle_ready(connection.loop)  # answers of syncs done meanwhile go out first
        # A read's run of sends comes as columns (protocol/send_run.py): its commands are
        # made only if the general path below, or an answer, reads them.
        sends = (read_send_run(requests) if type(requests) is SendRun
                 else read_plain_sends(requests))
        if sends is not None:
            answered = self._serve_plain(sends, requests, connection)
            if answered is not None:
                return answered
        return self.handle_group_now(requests, connection)

    def _serve_plain(
        self, sends: PlainSends, requests: list[RemotingCommand], connection: Connection
    ) -> EncodedAnswers | list[RemotingCommand | LaterResponse | None] | None:
        """Store and answer a group of plain single sends; None, with nothing done, when
        one of them would not pass every check (the general path then answers it)."""
        topic = sends.topic
        config = self._config
        topic_config = self._topics.get(topic)
        if (
            topic_config is None
            or topic not in self._sendable_topic_names  # the name's checks: passed before
            or topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
            or not self._role.accepts_writes
            or not config.broker_permission & PERM_WRITE
            or not topic_config.perm & PERM_WRITE
            or max(sends.queue_ids) >= max(topic_config.read_queue_nums,
                                           topic_config.write_queue_nums)
            or max(map(len, sends.bodies)) > self._store_config.max_message_size
            or max(map(len, sends.properties)) * 3 > PROPERTIES_SIZE_MAX
        ):
            return None
        multi_tags = topic_config.topic_filter_type == MULTI_TAG
        if len(requests) > 1:
            columns = send_columns(sends, config.broker_cluster_name, multi_tags,
                                   connection.remote_address)
            if columns is None:
                return None
            self._store.prepare_queue_files(topic, topic_config.write_queue_nums)
            put, started = self._put_after_batches(self._store.put_send_columns, columns)
            if put is not None:
                return self._answer_columns(sends, requests, put, started, connection)
            # The store did not take the columns (nothing was written): as messages.
        messages = plain_messages(sends, config.broker_cluster_name, multi_tags,
                                  connection.remote_address)
        if messages is None:
            return None
        self._store.prepare_queue_files(topic, topic_config.write_queue_nums)
        results, started = self._put_after_batches(self._store.put_message_group, messages)
        elapsed_s = time.monotonic() - started
        stats = self._stats
        stats.record_put_latency(elapsed_s)
        statuses = list(map(_STATUS, results))
        count = len(results)
        if statuses.count(_PUT_OK) == count:
            stats.record_put(count, sum(map(_WROTE_BYTES, results)), int(elapsed_s * 1000),
                             topic)
            # Answered now when none waits for the disk or a slave: the first stored (the
            # lowest offset) tells for all, since the role's test is the same for each.
            if (list(map(_DURABLE, results)).count(None) == count
                    and self._role.stored_status_now(results[0]) is _PUT_OK):
                frames = encode_send_answers(
                    sends.opaques, list(map(_FIRST, map(_MSG_IDS, results))), sends.queue_ids,
                    list(map(_QUEUE_OFFSET, results)), region=config.region_id,
                    trace_on=config.trace_on, version=TIDEMQ_VERSION)
                if frames is not None:
                    return EncodedAnswers(frames, _SUCCESS)
        else:
            for result in results:
                stats.record_put_result(result, 1, int(elapsed_s * 1000), topic)
        return self._stored_answers(requests, results, sends.queue_ids, connection)

    def _answer_columns(
        self, sends: PlainSends, requests: list[RemotingCommand], put: SendColumnsPut,
        started: float, connection: Connection,
    ) -> EncodedAnswers | list[RemotingCommand | LaterResponse | None]:
        """Count and answer a group of plain single sends the store took as columns: with
        their frames encoded together from the columns when none waits for the disk or a
        slave, else each as the general path answers it."""
        elapsed_s = time.monotonic() - started
        stats = self._stats
        stats.record_put_latency(elapsed_s)
        topic = sends.topic
        if put.status is _PUT_OK:
            stats.record_put(put.count, sum(put.sizes), int(elapsed_s * 1000), topic)
            # The first stored (the lowest offset) tells for all, as above.
            if put.durable is None and self._role.stored_now(put.physical_offsets[0]):
                config = self._config
                frames = encode_offset_send_answers(
                    sends.opaques, put.msg_id_host, put.physical_offsets, sends.queue_ids,
                    put.queue_offsets, region=config.region_id, trace_on=config.trace_on,
                    version=TIDEMQ_VERSION)
                if frames is not None:
                    return EncodedAnswers(frames, _SUCCESS)
        results = put.put_results()
        if put.status is not _PUT_OK:
            for result in results:
                stats.record_put_result(result, 1, int(elapsed_s * 1000), topic)
        return self._stored_answers(requests, results, sends.queue_ids, connection)

    def _stored_answers(
        self, requests: list[RemotingCommand], results: list[PutResult], queue_ids: list[int],
        connection: Connection,
    ) -> EncodedAnswers | list[RemotingCommand | LaterResponse | None]:
        # Each stored (or refused) plain send answered as the general path answers it.
        outcomes: list[_Stored | _QueuedBatch | RemotingCommand | LaterResponse | None] = [
            _Stored(result, True, queue_id)
            for result, queue_id in zip(results, queue_ids, strict=True)
        ]
        return self._group_answers(requests, outcomes, connection)  # type: ignore[return-value]

    def handle_group_now(
        self, requests: list[RemotingCommand], connection: Connection
    ) -> (list[RemotingCommand | LaterResponse | None]
          | Awaitable[list[RemotingCommand | LaterResponse | None]]):
        """``handle_group`` served as the requests are read (the server's immediate group
        handler): the responses, or a coroutine of them when one of the sends must wait for
        more than the store's put (a batch queued for the iteration's append, a
        SYNC_MASTER's slave). No task for a read of single sends (module docstring)."""
        settle_ready(connection.loop)  # answers of syncs done meanwhile go out first
        outcomes: list[_Stored | _QueuedBatch | RemotingCommand | LaterResponse | None] = []
        singles: list[_Single] = []
        # Topics that passed the broker- and topic-wide checks for an earlier send of this
        # group; nothing else runs on the loop until the group is stored.
        checked_topics: dict[str, TopicConfig] = {}
        for request in requests:
            try:
                header = SendMessageRequestHeader.from_ext_fields(request.ext_fields, request.code)
                if request.code == _SEND_BATCH_MESSAGE or header.batch:
                    self._put_singles(singles, outcomes)  # the batch keeps its place in order
                    checked_topics.clear()
                    outcomes.append(self._put_batch(header, request, connection))
                else:
                    singles.append(self._prepare_single(header, request, connection,
                                                        len(outcomes), checked_topics))
                    outcomes.append(None)
            except HeaderFieldError as exc:
                outcomes.append(RemotingCommand.response_to(
                    request, ResponseCode.SYSTEM_ERROR, str(exc), self._response_fields()
                ))
            except SendRefused as refused:
                outcomes.append(RemotingCommand.response_to(
                    request, refused.code, refused.remark, self._response_fields()
                ))
        self._put_singles(singles, outcomes)
        self._wake_consumers()
        return self._group_answers(requests, outcomes, connection)

    def _group_answers(
        self, requests: list[RemotingCommand],
        outcomes: list[_Stored | _QueuedBatch | RemotingCommand | LaterResponse | None],
        connection: Connection,
    ) -> (list[RemotingCommand | LaterResponse | None]
          | Awaitable[list[RemotingCommand | LaterResponse | None]]):
        """The responses to a group whose sends are stored or queued (``outcomes``), in
        order: now, or a coroutine of them when one must wait."""
        for outcome in outcomes:
            if isinstance(outcome, _QueuedBatch):
                # Before any send is answered: an answer may register a wait for the disk's
                # sync or start a coroutine, which must happen once per send.
                return self._group_answers_appended(requests, outcomes, connection)
        responses: list[RemotingCommand | LaterResponse | Awaitable[RemotingCommand] | None] = []
        waits = False
        for request, outcome in zip(requests, outcomes, strict=True):
            if isinstance(outcome, _Stored):
                outcome = self._answer(request, outcome, self._response_fields(), connection)
                waits = waits or not isinstance(outcome, RemotingCommand | LaterResponse)
            responses.append(outcome)
        if waits:
            return _all_answered(responses)
        return responses  # type: ignore[return-value]  # nothing left to wait for

    async def _group_answers_appended(
        self, requests: list[RemotingCommand],
        outcomes: list[_Stored | _QueuedBatch | RemotingCommand | LaterResponse | None],
        connection: Connection,
    ) -> list[RemotingCommand | LaterResponse | None]:
        """The responses of a group with a batch queued for the iteration's append, once
        appended, in order."""
        responses: list[RemotingCommand | LaterResponse | None] = []
        for request, outcome in zip(requests, outcomes, strict=True):
            if isinstance(outcome, _QueuedBatch):
                outcome = await _appended(outcome)
            if isinstance(outcome, _Stored):
                answer = self._answer(request, outcome, self._response_fields(), connection)
                outcome = (answer if isinstance(answer, RemotingCommand | LaterResponse)
                           else await answer)
            responses.append(outcome)
        return responses

    def _answer_later(self, request: RemotingCommand, stored: _Stored, connection: Connection
                      ) -> LaterResponse | None:
        """The response to a stored send whose only wait is the disk's sync, written when
        the sync is known (module docstring); None when it has another wait."""
        later = LaterResponse()

        def answer(status: PutStatus) -> Connection:
            later.resolve(self._response(request, stored, status, self._response_fields()))
            return connection

        return later if self._role.answer_when_stored(stored.result, answer,
                                                      connection.loop) else None

    def _wake_consumers(self) -> None:
        # The long polls waiting for what was just stored are answered before the sends
        # (pull_hold_service.py): the consumer's wake-up is on a message's end-to-end path,
        # the producer's acknowledgement is not.
        if self._pull_holds is not None:
            self._pull_holds.wake_now()

    def check_send(self, header: SendMessageRequestHeader, body_length: int,
                   connection: Connection) -> TopicConfig:
        """The checks a send passes before it is stored (module docstring, 2 to 6), for a
        request that is sent on before it is stored (a reply).

        Raises:
            SendRefused: a check failed (its code and remark are the answer).
        """
        return self._check(header, body_length, connection)

    def _response_fields(self) -> dict[str, str]:
        config = self._config
        return {
            PROPERTY_MSG_REGION: config.region_id,
            PROPERTY_TRACE_SWITCH: "true" if config.trace_on else "false",
        }

    # -- checks ----------------------------------------------------------------------------

    def _check(
        self, header: SendMessageRequestHeader, body_length: int, connection: Connection,
        checked_topics: dict[str, TopicConfig] | None = None,
    ) -> TopicConfig:
        """Run checks 2-6 of the module docstring; return the topic's config.

        ``checked_topics`` holds the topics that passed the broker- and topic-wide checks
        (2, 4, 5, the topic's perm) since the broker's state last could change: a send to one
        of them runs only its own checks (sizes, queue id), in the same order, so the first
        one that fails is the one the whole sequence would name. Passed topics are added.
        """
        topic = header.topic
        if checked_topics is not None:
            topic_config = checked_topics.get(topic)
            if topic_config is not None:
                self._check_sizes(header, body_length)
                self._check_queue_id(header, topic_config, connection)
                return topic_config
        config = self._config
        role = self._role
        if not role.accepts_writes:  # (the remark's text made only for a refusal)
            raise SendRefused(ResponseCode.SERVICE_NOT_AVAILABLE,
                              role.write_refusal(f"sends (topic {topic})") or "")
        if not config.broker_permission & PERM_WRITE:
            raise SendRefused(
                ResponseCode.NO_PERMISSION,
                f"broker {config.broker_name} at {self._identity.address} is not writable "
                f"(brokerPermission={config.broker_permission}); sending to topic {topic} is "
                "forbidden until write permission is given back (brokerPermission=6)",
            )
        self._check_sizes(header, body_length)
        if topic not in self._sendable_topic_names:  # the name's checks: of the name alone
            problem = topic_name_problem(topic)
            if problem is not None:
                raise SendRefused(ResponseCode.SYSTEM_ERROR, f"cannot send: {problem}")
            if is_not_allowed_send_topic(topic):
                raise SendRefused(
                    ResponseCode.SYSTEM_ERROR,
                    f"sending to topic {topic} is forbidden: it is a system topic only the "
                    "broker writes; choose another topic",
                )
            if len(self._sendable_topic_names) >= SENDABLE_TOPIC_NAMES_MAX:
                self._sendable_topic_names.clear()
            self._sendable_topic_names.add(topic)
        topic_config = self._find_or_create_topic(header, connection)
        if not topic_config.perm & PERM_WRITE:
            raise SendRefused(
                ResponseCode.NO_PERMISSION,
                f"topic {topic} is not writable on broker {config.broker_name} "
                f"(perm={topic_config.perm}); change it with tidemq admin updateTopic -p 6",
            )
        self._check_queue_id(header, topic_config, connection)
        # A written topic's other queues get their files made in the background, so their
        # first messages do not create files here (store/queue_file_preparer.py).
        self._store.prepare_queue_files(topic, topic_config.write_queue_nums)
        if checked_topics is not None:
            checked_topics[topic] = topic_config
        return topic_config

    def _check_sizes(self, header: SendMessageRequestHeader, body_length: int) -> None:
        """Check 3: body and properties fit."""
        size_max = self._store_config.max_message_size
        if body_length > size_max:
            raise SendRefused(
                ResponseCode.MESSAGE_ILLEGAL,
                f"message body of topic {header.topic} is {body_length} bytes, larger than "
                f"maxMessageSize={size_max}; send smaller messages or raise maxMessageSize",
            )
        properties = header.properties
        if properties is not None and len(properties) * 3 > PROPERTIES_SIZE_MAX:
            properties_length = len(properties.encode("utf-8", "surrogatepass"))
            if properties_length > PROPERTIES_SIZE_MAX:
                raise SendRefused(
                    ResponseCode.MESSAGE_ILLEGAL,
                    f"message properties of topic {header.topic} are {properties_length} "
                    f"bytes, more than the limit of {PROPERTIES_SIZE_MAX}; use fewer or "
                    "shorter properties",
                )

    def _check_queue_id(self, header: SendMessageRequestHeader, topic_config: TopicConfig,
                        connection: Connection) -> None:
        """The queue-id part of check 6."""
        queue_limit = max(topic_config.read_queue_nums, topic_config.write_queue_nums)
        if header.queue_id >= queue_limit:
            raise SendRefused(
                ResponseCode.SYSTEM_ERROR,
                f"queueId {header.queue_id} is out of range for topic {header.topic} on broker "
                f"{self._config.broker_name}, which has {topic_config.write_queue_nums} write "
                f"queues and {topic_config.read_queue_nums} read queues (producer "
                f"{connection.remote_address}); refresh the topic route",
            )

    def _find_or_create_topic(
        self, header: SendMessageRequestHeader, connection: Connection
    ) -> TopicConfig:
        manager = self._topics
        topic = header.topic
        topic_config = manager.get(topic)
        if topic_config is not None:
            return topic_config
        topic_sys_flag = 0
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return manager.create_topic_for_send_back(topic, 1, PERM_READ | PERM_WRITE)
        topic_config = manager.create_topic_in_send_process(
            topic,
            header.default_topic,
            header.default_topic_queue_nums,
            topic_sys_flag,
            producer_address=connection.remote_address,
        )
        if topic_config is not None:
            return topic_config
        config = self._config
        if not config.auto_create_topic_enable:
            how = "or set autoCreateTopicEnable=true on the broker"
        else:
            how = (
                f"or send with defaultTopic TBW102 (this send named template "
                f"{header.default_topic!r}, which is missing or not inheritable)"
            )
        raise SendRefused(
            ResponseCode.TOPIC_NOT_EXIST,
            f"topic {topic} does not exist on broker {config.broker_name}; create it with "
            f"tidemq admin updateTopic -t {topic} -c {config.broker_cluster_name} {how}",
        )

    def _queue_id(self, header: SendMessageRequestHeader, topic_config: TopicConfig) -> int:
        if header.queue_id < 0:
            return self._random.randrange(max(topic_config.write_queue_nums, 1))
        return header.queue_id

    # -- single ----------------------------------------------------------------------------

    def _batch_refusal(self) -> str | None:
        # Checked again when the queued batches are appended: the role may have switched
        # since their requests were checked.
        return self._role.write_refusal("sends")

    def _put_after_batches(self, put: Callable[[_PutArg], _PutResult], argument: _PutArg
                           ) -> tuple[_PutResult, float]:
        """``put(argument)`` once the batches served before it are appended (order on the
        log is arrival order), with held pulls told first and the consumers woken after it
        whatever happens; its result and the monotonic time the put started."""
        self._batches.flush()
        holds = self._pull_holds
        if holds is not None:
            holds.wake_after_put()
        started = time.monotonic()
        try:
            return put(argument), started
        finally:
            self._wake_consumers()

    def _put_single(
        self, header: SendMessageRequestHeader, request: RemotingCommand, connection: Connection
    ) -> _Stored:
        single = self._prepare_single(header, request, connection, 0)
        result, started = self._put_after_batches(self._store.put_message, single.message)
        self._count(result, started, header.topic)
        return _Stored(result, single.wait, single.queue_id)

    def _put_singles(
        self, singles: list[_Single], outcomes: list[_Stored | RemotingCommand | None]
    ) -> None:
        """Store the prepared single messages in one group; fill in their outcomes."""
        if not singles:
            return
        results, started = self._put_after_batches(
            self._store.put_message_group, [single.message for single in singles])
        elapsed_s = time.monotonic() - started
        elapsed_ms = int(elapsed_s * 1000)
        stats = self._stats
        stats.record_put_latency(elapsed_s)
        for single, result in zip(singles, results, strict=True):
            stats.record_put_result(result, 1, elapsed_ms, single.message.topic)
            outcomes[single.position] = _Stored(result, single.wait, single.queue_id)
        singles.clear()

    def _prepare_single(
        self,
        header: SendMessageRequestHeader,
        request: RemotingCommand,
        connection: Connection,
        position: int,
        checked_topics: dict[str, TopicConfig] | None = None,
    ) -> _Single:
        """Check one single send and shape its message for storing (module docstring).

        Raises:
            SendRefused: a check failed.
        """
        body = request.body or b""
        topic_config = self._check(header, len(body), connection, checked_topics)
        properties = decode_properties(header.properties) if header.properties else {}
        wait = _wait_store_msg_ok(properties.pop(PROPERTY_WAIT_STORE_MSG_OK, None))
        if not properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX):
            properties[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = new_unique_key()
        properties[PROPERTY_CLUSTER] = self._config.broker_cluster_name
        topic = header.topic
        queue_id = self._queue_id(header, topic_config)
        reconsume_times = header.reconsume_times or 0
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            topic, queue_id = self._retry_or_dead_letter(
                header, request, reconsume_times, queue_id, properties
            )
        sysflag = header.sys_flag
        if topic_config.topic_filter_type == MULTI_TAG:
            sysflag |= SYSFLAG_MULTI_TAGS
        # Positional: matching nine keywords cost ~0.4 us of the ~0.65 the dataclass takes.
        message = StoreMessage(topic, queue_id, body, properties, header.flag, sysflag,
                               header.born_timestamp, connection.remote_address,
                               reconsume_times)
        if not _SPECIAL_DELIVERY_KEYS.isdisjoint(properties):
            message = redirect_special_delivery(
                message, self._transactions, self._schedule.level_count
            )
        # The response names the producer's queue, even when the message is delayed.
        return _Single(message, wait, queue_id, position)

    def _retry_or_dead_letter(
        self,
        header: SendMessageRequestHeader,
        request: RemotingCommand,
        reconsume_times: int,
        queue_id: int,
        properties: dict[str, str],
    ) -> tuple[str, int]:
        """Where a send to ``%RETRY%<group>`` goes: the retry topic, or the group's DLQ.

        ``reconsume_times`` is the new copy's (a Java consumer that could not send a message
        back re-sends it with its reconsume times + 1); the rule is the send-back's. A dead
        letter loses its DELAY (removed from ``properties``)."""
        group = header.topic[len(RETRY_GROUP_TOPIC_PREFIX) :]
        group_config = self._groups.find_subscription_group_config(group)
        if group_config is None:
            raise SendRefused(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group {group} does not exist on broker "
                f"{self._config.broker_name}; create it with tidemq admin updateSubGroup "
                "or set autoCreateSubscriptionGroup=true",
            )
        max_reconsume_times = max_reconsume_times_of(
            group_config, header.max_reconsume_times, request.version, properties
        )
        if not dead_letter_due(reconsume_times, max_reconsume_times):
            return header.topic, queue_id
        dead_letter_topic = dead_letter_topic_for(self._topics, group)
        properties.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        log.debug(
            "message of group %s reconsumed %d times (max %d): stored in %s",
            group,
            reconsume_times,
            max_reconsume_times,
            dead_letter_topic,
        )
        return dead_letter_topic, self._random.randrange(DLQ_QUEUE_NUMS)

    # -- batch -----------------------------------------------------------------------------

    def _put_batch(
        self, header: SendMessageRequestHeader, request: RemotingCommand, connection: Connection
    ) -> _Stored | _QueuedBatch:
        """Check and shape a batch send; queue it for the iteration's append (the column
        path), or store it now (a prepared batch, or entries that need dicts).

        Raises:
            SendRefused: a check failed.
        """
        body = request.body or b""
        topic = header.topic
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            raise SendRefused(
                ResponseCode.MESSAGE_ILLEGAL,
                f"batch sends to retry topic {topic} are not supported; send them one by one",
            )
        batch_properties = decode_properties(header.properties) if header.properties else {}
        # A transactional batch (the exactly-once Spark sink's) is stored as half messages in
        # one put by the transaction service (broker/exactly_once/service.py).
        prepared = header.sys_flag & SYSFLAG_TRANSACTION_MASK != TRANSACTION_NOT_TYPE or _is_true(
            batch_properties.get(PROPERTY_TRANSACTION_PREPARED)
        )
        topic_config = self._check(header, len(body), connection)
        try:
            columns = decode_batch_columns(body)
        except RemoteProtocolError as exc:
            raise SendRefused(
                ResponseCode.MESSAGE_ILLEGAL, f"batch body for topic {topic} is malformed: {exc}"
            ) from None
        if not columns.bodies:
            raise SendRefused(
                ResponseCode.MESSAGE_ILLEGAL, f"batch for topic {topic} holds no messages"
            )
        wait = _wait_store_msg_ok(batch_properties.pop(PROPERTY_WAIT_STORE_MSG_OK, None))
        batch_properties[PROPERTY_CLUSTER] = self._config.broker_cluster_name
        queue_id = self._queue_id(header, topic_config)
        sysflag = header.sys_flag
        if topic_config.topic_filter_type == MULTI_TAG:
            sysflag |= SYSFLAG_MULTI_TAGS
        born_host = connection.remote_address
        born_timestamp = header.born_timestamp
        reconsume_times = header.reconsume_times or 0
        exactly_once = self._exactly_once
        if prepared:
            # Each half keeps its real destination (records.py); set with the batch's
            # properties, it has the same place in the stored text on both paths below.
            batch_properties[PROPERTY_REAL_TOPIC] = topic
            batch_properties[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
        # The hottest path: the entries' properties merged with the batch's column by column
        # (store/batch_properties.py), else with a dict per message; the same stored bytes.
        # A prepared batch also gets its committed copies' properties (exactly_once.py).
        merged = merge_batch_properties(
            columns.properties, batch_properties, new_unique_keys,
            EOS_COMMIT_DROPPED if prepared else (),
        ) if not prepared or exactly_once.takes_columns(batch_properties) else None
        if merged is None:
            messages = _batch_messages(
                topic, queue_id, columns, batch_properties, sysflag, born_timestamp, born_host,
                reconsume_times,
            )
        if merged is not None:
            batch = MessageBatch(
                topic, queue_id, columns.bodies, merged.properties, columns.flags, merged.tags,
                merged.keys, sysflag, born_timestamp, born_host, reconsume_times,
            )
            if not prepared:
                return _QueuedBatch(self._batches.put(batch, connection.loop), wait, queue_id)
        self._batches.flush()  # the batches served before it first
        started = time.monotonic()
        if merged is None:
            result = (exactly_once.prepare_batch(messages) if prepared
                      else self._store.put_messages(messages))
        else:
            result = exactly_once.prepare_columns(batch, batch_properties,
                                                  merged.without_dropped)
        self._count(result, started, topic)
        return _Stored(result, wait, queue_id)

    # -- response --------------------------------------------------------------------------

    def _count(self, result: PutResult, started: float, topic: str) -> None:
        stats = self._stats
        elapsed_s = time.monotonic() - started
        stats.record_put_latency(elapsed_s)
        stats.record_put_result(result, result.message_count, int(elapsed_s * 1000), topic)

    async def _respond(
        self, request: RemotingCommand, stored: _Stored, ext_fields: dict[str, str]
    ) -> RemotingCommand:
        result = stored.result
        status = result.status
        if status is PutStatus.PUT_OK and stored.wait:
            status = await self._role.stored_status(result, True)
        return self._response(request, stored, status, ext_fields)

    def _response(
        self, request: RemotingCommand, stored: _Stored, status: PutStatus,
        ext_fields: dict[str, str],
    ) -> RemotingCommand:
        """The answer to a send whose put ended with ``status`` (waits included)."""
        result = stored.result
        # Nearly every answer: SUCCESS without a remark, found without the status table (an
        # Enum member's hash is a Python call) and a single send's one id without
        # joined_msg_ids' Sequence check (an ABC's isinstance, another Python call).
        if status is _PUT_OK:
            msg_ids = result.msg_ids
            ext_fields["msgId"] = (msg_ids[0] if type(msg_ids) is list and len(msg_ids) == 1
                                   else joined_msg_ids(msg_ids))
            ext_fields["queueId"] = str(stored.queue_id)
            ext_fields["queueOffset"] = str(result.queue_offset)
            return RemotingCommand(_SUCCESS, request.opaque, FLAG_RESPONSE, None, ext_fields,
                                   None, _PYTHON, TIDEMQ_VERSION, request.serialize_type)
        code = _STATUS_CODES.get(status, ResponseCode.SYSTEM_ERROR)
        if code not in _STORED_CODES:
            if result.status is _PUT_OK:  # stored, then the role switched (role.py)
                remark = self._role.switched_remark()
            else:
                remark = result.remark or f"the store refused the message: {status.value}"
            return RemotingCommand.response_to(request, code, remark, ext_fields)
        ext_fields["msgId"] = joined_msg_ids(result.msg_ids)
        ext_fields["queueId"] = str(stored.queue_id)
        ext_fields["queueOffset"] = str(result.queue_offset)
        remark = None
        timeout_ms = self._store_config.sync_flush_timeout_ms
        if code == ResponseCode.FLUSH_DISK_TIMEOUT:
            remark = (
                f"message stored but not flushed to disk within syncFlushTimeout={timeout_ms} ms"
            )
        elif code == ResponseCode.FLUSH_SLAVE_TIMEOUT:
            remark = (
                "message stored on the master but no slave acknowledged it within "
                f"syncFlushTimeout={timeout_ms} ms"
            )
        elif code == ResponseCode.SLAVE_NOT_AVAILABLE:
            remark = (
                "message stored on the master only: no slave is in sync (none connected, or "
                "each further behind than haMaxGapNotInSync)"
            )
        # RemotingCommand.response_to, without its copy of ``ext_fields`` (this response's own
        # dict, from _response_fields); the code a plain int, as the header fast path takes.
        return RemotingCommand(int(code), request.opaque, FLAG_RESPONSE, remark, ext_fields,
                               None, _PYTHON, TIDEMQ_VERSION, request.serialize_type)


async def _all_answered(
    responses: list[RemotingCommand | LaterResponse | Awaitable[RemotingCommand] | None],
) -> list[RemotingCommand | LaterResponse | None]:
    """``responses`` with each awaitable among them awaited, in order."""
    return [response if response is None or isinstance(response, RemotingCommand | LaterResponse)
            else await response for response in responses]


async def _appended(outcome: _Stored | _QueuedBatch) -> _Stored:
    """The stored outcome of a batch send, once a queued one is appended."""
    if isinstance(outcome, _Stored):
        return outcome
    return _Stored(await outcome.result, outcome.wait, outcome.queue_id)


def _batch_messages(
    topic: str,
    queue_id: int,
    columns: BatchColumns,
    batch_properties: dict[str, str],
    sysflag: int,
    born_timestamp: int,
    born_host: str,
    reconsume_times: int,
) -> list[StoreMessage]:
    """A batch's messages with a dict of properties each: the entry's less WAIT, updated
    with the batch's, a UNIQ_KEY added when missing (the general path of ``_put_batch``).

    Raises:
        SendRefused: an entry has a delay level.
    """
    messages: list[StoreMessage] = []
    append = messages.append
    wait_key = PROPERTY_WAIT_STORE_MSG_OK
    delay_key = PROPERTY_DELAY_TIME_LEVEL
    unique_key = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
    for body, raw, flag in zip(columns.bodies, columns.properties, columns.flags, strict=True):
        if raw:
            properties = decode_properties(str(raw, "utf-8", "replace"))
            properties.pop(wait_key, None)
            if delay_key in properties:
                _refuse_delayed_batch(topic, properties[delay_key])
            properties.update(batch_properties)
        else:
            properties = dict(batch_properties)
        if unique_key not in properties:
            properties[unique_key] = new_unique_key()
        append(StoreMessage(
            topic, queue_id, body, properties, flag, sysflag, born_timestamp, born_host,
            reconsume_times,
        ))
    return messages


def _refuse_delayed_batch(topic: str, delay: str) -> None:
    if delay.strip() not in ("", "0"):
        raise SendRefused(
            ResponseCode.MESSAGE_ILLEGAL,
            f"a message of the batch to topic {topic} has delay level {delay}; delayed "
            "messages cannot be batched, send them one by one",
        )


def _wait_store_msg_ok(value: str | None) -> bool:
    """Java's isWaitStoreMsgOK: absent means wait; otherwise Boolean.parseBoolean."""
    return value is None or value.strip().lower() == "true"


def _is_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() == "true"
