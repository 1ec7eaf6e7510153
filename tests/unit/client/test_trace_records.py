"""Message trace without servers: RocketMQ's trace text both ways, the tracer's batch fast
path against the plain encoder, and the dispatcher's batching, limits and failure handling.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.client.listener import ConsumeResult, ListenerInvoker
from tidemq.client.message import Message, MessageQueue, SendResult, SendStatus
from tidemq.client.trace_data import (
    MessageType,
    TraceRecord,
    TraceType,
    decode_records,
    encode_record,
    encode_records,
    trace_keys,
)
from tidemq.client.trace_dispatcher import TraceDispatcher, TracePiece
from tidemq.client.trace_query import MessageTrace, query_message_trace
from tidemq.client.tracer import TRACE_PIECE_RECORDS_MAX, Tracer, TracingInvoker
from tidemq.protocol.message import MessageExt

MSG_ID = "7F00000100002A9F0000000000000042"


def sample_records() -> list[TraceRecord]:
    return [
        TraceRecord(TraceType.PUB, msg_id=MSG_ID, timestamp_ms=1764150000000,
                    group="pg", topic="Orders", tags="paid", keys="o-1 o-2",
                    store_host="127.0.0.1:10911", body_length=10, cost_ms=3,
                    msg_type=MessageType.DELAY, offset_msg_id="7F000001000027AF00000000000000FF",
                    success=True, client_host="10.0.0.1@1#2"),
        TraceRecord(TraceType.SUB_BEFORE, msg_id=MSG_ID, timestamp_ms=1764150000100,
                    group="cg", request_id="req", retry_times=2, keys="o-1",
                    client_host="10.0.0.2@3#4"),
        TraceRecord(TraceType.SUB_AFTER, msg_id=MSG_ID, timestamp_ms=1764150000110,
                    group="cg", request_id="req", cost_ms=10, success=False, keys=None,
                    context_code=4, region_id=None, client_host="10.0.0.2@3#4"),
        TraceRecord(TraceType.END_TRANSACTION, msg_id=MSG_ID, timestamp_ms=1764150000005,
                    group="pg", topic="Orders", tags=None, keys=None,
                    store_host="127.0.0.1:10911", msg_type=MessageType.TRANSACTION_COMMIT,
                    transaction_id="tx-1", transaction_state="COMMIT_MESSAGE",
                    from_transaction_check=True, client_host="10.0.0.1@1#2"),
    ]


def test_records_round_trip_through_rocketmq_text() -> None:
    records = sample_records()
    assert decode_records(encode_records(records).encode()) == records


def test_encoding_follows_rocketmq_field_order() -> None:
    pub, before, after, end = (encode_record(r).rstrip("\x02").split("\x01")
                               for r in sample_records())
    assert pub[:14] == ["Pub", "1764150000000", "DefaultRegion", "pg", "Orders", MSG_ID,
                        "paid", "o-1 o-2", "127.0.0.1:10911", "10", "3", "3",
                        "7F000001000027AF00000000000000FF", "true"]
    assert before[:8] == ["SubBefore", "1764150000100", "DefaultRegion", "cg", "req", MSG_ID,
                          "2", "o-1"]
    # A missing value is "null", never empty: Java's split drops trailing empty fields.
    assert after[:9] == ["SubAfter", "req", MSG_ID, "10", "false", "null", "4",
                         "1764150000110", "cg"]
    assert end[:13] == ["EndTransaction", "1764150000005", "DefaultRegion", "pg", "Orders",
                        MSG_ID, "null", "null", "127.0.0.1:10911", "2", "tx-1",
                        "COMMIT_MESSAGE", "true"]


def test_records_written_by_older_rocketmq_clients_decode() -> None:
    text = (
        # 13-field Pub (no offset msg id), 8-field SubAfter (no group), 7-field SubAfter
        f"Pub\x011\x01r\x01pg\x01T\x01{MSG_ID}\x01null\x01null\x01h:1\x015\x012\x010\x01false\x02"
        f"SubAfter\x01req\x01{MSG_ID}\x014\x01true\x01k\x010\x01123\x02"
        f"SubAfter\x01req2\x01{MSG_ID}\x014\x01true\x01k\x012\x02"
    )
    pub, after, older = decode_records(text)
    assert (pub.success, pub.offset_msg_id, pub.tags, pub.client_host) == (
        False, None, None, None)
    assert (after.timestamp_ms, after.group, after.keys) == (123, None, "k")
    assert (older.context_code, older.timestamp_ms) == (2, 0)


def test_malformed_records_are_skipped_not_fatal() -> None:
    good = encode_record(sample_records()[1])
    text = ("Nonsense\x01a\x02" + "Pub\x01x\x02" + good
            + f"SubBefore\x01notanumber\x01r\x01g\x01q\x01{MSG_ID}\x010\x01k\x02")
    assert decode_records(text) == [sample_records()[1]]
    assert decode_records(b"") == []
    assert decode_records(b"\xff\xfe") == []


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30))
def test_separators_inside_values_cannot_split_a_record(tags: str) -> None:
    record = TraceRecord(TraceType.PUB, msg_id=MSG_ID, tags=tags, group="g")
    (decoded,) = decode_records(encode_record(record))
    assert decoded.msg_id == MSG_ID and decoded.group == "g"


def test_trace_keys_are_the_msg_id_and_the_message_keys() -> None:
    assert trace_keys(sample_records()[0]) == [MSG_ID, "o-1", "o-2"]
    assert trace_keys(sample_records()[2]) == [MSG_ID]


class CollectingDispatcher(TraceDispatcher):
    def __init__(self) -> None:
        super().__init__("RMQ_SYS_TRACE_TOPIC", self._never, self._nothing)
        self.pieces: list[TracePiece] = []

    async def _never(self, topic: str, body: bytes, keys: list[str]) -> None:
        raise AssertionError("not started")

    async def _nothing(self) -> None:
        return None

    def append(self, piece: TracePiece) -> bool:
        self.pieces.append(piece)
        return True


def send_result(msg_ids: list[str], offset_ids: list[str]) -> SendResult:
    return SendResult(SendStatus.SEND_OK, ",".join(msg_ids), ",".join(offset_ids),
                      MessageQueue("Orders", "broker-a", 1), 7, region="DefaultRegion")


def test_batch_pub_records_match_the_plain_encoder() -> None:
    """The tracer's one-pass batch encoding says exactly what encode_record says."""
    dispatcher = CollectingDispatcher()
    tracer = Tracer(dispatcher, "pg", "10.0.0.1@1#2")
    count = TRACE_PIECE_RECORDS_MAX + 3
    messages = [Message("Orders", f"body-{i}", tags="t" if i % 2 else None,
                        keys=[f"k{i}", "shared"] if i % 3 else None) for i in range(count)]
    msg_ids = [f"ID{i:030d}" for i in range(count)]
    offset_ids = [f"OFF{i:029d}" for i in range(count)]
    for message, msg_id in zip(messages, msg_ids, strict=True):
        message.properties["UNIQ_KEY"] = msg_id  # as send_batch leaves them
    messages[5].delay_level = 2  # the general path: its type is written as DELAY
    tracer.sent(messages, send_result(msg_ids, offset_ids), 1764150000000, "127.0.0.1:10911")
    assert [p.records for p in dispatcher.pieces] == [TRACE_PIECE_RECORDS_MAX, 3]
    decoded = decode_records("".join(p.text for p in dispatcher.pieces))
    assert len(decoded) == count
    for record, message, msg_id, offset_id in zip(decoded, messages, msg_ids, offset_ids,
                                                  strict=True):
        expected = TraceRecord(
            TraceType.PUB, msg_id=msg_id, timestamp_ms=1764150000000, group="pg",
            topic="Orders", tags=message.tags, keys=" ".join(message.keys) or None,
            store_host="127.0.0.1:10911", body_length=len(message.body),
            cost_ms=record.cost_ms, offset_msg_id=offset_id, success=True,
            msg_type=MessageType.DELAY if message.delay_level else MessageType.NORMAL,
            client_host="10.0.0.1@1#2")
        assert record == expected
        assert record.cost_ms >= 0
    # every record is findable by its id and its message's keys, in its own piece
    for piece in dispatcher.pieces:
        for record in decode_records(piece.text):
            assert set(trace_keys(record)) <= set(piece.keys)


