"""What a traced client records: Pub after a send, SubBefore/SubAfter around a listener
call, EndTransaction when a transaction ends (RocketMQ's trace hooks, in trace_data's
format), handed to a ``TraceDispatcher`` that writes them in the background.

Recording is cheap and cannot fail a send or a consume call: records of a batch are encoded
in one pass, and every hook catches its own errors (a bug in tracing is logged once, the
send goes on).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Sequence
from typing import Any

from tidemq.client.listener import ConsumeResult, ListenerInvoker
from tidemq.client.message import Message, SendResult, SendStatus
from tidemq.client.trace_data import (
    CONTENT_SEPARATOR,
    FIELD_SEPARATOR,
    REGION_DEFAULT,
    ConsumeReturnType,
    MessageType,
    TraceRecord,
    TraceType,
    encode_record,
    trace_keys,
)
from tidemq.client.trace_dispatcher import TraceDispatcher, TracePiece
from tidemq.protocol.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_MSG_REGION,
    PROPERTY_TAGS,
    PROPERTY_TRACE_SWITCH,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    MessageExt,
)
from tidemq.protocol.msgid import new_unique_key

log = logging.getLogger("tidemq.client.trace")

# Records per piece: a piece's keys (msg ids, ~33 bytes each, and the messages' own keys)
# must fit one trace message's KEYS (trace_dispatcher.TRACE_KEYS_BYTES_MAX).
TRACE_PIECE_RECORDS_MAX = 128


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _text(value: str | None) -> str:
    return value if value else "null"


class Tracer:
    """Builds one client's trace records and hands them to ``dispatcher``.

    Args:
        dispatcher: where records go.
        group: the producer or consumer group written into the records.
        client_id: the client's id, written as the records' client host.
    """

    def __init__(self, dispatcher: TraceDispatcher, group: str, client_id: str) -> None:
        self.dispatcher = dispatcher
        self.group = group
        self.client_id = client_id
        self._failed_once = False

    # -- producer side ---------------------------------------------------------------------

    def sent(self, messages: Sequence[Message], result: SendResult, started_ms: int,
             store_host: str | None) -> None:
        """Pub records for the messages of one send request (one message, or a batch)."""
        try:
            self._sent(messages, result, started_ms, store_host)
        except Exception:
            self._bug("a Pub record")

    def _sent(self, messages: Sequence[Message], result: SendResult, started_ms: int,
              store_host: str | None) -> None:
        if not result.trace_on or result.queue.topic == self.dispatcher.topic:
            return  # the broker turned tracing off (traceOn=false), or this is trace data
        cost_ms = max(0, _now_ms() - started_ms)
        success = "true" if result.status is SendStatus.SEND_OK else "false"
        sep = CONTENT_SEPARATOR
        # Fields every record of this request shares, around the per-message ones (msg id,
        # tags, keys, body length, type, offset id), so that a message costs one f-string:
        # Pub|ts|region|group|topic| id |tags|keys|host| length |cost| type |offset id|ok|client
        head = sep.join(("Pub", str(started_ms), _text(result.region or REGION_DEFAULT),
                         _text(self.group), _text(result.queue.topic), ""))
        host = sep + _text(store_host) + sep
        plain_middle = sep + "null" + sep + "null" + host  # no tags, no keys
        cost = sep + str(cost_ms) + sep
        tail = sep + success + sep + _text(self.client_id) + FIELD_SEPARATOR
        if len(messages) == 1:
            msg_ids, offset_ids = [result.msg_id], [result.offset_msg_id]
        else:
            msg_ids, offset_ids = result.msg_ids, result.offset_msg_ids
            if len(msg_ids) != len(messages) or len(offset_ids) != len(messages):
                return  # a broker answered with fewer ids than messages: nothing to pair
        append = self.dispatcher.append
        unique_key = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
        for start in range(0, len(messages), TRACE_PIECE_RECORDS_MAX):
            stop = start + TRACE_PIECE_RECORDS_MAX
            texts: list[str] = []
            keys: list[str] = []
            for message, msg_id, offset_id in zip(messages[start:stop], msg_ids[start:stop],
                                                  offset_ids[start:stop], strict=True):
                properties = message.properties
                if len(properties) == 1 and unique_key in properties:  # the common case
                    texts.append(f"{head}{msg_id}{plain_middle}{len(message.body)}{cost}0{sep}"
                                 f"{offset_id}{tail}")
                    keys.append(msg_id)
                    continue
                user_keys = properties.get(PROPERTY_KEYS)
                texts.append(f"{head}{msg_id}{sep}{_text(properties.get(PROPERTY_TAGS))}{sep}"
                             f"{_text(user_keys)}{host}{len(message.body)}{cost}"
                             f"{_message_type(properties)}{sep}{offset_id}{tail}")
                keys.append(msg_id)
                if user_keys:
                    keys.extend(k for k in user_keys.split(" ") if k)
            append(TracePiece("".join(texts), keys, len(texts)))

    def end_transaction(self, result: SendResult, state_name: str, *,
                        from_check: bool, store_host: str | None,
                        message: Message | MessageExt | None = None) -> None:
        """The EndTransaction record of a half message's commit or rollback."""
        try:
            properties = message.properties if message is not None else {}
            record = TraceRecord(
                TraceType.END_TRANSACTION, msg_id=result.msg_id, timestamp_ms=_now_ms(),
                region_id=properties.get(PROPERTY_MSG_REGION) or result.region
                or REGION_DEFAULT,
                group=self.group, topic=result.queue.topic, tags=properties.get(PROPERTY_TAGS),
                keys=properties.get(PROPERTY_KEYS), store_host=store_host,
                msg_type=MessageType.TRANSACTION_COMMIT,
                transaction_id=result.transaction_id or result.msg_id,
                transaction_state=state_name, from_transaction_check=from_check,
                client_host=self.client_id,
            )
            self._append(record)
        except Exception:
            self._bug("an EndTransaction record")

    # -- consumer side ---------------------------------------------------------------------

    def consume_before(self, messages: Sequence[MessageExt]) -> _ConsumeContext | None:
        """SubBefore records for one listener call; the context pairs them with SubAfter."""
        try:
            traced = [m for m in messages
                      if m.properties.get(PROPERTY_TRACE_SWITCH) != "false"]
            if not traced:
                return None
            context = _ConsumeContext(new_unique_key(), _now_ms(), traced)
            sep = CONTENT_SEPARATOR
            head = sep.join(("SubBefore", str(context.started_ms), ""))
            pieces = _PieceBuilder(self.dispatcher)
            for message in traced:
                properties = message.properties
                user_keys = properties.get(PROPERTY_KEYS)
                msg_id = message.msg_id
                pieces.add(
                    f"{head}{_text(properties.get(PROPERTY_MSG_REGION) or REGION_DEFAULT)}"
                    f"{sep}{_text(self.group)}{sep}{context.request_id}{sep}{msg_id}{sep}"
                    f"{message.reconsume_times}{sep}{_text(user_keys)}{sep}"
                    f"{_text(self.client_id)}{FIELD_SEPARATOR}", msg_id, user_keys)
            pieces.flush()
            return context
        except Exception:
            self._bug("a SubBefore record")
            return None

    def consume_after(self, context: _ConsumeContext | None, result: ConsumeResult) -> None:
        """SubAfter records: how the listener call of ``context`` ended."""
        if context is None:
            return
        try:
            messages = context.messages
            cost_ms = max(0, (_now_ms() - context.started_ms) // len(messages))
            success = result is ConsumeResult.SUCCESS
            code = ConsumeReturnType.SUCCESS if success else ConsumeReturnType.FAILED
            sep = CONTENT_SEPARATOR
            # RocketMQ stamps a SubAfter with the time consuming ended.
            tail = sep.join(("", str(int(code)), str(_now_ms()), _text(self.group),
                             _text(self.client_id))) + FIELD_SEPARATOR
            flag = "true" if success else "false"
            pieces = _PieceBuilder(self.dispatcher)
            for message in messages:
                user_keys = message.properties.get(PROPERTY_KEYS)
                msg_id = message.msg_id
                pieces.add(f"SubAfter{sep}{context.request_id}{sep}{msg_id}{sep}{cost_ms}"
                           f"{sep}{flag}{sep}{_text(user_keys)}{tail}", msg_id, user_keys)
            pieces.flush()
        except Exception:
            self._bug("a SubAfter record")

    # -- helpers -----------------------------------------------------------------------------

    def _append(self, record: TraceRecord) -> None:
        self.dispatcher.append(TracePiece(encode_record(record), trace_keys(record), 1))

    def _bug(self, what: str) -> None:
        if not self._failed_once:
            self._failed_once = True
            log.exception("building %s failed (tracing goes on; this is a bug)", what)


class _PieceBuilder:
    """Collects encoded records and their keys into pieces of at most
    TRACE_PIECE_RECORDS_MAX records, each handed to the dispatcher when full."""

    __slots__ = ("dispatcher", "keys", "texts")

    def __init__(self, dispatcher: TraceDispatcher) -> None:
        self.dispatcher = dispatcher
        self.texts: list[str] = []
        self.keys: list[str] = []

    def add(self, text: str, msg_id: str, user_keys: str | None) -> None:
        self.texts.append(text)
        self.keys.append(msg_id)
        if user_keys:
            self.keys.extend(k for k in user_keys.split(" ") if k)
        if len(self.texts) >= TRACE_PIECE_RECORDS_MAX:
            self.flush()

    def flush(self) -> None:
        if self.texts:
            self.dispatcher.append(TracePiece("".join(self.texts), self.keys, len(self.texts)))
            self.texts, self.keys = [], []


def _message_type(properties: dict[str, str]) -> int:
    if properties.get(PROPERTY_TRANSACTION_PREPARED) == "true":
        return MessageType.TRANSACTION_HALF
    delay = properties.get(PROPERTY_DELAY_TIME_LEVEL)
    if delay and delay != "0":
        return MessageType.DELAY
    return MessageType.NORMAL


class _ConsumeContext:
    """One listener call's request id, start time and traced messages."""

    __slots__ = ("messages", "request_id", "started_ms")

    def __init__(self, request_id: str, started_ms: int, messages: list[MessageExt]) -> None:
        self.request_id = request_id
        self.started_ms = started_ms
        self.messages = messages


class TracingInvoker:
    """A ListenerInvoker that records SubBefore and SubAfter around each listener call.

    It has the invoker's interface (``inline``, ``call_inline``, ``finish``, ``call``), so
    the consume services use it unchanged.
    """

    def __init__(self, inner: ListenerInvoker, tracer: Tracer) -> None:
        self.inner = inner
        self.tracer = tracer
        self.inline = inner.inline
        self.coroutine = inner.coroutine
        self.where = inner.where

    def call_inline(self, messages: list[MessageExt]) -> ConsumeResult | Awaitable[Any]:
        """As ListenerInvoker.call_inline; an awaitable it returns records SubAfter when
        ``finish`` awaits it."""
        context = self.tracer.consume_before(messages)
        outcome = self.inner.call_inline(messages)
        if isinstance(outcome, ConsumeResult):
            self.tracer.consume_after(context, outcome)
            return outcome
        return self._finish_traced(outcome, messages, context)

    async def _finish_traced(self, awaitable: Awaitable[Any], messages: list[MessageExt],
                             context: _ConsumeContext | None) -> ConsumeResult:
        result = await self.inner.finish(awaitable, messages)
        self.tracer.consume_after(context, result)
        return result

    async def finish(self, awaitable: Awaitable[Any], messages: list[MessageExt]
                     ) -> ConsumeResult:
        """As ListenerInvoker.finish."""
        return await self.inner.finish(awaitable, messages)

    async def call(self, messages: list[MessageExt]) -> ConsumeResult:
        """As ListenerInvoker.call, with SubBefore before and SubAfter after."""
        context = self.tracer.consume_before(messages)
        result = await self.inner.call(messages)
        self.tracer.consume_after(context, result)
        return result
