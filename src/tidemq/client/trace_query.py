"""Reading a message's trace back: query the trace topic by the message id, decode the
records (ours or any RocketMQ client's), and pair each consume call's SubBefore with its
SubAfter. This is what ``tidemq admin QueryMsgTraceById`` and the console show.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, field

from tidemq.client.admin import Admin
from tidemq.client.trace_data import TRACE_TOPIC_DEFAULT, TraceRecord, TraceType, decode_records

QUERY_TRACE_MESSAGES_MAX = 64  # mqadmin queryMsgTraceById's default maxNum


@dataclass(slots=True)
class ConsumeAttempt:
    """One listener call on one message, from its SubBefore and SubAfter records.

    Attributes:
        group: the consumer group.
        client: the consuming client's id (or, for a writer that does not record it, the
            address its trace message came from).
        began_ms: when the call began (SubBefore); 0 when only a SubAfter was found.
        ended_ms: when it ended (SubAfter); 0 while no SubAfter was found (still running,
            or its record was lost).
        cost_ms: the call's duration per message, as the client measured it.
        success: the listener's answer; None without a SubAfter.
        retry_times: how often the message had been consumed before this call.
    """

    group: str | None
    client: str | None
    began_ms: int = 0
    ended_ms: int = 0
    cost_ms: int = 0
    success: bool | None = None
    retry_times: int = 0
    request_id: str | None = None


@dataclass(slots=True)
class MessageTrace:
    """Everything the trace topic holds about one message id."""

    msg_id: str
    records: list[TraceRecord] = field(default_factory=list)

    @property
    def sends(self) -> list[TraceRecord]:
        """Pub records (one per send that reached a broker), oldest first."""
        return sorted((r for r in self.records if r.type is TraceType.PUB),
                      key=lambda r: r.timestamp_ms)

    @property
    def transaction_ends(self) -> list[TraceRecord]:
        """EndTransaction records, oldest first."""
        return sorted((r for r in self.records if r.type is TraceType.END_TRANSACTION),
                      key=lambda r: r.timestamp_ms)

    def consume_attempts(self) -> list[ConsumeAttempt]:
        """Listener calls, oldest first, each SubBefore paired with its SubAfter by the
        request id (a record without its partner still makes an attempt)."""
        attempts: dict[str, ConsumeAttempt] = {}
        unpaired: list[ConsumeAttempt] = []
        for record in self.records:
            if record.type is TraceType.SUB_BEFORE:
                attempt = attempts.get(record.request_id or "")
                if attempt is None or record.request_id is None:
                    attempt = ConsumeAttempt(record.group, record.client_host,
                                             request_id=record.request_id)
                    if record.request_id is None:
                        unpaired.append(attempt)
                    else:
                        attempts[record.request_id] = attempt
                attempt.began_ms = record.timestamp_ms
                attempt.retry_times = record.retry_times
                attempt.group = attempt.group or record.group
                attempt.client = attempt.client or record.client_host
            elif record.type is TraceType.SUB_AFTER:
                attempt = attempts.get(record.request_id or "")
                if attempt is None or record.request_id is None:
                    attempt = ConsumeAttempt(record.group, record.client_host,
                                             request_id=record.request_id)
                    if record.request_id is None:
                        unpaired.append(attempt)
                    else:
                        attempts[record.request_id] = attempt
                attempt.ended_ms = record.timestamp_ms
                attempt.cost_ms = record.cost_ms
                attempt.success = record.success
                attempt.group = attempt.group or record.group
                attempt.client = attempt.client or record.client_host
        every = [*attempts.values(), *unpaired]
        every.sort(key=lambda a: (a.began_ms or a.ended_ms, a.retry_times))
        return every


async def query_message_trace(
    admin: Admin,
    msg_id: str,
    *,
    trace_topic: str | None = None,
    begin_ms: int = 0,
    end_ms: int | None = None,
    max_num: int = QUERY_TRACE_MESSAGES_MAX,
) -> MessageTrace:
    """The trace records of ``msg_id`` (a client message id, as sends return it).

    Args:
        admin: a started Admin.
        trace_topic: where the traces were written; default RMQ_SYS_TRACE_TOPIC.
        begin_ms, end_ms: store-time range of the trace messages looked at.
        max_num: trace messages looked at, at most.

    Returns:
        A MessageTrace; its records are empty when nothing traced the message (tracing was
        off, the records are not written yet, or the id is wrong).

    Raises:
        NoRouteError: the trace topic does not exist.
    """
    topic = trace_topic or TRACE_TOPIC_DEFAULT
    messages = await admin.query_message_by_key(topic, msg_id, begin_ms=begin_ms,
                                                end_ms=end_ms, max_num=max_num)
    trace = MessageTrace(msg_id)
    # A trace message re-sent after a timed-out attempt may be stored twice: its records
    # come back identical (same times, ids and costs), which two real events never are.
    seen: set[tuple] = set()
    for message in messages:
        for record in decode_records(message.uncompressed_body()):
            if record.msg_id != msg_id:
                continue
            if record.client_host is None:
                # RocketMQ's own readers show the trace message's born host as the client.
                record.client_host = message.born_host
            identity = astuple(record)
            if identity in seen:
                continue
            seen.add(identity)
            trace.records.append(record)
    return trace
