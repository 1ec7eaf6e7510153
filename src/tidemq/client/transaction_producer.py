"""TransactionProducer: a message that is delivered only if the producer's local transaction
commits (RocketMQ's transactional messages, docs/protocol.md §4.9, §4.10).

Theory of operation. ``send_in_transaction(message, local_tx)`` does three steps:

1. ``send_half``: send the message with ``TRAN_MSG=true`` and this producer's group in
   ``PGROUP``. The broker stores it as a *half*, which no consumer sees, and answers as for
   any send. A half that was not stored with SEND_OK (e.g. FLUSH_DISK_TIMEOUT) is rolled
   back at once without running the local transaction, as the Java client does.
2. ``local_tx(message)``: the caller's own work (a database update, say). It returns
   ``TransactionState.COMMIT``, ``ROLLBACK`` or ``UNKNOWN`` (None means UNKNOWN). It may be a
   coroutine function.
3. ``end_transaction``: END_TRANSACTION to the broker that holds the half, oneway like the
   Java client. Commit makes the broker store the message in its topic for consumers;
   rollback drops it; unknown leaves it for the broker to ask about later.

When the broker has no answer for a half after transactionTimeOut (6 s), because the state
was UNKNOWN, the producer died, or the END_TRANSACTION was lost, it sends
CHECK_TRANSACTION_STATE to a live producer of the group, every transactionCheckInterval
(60 s), at most transactionCheckMax (15) times. The ``check(message)`` callback answers
with the transaction's state, and any producer of the group can answer for any half. So a
``check`` must decide from durable state, e.g. look the transaction id up in the database
the local transaction wrote to.

Transaction ids: each half carries one, ``send_half(..., transaction_id=...)`` when the
caller picks it (stored as the ``__transactionId__`` property), else the message's client
id (UNIQ_KEY). ``transaction_id_of(message)`` reads it in ``check``. The broker can find a
pending half by producer group and transaction id, which lets a coordinator in another
process commit it (``end_transaction`` takes a ``SendResult``, which pickles).

Exceptions from ``local_tx`` end the transaction as UNKNOWN, with the exception text as
the END_TRANSACTION remark, and are then raised to the caller; the half is decided by the
check. A failure to deliver END_TRANSACTION is logged, not raised: the check resolves it.

Checks arrive on the broker connection and are answered on it. A plain ``check`` function
runs on the event loop, so keep it short (the synchronous twin runs it in a worker thread).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tidemq.client.errors import BrokerRejected, NoRouteError
from tidemq.client.message import Message, MessageQueue, SendResult, SendStatus
from tidemq.client.producer import Producer
from tidemq.errors import ClientError, HeaderFieldError, ProtocolError
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import CheckTransactionStateRequestHeader, EndTransactionRequestHeader
from tidemq.protocol.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    MessageExt,
    decode_record,
)
from tidemq.protocol.msgid import decode_offset_msg_id
from tidemq.remoting.connection import Connection
from tidemq.remoting.errors import RemotingError

log = logging.getLogger("tidemq.client")

# An END_TRANSACTION remark carries the local transaction's exception; RocketMQ's broker only
# logs it, so a short text is enough.
REMARK_LENGTH_MAX = 512


class TransactionState(enum.Enum):
    """What a local transaction (or a check) decided; values are RocketMQ's names."""

    COMMIT = "COMMIT_MESSAGE"
    ROLLBACK = "ROLLBACK_MESSAGE"
    UNKNOWN = "UNKNOW"  # spelled as in RocketMQ's LocalTransactionState


_STATE_TYPES = {
    TransactionState.COMMIT: TRANSACTION_COMMIT_TYPE,
    TransactionState.ROLLBACK: TRANSACTION_ROLLBACK_TYPE,
    TransactionState.UNKNOWN: TRANSACTION_NOT_TYPE,
}

StateOrAwaitable = TransactionState | None | Awaitable[TransactionState | None]
LocalTransaction = Callable[[Message], StateOrAwaitable]
CheckListener = Callable[[MessageExt], StateOrAwaitable]