def test_no_pub_record_when_the_broker_turned_tracing_off() -> None:
    dispatcher = CollectingDispatcher()
    tracer = Tracer(dispatcher, "pg", "c")
    result = SendResult(SendStatus.SEND_OK, "A", "B", MessageQueue("Orders", "b", 0), 0,
                        trace_on=False)
    tracer.sent([Message("Orders", "x")], result, 0, "h:1")
    assert dispatcher.pieces == []


def consumed(msg_id: str, reconsume_times: int = 0, **properties: str) -> MessageExt:
    return MessageExt("Orders", b"x", properties={"UNIQ_KEY": msg_id, **properties},
                      reconsume_times=reconsume_times)


@pytest.mark.parametrize("outcome", [ConsumeResult.SUCCESS, ConsumeResult.RECONSUME_LATER])
def test_tracing_invoker_records_before_and_after_each_call(outcome: ConsumeResult) -> None:
    dispatcher = CollectingDispatcher()
    tracer = Tracer(dispatcher, "cg", "10.0.0.2@3#4")
    invoker = TracingInvoker(ListenerInvoker(lambda messages: outcome, None, "cg"), tracer)
    batch = [consumed("ID-A", 2, KEYS="k1 k2"), consumed("ID-B", TRACE_ON="false"),
             consumed("ID-C")]
    assert invoker.inline
    assert invoker.call_inline(batch) is outcome
    trace = MessageTrace("ID-A", [r for p in dispatcher.pieces for r in decode_records(p.text)
                                  if r.msg_id == "ID-A"])
    (attempt,) = trace.consume_attempts()
    assert (attempt.group, attempt.client, attempt.retry_times, attempt.success) == (
        "cg", "10.0.0.2@3#4", 2, outcome is ConsumeResult.SUCCESS)
    assert attempt.ended_ms >= attempt.began_ms > 0
    traced_ids = {r.msg_id for p in dispatcher.pieces for r in decode_records(p.text)}
    assert traced_ids == {"ID-A", "ID-C"}  # TRACE_ON=false is skipped, as RocketMQ does


