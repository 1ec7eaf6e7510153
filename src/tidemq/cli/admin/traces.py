"""Message trace verb: ``queryMsgTraceById`` shows a message's life from its trace records."""

from __future__ import annotations

import dataclasses

import click

from tidemq.cli.admin.base import (
    admin,
    format_ms,
    json_option,
    namesrv_option,
    parse_time,
    print_json,
    with_admin,
)
from tidemq.client.admin import Admin
from tidemq.client.trace_data import TRACE_TOPIC_DEFAULT
from tidemq.client.trace_query import QUERY_TRACE_MESSAGES_MAX, query_message_trace

# Plain columns, as mqadmin prints them, so the output greps and fits any width.
_ROW = "{:<15} {:<24} {:<42} {:<24} {:>8}  {:<9} {}"


@admin.command("queryMsgTraceById")
@namesrv_option
@click.option("-i", "--msgId", "msg_id", required=True, help="The message's client id.")
@click.option("-t", "--traceTopic", "trace_topic", default=TRACE_TOPIC_DEFAULT,
              show_default=True)
@click.option("-b", "--beginTimestamp", "begin", default="0", show_default=True)
@click.option("-e", "--endTimestamp", "end", default="now", show_default=True)
@click.option("-c", "--maxNum", "max_num", type=int, default=QUERY_TRACE_MESSAGES_MAX,
              show_default=True, help="Trace messages looked at, at most.")
@json_option
@with_admin
async def query_msg_trace_by_id(client: Admin, msg_id: str, trace_topic: str, begin: str,
                                end: str, max_num: int, as_json: bool) -> None:
    """Show a message's life from its trace: sent, stored, consumed (retries included)."""
    trace = await query_message_trace(client, msg_id, trace_topic=trace_topic,
                                      begin_ms=parse_time(begin), end_ms=parse_time(end),
                                      max_num=max_num)
    if as_json:
        print_json([dataclasses.asdict(record) for record in trace.records])
        return
    if not trace.records:
        click.echo(f"no trace of message {msg_id} in topic {trace_topic} (was it sent or "
                   "consumed with tracing on, e.g. Producer(..., enable_msg_trace=True)?)")
        return
    click.echo(_ROW.format("#Type", "#Group", "#Client", "#Time", "#Cost", "#Status",
                           "#Details"))
    for record in trace.sends:
        click.echo(_ROW.format(
            "Pub", record.group or "-", record.client_host or "-",
            format_ms(record.timestamp_ms), f"{record.cost_ms}ms",
            "success" if record.success else "failed",
            f"topic {record.topic} stored at {record.store_host} (offset id "
            f"{record.offset_msg_id or '-'}), tags {record.tags or '-'}, keys "
            f"{record.keys or '-'}, {record.body_length} bytes"))
    for record in trace.transaction_ends:
        click.echo(_ROW.format(
            "EndTransaction", record.group or "-", record.client_host or "-",
            format_ms(record.timestamp_ms), "-", record.transaction_state or "-",
            f"transaction {record.transaction_id}"
            + (" (answering a check)" if record.from_transaction_check else "")))
    for attempt in trace.consume_attempts():
        status = ("consuming" if attempt.success is None
                  else "success" if attempt.success else "failed")
        click.echo(_ROW.format(
            "Sub", attempt.group or "-", attempt.client or "-",
            format_ms(attempt.began_ms or attempt.ended_ms), f"{attempt.cost_ms}ms", status,
            f"retry {attempt.retry_times}"))
