"""Message pages: search by id, key or time range; one message with its body preview; a
message's trace."""

from __future__ import annotations

import asyncio

from aiohttp import web

from tidemq.client.errors import NoRouteError
from tidemq.client.message import MessageQueue
from tidemq.client.trace_query import query_message_trace
from tidemq.console.context import context_of
from tidemq.console.html import escape, field, form, link, table, url
from tidemq.console.preview import preview_body
from tidemq.console.times import format_ms, parse_time
from tidemq.protocol.message import MessageExt

SEARCH_RESULTS_MAX = 64  # messages one search shows, at most


def _search_forms(query: dict[str, str]) -> str:
    get = query.get
    return (
        "<fieldset><legend>By id</legend>" + form(
            "/messages", field("id", "Message id", get("id", ""), size=34)
            + field("topic", "Topic (for a client id)", get("topic", "")),
            "Find", method="get", form_id="search-id") + "</fieldset>"
        "<fieldset><legend>By key</legend>" + form(
            "/messages", field("key_topic", "Topic", get("key_topic", get("topic", "")))
            + field("key", "Key", get("key", "")), "Find", method="get",
            form_id="search-key") + "</fieldset>"
        "<fieldset><legend>By time range</legend>" + form(
            "/messages", field("range_topic", "Topic", get("range_topic", get("topic", "")))
            + field("begin", "From", get("begin", ""), size=22)
            + field("end", "To", get("end", "now"), size=22), "Find", method="get",
            form_id="search-range") + "</fieldset>"
    )


def _results(messages: list[MessageExt]) -> str:
    rows = [(link(url("/message", id=m.msg_id, topic=m.topic), m.msg_id), m.topic,
             m.broker_name, m.queue_id, m.queue_offset, m.tags or "", " ".join(m.keys),
             format_ms(m.store_timestamp), len(m.body))
            for m in messages]
    return f"<p>{len(rows)} message(s)</p>" + table(
        ("Message id", "Topic", "Broker", "Queue", "Offset", "Tags", "Keys", "Stored",
         "Bytes"), rows, table_id="results", raw_columns=frozenset({0}),
        numeric=frozenset({3, 4, 8}))


async def messages_page(request: web.Request) -> web.Response:
    context = context_of(request)
    admin = context.admin
    query = dict(request.query)
    body = _search_forms(query)
    try:
        if query.get("id"):
            topic = query.get("topic") or None
            message = await admin.query_message_by_id(query["id"].strip(), topic)
            raise web.HTTPFound(url("/message", id=query["id"].strip(), topic=message.topic))
        if query.get("key"):
            found = await admin.query_message_by_key(
                query.get("key_topic", "").strip(), query["key"].strip(),
                max_num=SEARCH_RESULTS_MAX)
            body += _results(found)
        elif query.get("range_topic"):
            begin_ms = parse_time(query.get("begin") or "0")
            end_ms = parse_time(query.get("end") or "now")
            body += _results(await _by_time_range(context.admin, query["range_topic"].strip(),
                                                  begin_ms, end_ms))
    except (NoRouteError, ValueError) as e:
        body += f'<p class="error" id="error">{escape(e)}</p>'
    return context.render("Messages", body, request)


async def _by_time_range(admin, topic: str, begin_ms: int, end_ms: int) -> list[MessageExt]:
    """Messages of ``topic`` stored in [begin_ms, end_ms], oldest first, at most
    SEARCH_RESULTS_MAX (each queue's range found by SEARCH_OFFSET_BY_TIMESTAMP)."""
    route = await admin.topic_route(topic)
    queues: list[MessageQueue] = route.subscribe_queues(topic)
    bounds = await asyncio.gather(*(
        asyncio.gather(admin.search_offset(q, begin_ms), admin.search_offset(q, end_ms),
                       admin.max_offset(q))
        for q in queues))
    found: list[MessageExt] = []
    for queue, (start, stop, end) in zip(queues, bounds, strict=True):
        offset = start
        while offset < min(end, stop + 1) and len(found) < SEARCH_RESULTS_MAX:
            try:
                message = await admin.query_message_by_offset(queue, offset)
            except NoRouteError:
                break
            if message.store_timestamp > end_ms:
                break
            if message.store_timestamp >= begin_ms:
                found.append(message)
            offset += 1
    found.sort(key=lambda m: (m.store_timestamp, m.broker_name, m.queue_id, m.queue_offset))
    return found[:SEARCH_RESULTS_MAX]