def test_tracing_invoker_records_coroutine_listeners() -> None:
    dispatcher = CollectingDispatcher()
    tracer = Tracer(dispatcher, "cg", "c")

    async def listener(messages: list[MessageExt]) -> None:
        raise RuntimeError("boom")

    invoker = TracingInvoker(ListenerInvoker(listener, None, "cg"), tracer)
    result = asyncio.run(invoker.call([consumed("ID-A")]))
    assert result is ConsumeResult.RECONSUME_LATER
    (attempt,) = MessageTrace("ID-A", decode_records(
        "".join(p.text for p in dispatcher.pieces))).consume_attempts()
    assert attempt.success is False


def test_dispatcher_batches_pieces_within_limits() -> None:
    sent: list[tuple[str, bytes, list[str]]] = []

    async def send(topic: str, body: bytes, keys: list[str]) -> None:
        sent.append((topic, body, keys))

    async def close() -> None:
        return None

    async def scenario() -> TraceDispatcher:
        dispatcher = TraceDispatcher("T", send, close, body_bytes_max=1000,
                                     keys_bytes_max=60, linger_ms=1)
        dispatcher.start()
        for i in range(20):
            dispatcher.append(TracePiece("x" * 100, [f"key-{i:02d}", "same"], 2))
        await dispatcher.close()
        return dispatcher

    dispatcher = asyncio.run(scenario())
    assert (dispatcher.appended, dispatcher.sent, dispatcher.failed, dispatcher.dropped) == (
        40, 40, 0, 0)
    assert b"".join(body for _, body, _ in sent) == b"x" * 2000
    for topic, body, keys in sent:
        assert topic == "T"
        assert len(body) <= 1000
        assert sum(len(k) + 1 for k in keys) <= 60
        assert len(keys) == len(set(keys))