@dataclass(frozen=True, slots=True)
class TransactionSendResult(SendResult):
    """A SendResult of the half message, plus what the local transaction decided.

    ``transaction_id`` is the transaction's id (module docstring); ``local_state`` is the
    state sent to the broker.
    """

    local_state: TransactionState = TransactionState.UNKNOWN


def transaction_result(result: SendResult, state: TransactionState) -> TransactionSendResult:
    """``result`` as a TransactionSendResult with ``local_state`` = ``state``."""
    values = {item.name: getattr(result, item.name) for item in dataclasses.fields(SendResult)}
    return TransactionSendResult(**values, local_state=state)


def local_state(value: object) -> TransactionState:
    """A local transaction's or check's return value as a TransactionState (None = UNKNOWN).

    Raises:
        TypeError: the value is neither a TransactionState nor None.
    """
    if value is None:
        return TransactionState.UNKNOWN
    if isinstance(value, TransactionState):
        return value
    raise TypeError(
        f"a local transaction or check returned {value!r}; return TransactionState.COMMIT, "
        "ROLLBACK or UNKNOWN (or None for UNKNOWN)"
    )


def error_remark(error: BaseException | None) -> str | None:
    """The END_TRANSACTION remark for a local transaction that raised ``error``."""
    if error is None:
        return None
    text = f"{type(error).__name__}: {error}"
    return text[:REMARK_LENGTH_MAX]


def transaction_id_of(message: Message | MessageExt) -> str | None:
    """The transaction id of a message: ``__transactionId__``, else its UNIQ_KEY."""
    properties = message.properties
    return (
        properties.get(PROPERTY_TRANSACTION_ID)
        or properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    )


async def _settle(value: StateOrAwaitable) -> TransactionState:
    if inspect.isawaitable(value):
        value = await value
    return local_state(value)