async def message_page(request: web.Request) -> web.Response:
    context = context_of(request)
    msg_id = request.query.get("id", "")
    topic = request.query.get("topic") or None
    try:
        message = await context.admin.query_message_by_id(msg_id, topic)
    except (NoRouteError, ValueError) as e:
        return context.render("Message", f'<p class="error" id="error">{escape(e)}</p>',
                              request)
    preview = preview_body(message.uncompressed_body())
    rows = [("Message id", message.msg_id), ("Offset id", message.offset_msg_id),
            ("Topic", message.topic), ("Tags", message.tags or ""),
            ("Keys", " ".join(message.keys)),
            ("Queue", f"{message.broker_name} {message.queue_id} offset {message.queue_offset}"),
            ("Born", f"{format_ms(message.born_timestamp)} from {message.born_host}"),
            ("Stored", f"{format_ms(message.store_timestamp)} at {message.store_host}"),
            ("Reconsume times", message.reconsume_times),
            ("Properties", ", ".join(f"{k}={v}" for k, v in sorted(message.properties.items()))),
            ("Body", f"{len(message.body)} bytes")]
    body = table(("Field", "Value"), rows, table_id="message")
    body += (f'<h2>Body (<span id="body-kind">{preview.kind}</span>'
             f'{", first part only" if preview.truncated else ""})</h2>'
             f'<pre id="body">{escape(preview.text)}</pre>')
    body += "<p>" + link(url("/trace", id=message.msg_id), "trace of this message") + "</p>"
    return context.render(f"Message {message.msg_id}", body, request)


async def trace_page(request: web.Request) -> web.Response:
    context = context_of(request)
    msg_id = request.query.get("id", "").strip()
    body = form("/trace", field("id", "Message id", msg_id, size=34), "Show trace",
                method="get", form_id="trace-form")
    if msg_id:
        try:
            trace = await query_message_trace(context.admin, msg_id,
                                              trace_topic=context.trace_topic)
        except NoRouteError as e:
            trace = None
            body += f'<p class="error" id="error">{escape(e)}</p>'
        if trace is not None and not trace.records:
            body += (f'<p id="no-trace">no trace of {escape(msg_id)} in '
                     f"{escape(context.trace_topic)}</p>")
        elif trace is not None:
            rows: list[tuple[object, ...]] = [
                ("Pub", r.group, r.client_host, format_ms(r.timestamp_ms), f"{r.cost_ms} ms",
                 "success" if r.success else "failed",
                 f"topic {r.topic} at {r.store_host}, tags {r.tags or '-'}, keys "
                 f"{r.keys or '-'}") for r in trace.sends]
            rows += [("EndTransaction", r.group, r.client_host, format_ms(r.timestamp_ms),
                      "", r.transaction_state, f"transaction {r.transaction_id}")
                     for r in trace.transaction_ends]
            rows += [("Sub", a.group, a.client, format_ms(a.began_ms or a.ended_ms),
                      f"{a.cost_ms} ms", "consuming" if a.success is None
                      else "success" if a.success else "failed", f"retry {a.retry_times}")
                     for a in trace.consume_attempts()]
            body += table(("Type", "Group", "Client", "Time", "Cost", "Status", "Details"),
                          rows, table_id="trace")
    return context.render("Message trace", body, request)