def test_dispatcher_counts_failures_and_drops_without_raising() -> None:
    calls = 0

    async def failing_send(topic: str, body: bytes, keys: list[str]) -> None:
        nonlocal calls
        calls += 1
        raise OSError("trace topic cannot be written")

    async def close() -> None:
        return None

    async def scenario() -> TraceDispatcher:
        dispatcher = TraceDispatcher("T", failing_send, close, buffer_pieces_max=3,
                                     linger_ms=1, send_retries=2, retry_backoff_ms=1)
        accepted = [dispatcher.append(TracePiece("r", ["k"], 1)) for _ in range(5)]
        assert accepted == [True, True, True, False, False]
        dispatcher.start()
        await dispatcher.close()
        assert dispatcher.append(TracePiece("r", ["k"], 1)) is False  # closed
        return dispatcher

    dispatcher = asyncio.run(scenario())
    assert (dispatcher.appended, dispatcher.sent, dispatcher.failed, dispatcher.dropped) == (
        3, 0, 3, 3)
    assert calls == 3  # one trace message: the first attempt and two retries, then lost
    assert dispatcher.retried == 6  # its 3 records, re-sent twice


def test_dispatcher_retries_a_failed_trace_send_until_it_is_stored() -> None:
    """The trace topic's first write fails (a timeout under load, say): the dispatcher
    sends the same trace message again and its records arrive; the traced client only ever
    called append, which returned at once."""
    attempts: list[tuple[bytes, list[str]]] = []

    async def send_failing_once(topic: str, body: bytes, keys: list[str]) -> None:
        attempts.append((body, keys))
        if len(attempts) == 1:
            raise TimeoutError("trace send timed out after 3000 ms")

    async def close() -> None:
        return None

    async def scenario() -> TraceDispatcher:
        dispatcher = TraceDispatcher("T", send_failing_once, close, linger_ms=1,
                                     retry_backoff_ms=1)
        dispatcher.start()
        assert dispatcher.append(TracePiece("Pub\x01record\x02", ["ID-1", "order-7"], 1))
        await dispatcher.close()
        return dispatcher

    dispatcher = asyncio.run(scenario())
    assert (dispatcher.sent, dispatcher.failed, dispatcher.dropped, dispatcher.retried) == (
        1, 0, 0, 1)
    assert attempts == [(b"Pub\x01record\x02", ["ID-1", "order-7"])] * 2


def test_dispatcher_drops_are_logged_at_most_once_per_interval(caplog) -> None:
    async def send(topic: str, body: bytes, keys: list[str]) -> None:
        return None

    async def close() -> None:
        return None

    async def scenario() -> TraceDispatcher:
        dispatcher = TraceDispatcher("T", send, close, buffer_pieces_max=1)
        for _ in range(50):
            dispatcher.append(TracePiece("r", ["k"], 2))
        return dispatcher

    with caplog.at_level("WARNING", logger="tidemq.client.trace"):
        dispatcher = asyncio.run(scenario())
    assert dispatcher.dropped == 98
    drops = [r for r in caplog.records if "trace buffer full" in r.getMessage()]
    assert len(drops) == 1 and "dropped 2 trace record(s)" in drops[0].getMessage()


class _StoredTraceMessage:
    def __init__(self, body: bytes) -> None:
        self.body = body
        self.born_host = "127.0.0.1:50000"

    def uncompressed_body(self) -> bytes:
        return self.body


class _TraceTopicByKey:
    """query_message_by_key over fixed trace messages (as Admin answers it)."""

    def __init__(self, bodies: list[bytes]) -> None:
        self.bodies = bodies

    async def query_message_by_key(self, topic: str, key: str, **_: object) -> list:
        return [_StoredTraceMessage(body) for body in self.bodies]


def test_a_trace_message_stored_twice_reads_once() -> None:
    """A retried trace send whose first attempt was stored after all (its answer timed out)
    leaves the same records twice; the reader shows each once, and keeps real repeats."""
    first = TraceRecord(TraceType.PUB, msg_id="ID-A", timestamp_ms=1764150000000, group="pg",
                        topic="Orders", body_length=3, offset_msg_id="OFF-A")
    resent = TraceRecord(TraceType.PUB, msg_id="ID-A", timestamp_ms=1764150000900,
                         group="pg", topic="Orders", body_length=3, offset_msg_id="OFF-B")
    body = encode_records([first, TraceRecord(TraceType.PUB, msg_id="ID-B")]).encode()
    admin = _TraceTopicByKey([body, body, encode_records([resent]).encode()])
    trace = asyncio.run(query_message_trace(admin, "ID-A"))  # type: ignore[arg-type]
    assert [r.offset_msg_id for r in trace.sends] == ["OFF-A", "OFF-B"]