class TransactionProducer(Producer):
    """A Producer that also sends transactional messages (use as ``async with``).

    Args:
        group: the producer group; the broker sends checks to any live producer of it.
        namesrv: name server addresses, as for Producer.
        check: ``check(message) -> TransactionState`` (or a coroutine function); answers
            the broker's CHECK_TRANSACTION_STATE. Without one, checks are logged and left
            unanswered (the broker asks again, then discards the half).
        check_topics: topics whose brokers should know this producer from ``start`` on, so
            checks of halves sent by an earlier run of the group reach it before it sends.
        **options: any Producer option (send_timeout_ms, heartbeat_broker_interval_ms, ...).

    Raises:
        ValueError: as Producer.
    """

    def __init__(
        self,
        group: str = "DEFAULT_PRODUCER",
        namesrv: str | Iterable[str] | None = None,
        *,
        check: CheckListener | None = None,
        check_topics: Iterable[str] = (),
        **options: Any,
    ):
        super().__init__(group, namesrv, **options)
        self.check = check
        self.check_topics = tuple(check_topics)
        self._instance.remoting.register(RequestCode.CHECK_TRANSACTION_STATE, self._on_check)

    async def start(self) -> None:
        """Start the producer and announce it to the brokers of ``check_topics``.

        Raises:
            ClientStateError: the producer was closed.
        """
        await super().start()
        for topic in self.check_topics:
            try:
                await self.queues(topic)  # learns the brokers; a heartbeat follows
            except (NoRouteError, ClientError, RemotingError) as exc:
                log.warning("transaction producer %s cannot find the brokers of topic %s "
                            "yet (%s); checks reach it once it has sent there", self.group,
                            topic, exc)

    # -- the three steps -------------------------------------------------------------------

    async def send_in_transaction(
        self,
        message: Message,
        local_tx: LocalTransaction,
        *,
        transaction_id: str | None = None,
        timeout_ms: int | None = None,
    ) -> TransactionSendResult:
        """Send ``message`` as a half, run ``local_tx(message)``, and end the transaction.

        Args:
            message: the message; its DELAY is dropped (transactional messages are not
                delayed), and it gets TRAN_MSG, PGROUP and a UNIQ_KEY.
            local_tx: the local transaction (module docstring).
            transaction_id: the id the broker and ``check`` know the transaction by;
                default the message's UNIQ_KEY.
            timeout_ms: budget of the half send, as Producer.send.

        Returns:
            The half's SendResult with ``local_state``.

        Raises:
            Whatever ``local_tx`` raised, after the broker was told UNKNOWN.
            InvalidMessage, MessageTooLarge, NoRouteError, BrokerRejected, RemotingError:
                the half was not sent (as Producer.send); local_tx did not run.
            TypeError: local_tx returned something else than a TransactionState or None.
        """
        result = await self.send_half(message, transaction_id=transaction_id,
                                      timeout_ms=timeout_ms)
        error: BaseException | None = None
        if result.status is not SendStatus.SEND_OK:
            state = TransactionState.ROLLBACK  # not safely stored: do not run the local work
        else:
            try:
                state = await _settle(local_tx(message))
            except Exception as exc:
                state, error = TransactionState.UNKNOWN, exc
        await self._end_quietly(result, state, error_remark(error), message)
        if error is not None:
            raise error
        return transaction_result(result, state)

    async def send_half(
        self,
        message: Message,
        *,
        transaction_id: str | None = None,
        timeout_ms: int | None = None,
    ) -> SendResult:
        """Step 1: send ``message`` as a half message; nobody sees it until it is committed.

        Returns:
            The SendResult, its ``transaction_id`` set. Keep it for ``end_transaction``.

        Raises:
            As Producer.send.
        """
        properties = message.properties
        properties.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        properties[PROPERTY_TRANSACTION_PREPARED] = "true"
        properties[PROPERTY_PRODUCER_GROUP] = self.group
        if transaction_id is not None:
            properties[PROPERTY_TRANSACTION_ID] = transaction_id
        result = await self.send(message, timeout_ms=timeout_ms)
        return dataclasses.replace(result, transaction_id=transaction_id or result.msg_id)

    async def end_transaction(
        self,
        result: SendResult,
        state: TransactionState,
        *,
        remark: str | None = None,
        wait: bool = False,
        message: Message | None = None,
    ) -> None:
        """Step 3: tell the broker holding the half of ``result`` to commit or roll it back.

        Args:
            result: the half's SendResult (from ``send_half``, possibly another process's).
            state: COMMIT, ROLLBACK, or UNKNOWN (leave it to the check).
            remark: text the broker logs with the end (e.g. an error).
            wait: False sends oneway, as RocketMQ clients do; True waits for the broker's
                answer and raises BrokerRejected when it refused (e.g. the half was already
                rolled back, or discarded after its checks).
            message: the half's message, only for its trace record's tags and keys (with
                ``enable_msg_trace``).

        Raises:
            RemotingError: the request could not be written (or, with ``wait``, answered).
            BrokerRejected: with ``wait``, the broker refused.
            NoRouteError: the broker of ``result`` is unknown to the name servers.
            InvalidMessageId: ``result.offset_msg_id`` is not an offset message id.
        """
        self._check_running()
        broker_name = result.queue.broker_name
        address = self._instance.master_address(broker_name)
        if address is None:
            address = await self._instance.find_master(broker_name, result.queue.topic)
        _, commit_log_offset = decode_offset_msg_id(result.offset_msg_id)
        header = EndTransactionRequestHeader(
            producer_group=self.group,
            tran_state_table_offset=result.queue_offset,
            commit_log_offset=commit_log_offset,
            commit_or_rollback=_STATE_TYPES[state],
            from_transaction_check=False,
            msg_id=result.msg_id,
            transaction_id=result.transaction_id or result.msg_id,
        )
        request = RemotingCommand.request(
            RequestCode.END_TRANSACTION, header.to_ext_fields(), oneway=not wait
        )
        request.remark = remark
        remoting = self._instance.remoting
        if not wait:
            await remoting.invoke_oneway(address, request, self.send_timeout_ms)
            self._trace_end(result, state, False, address, message)
            return
        response = await remoting.invoke(address, request, self.send_timeout_ms)
        self._trace_end(result, state, False, address, message)
        if response.code != ResponseCode.SUCCESS:
            raise BrokerRejected(
                f"end of transaction {header.transaction_id} ({state.name.lower()})",
                response.code, response.remark, f"{broker_name} ({address})", retriable=False,
            )

    def _trace_end(self, result: SendResult, state: TransactionState, from_check: bool,
                   address: str | None, message: Message | MessageExt | None) -> None:
        if self.tracer is not None:
            self.tracer.end_transaction(result, state.value, from_check=from_check,
                                        store_host=address, message=message)

    async def _end_quietly(
        self, result: SendResult, state: TransactionState, remark: str | None,
        message: Message | None = None,
    ) -> None:
        try:
            await self.end_transaction(result, state, remark=remark, message=message)
        except (ClientError, RemotingError, ProtocolError) as exc:
            log.warning(
                "transaction %s ended %s locally, but telling broker %s failed (%s); the "
                "broker's check will settle it", result.transaction_id, state.name,
                result.queue.broker_name, exc,
            )

    # -- checks from the broker ------------------------------------------------------------

    async def _on_check(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand | None:
        """CHECK_TRANSACTION_STATE: answer with END_TRANSACTION (oneway) on the same link."""
        try:
            header = CheckTransactionStateRequestHeader.from_ext_fields(request.ext_fields)
            message = decode_record(request.body or b"")
        except (HeaderFieldError, ProtocolError) as exc:
            log.warning("malformed transaction check from broker %s ignored: %s",
                        connection.remote_address, exc)
            return None
        group = message.properties.get(PROPERTY_PRODUCER_GROUP)
        if group is not None and group != self.group:
            log.warning("broker %s asked producer group %s about a transaction of group %s; "
                        "ignored", connection.remote_address, self.group, group)
            return None
        if self.check is None:
            log.warning("broker %s asks about transaction %s but producer %s has no check "
                        "callback; pass check= to TransactionProducer",
                        connection.remote_address, header.transaction_id, self.group)
            return None
        error: BaseException | None = None
        try:
            state = await _settle(self.check(message))
        except Exception as exc:
            state, error = TransactionState.UNKNOWN, exc
            log.exception("transaction check of %s raised; answering UNKNOWN",
                          header.transaction_id)
        answer = EndTransactionRequestHeader(
            producer_group=self.group,
            tran_state_table_offset=header.tran_state_table_offset,
            commit_log_offset=header.commit_log_offset,
            commit_or_rollback=_STATE_TYPES[state],
            from_transaction_check=True,
            msg_id=message.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
            or message.offset_msg_id,
            transaction_id=header.transaction_id,
        )
        end = RemotingCommand.request(
            RequestCode.END_TRANSACTION, answer.to_ext_fields(), oneway=True
        )
        end.remark = error_remark(error)
        try:
            await connection.send_oneway(end, self.send_timeout_ms)
        except (RemotingError, ProtocolError) as exc:
            log.warning("answer to the check of transaction %s could not be sent to %s: %s",
                        header.transaction_id, connection.remote_address, exc)
            return None
        if self.tracer is not None:
            self._trace_end(_checked_result(message, answer.msg_id, header.transaction_id),
                            state, True, connection.remote_address, message)
        return None


def _checked_result(message: MessageExt, msg_id: str, transaction_id: str | None
                    ) -> SendResult:
    """A SendResult-shaped view of a checked half, for its EndTransaction trace record."""
    topic = message.properties.get(PROPERTY_REAL_TOPIC) or message.topic
    return SendResult(
        status=SendStatus.SEND_OK, msg_id=msg_id, offset_msg_id=message.offset_msg_id,
        queue=MessageQueue(topic, message.broker_name, message.queue_id),
        queue_offset=message.queue_offset, transaction_id=transaction_id,
    )
