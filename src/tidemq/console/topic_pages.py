"""Topic pages: the list (with create), one topic's queues and offsets (update, delete)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from tidemq.client.errors import NoRouteError
from tidemq.console.context import context_of, require_write
from tidemq.console.html import field, form, hidden, link, table, url

ROUTE_WAIT_S = 5.0
SYSTEM_TOPIC_PREFIXES = ("%RETRY%", "%DLQ%", "RMQ_SYS_", "SCHEDULE_TOPIC", "TBW102",
                         "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC", "TRANS_", "rmq_sys_")


async def topics_page(request: web.Request) -> web.Response:
    context = context_of(request)
    show_system = request.query.get("system") == "1"
    wanted = request.query.get("q", "").strip()
    topics = sorted(await context.admin.topic_list())
    if not show_system:
        topics = [t for t in topics if not t.startswith(SYSTEM_TOPIC_PREFIXES)]
    if wanted:
        topics = [t for t in topics if wanted.lower() in t.lower()]
    body = form("/topics", field("q", "Filter", wanted) + hidden("system", "1" if show_system
                                                                  else "0"),
                "Filter", method="get", form_id="topic-filter")
    body += f"<p>{len(topics)} topic(s) · " + link(
        url("/topics", system="0" if show_system else "1", q=wanted or None),
        "hide system topics" if show_system else "show system topics") + "</p>"
    if context.write_enabled:
        body += "<fieldset><legend>Create or update a topic</legend>" + form(
            "/topics/update", field("topic", "Topic") + field("queues", "Queues", 8, size=4)
            + field("perm", "Perm (6 rw, 4 r, 2 w)", 6, size=2), "Save",
            form_id="create-topic") + "</fieldset>"
    body += table(("Topic",), ((link(url("/topic", topic=t), t),) for t in topics),
                  table_id="topics", raw_columns=frozenset({0}))
    return context.render("Topics", body, request)


async def topic_page(request: web.Request) -> web.Response:
    context = context_of(request)
    topic = request.query.get("topic", "")
    admin = context.admin
    route = await admin.topic_route(topic)
    stats = await admin.topic_stats(topic)
    rows = [(queue.broker_name, queue.queue_id, offsets.min_offset, offsets.max_offset,
             offsets.max_offset - offsets.min_offset)
            for queue, offsets in sorted(stats.items())]
    body = "<h2>Queues</h2>" + table(
        ("Broker", "Queue", "Min offset", "Max offset", "Messages"), rows,
        table_id="queues", numeric=frozenset({1, 2, 3, 4}))
    body += "<h2>Route</h2>" + table(
        ("Broker", "Read queues", "Write queues", "Perm"),
        ((q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm)
         for q in route.queue_datas), table_id="route")
    body += "<p>" + link(url("/messages", topic=topic), "search its messages") + "</p>"
    if context.write_enabled:
        write_queues = max((q.write_queue_nums for q in route.queue_datas), default=8)
        perm = max((q.perm for q in route.queue_datas), default=6)
        body += "<fieldset><legend>Update</legend>" + form(
            "/topics/update", hidden("topic", topic)
            + field("queues", "Queues", write_queues, size=4)
            + field("perm", "Perm", perm, size=2), "Update", form_id="update-topic")
        body += form("/topics/delete", hidden("topic", topic), "Delete this topic",
                     form_id="delete-topic") + "</fieldset>"
    return context.render(f"Topic {topic}", body, request)


async def update_topic(request: web.Request) -> web.Response:
    context = context_of(request)
    require_write(context)
    data = await request.post()
    topic = str(data.get("topic", "")).strip()
    try:
        queues = int(str(data.get("queues", "8")))
        perm = int(str(data.get("perm", "6")))
    except ValueError:
        raise web.HTTPFound(url("/topics", error="queues and perm must be numbers")) from None
    admin = context.admin
    masters = await admin.create_topic(topic, queues, perm)
    # The brokers tell the name servers at their next registration: wait a little for the
    # route, so the topic page that follows can show the new queues.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ROUTE_WAIT_S
    while loop.time() < deadline:
        try:
            route = await admin.topic_route(topic)
        except NoRouteError:
            route = None
        if route is not None and all(q.write_queue_nums == queues for q in route.queue_datas):
            break
        await asyncio.sleep(0.1)
    raise web.HTTPFound(url("/topic", topic=topic,
                            flash=f"topic {topic} saved on {len(masters)} broker(s)"))


async def delete_topic(request: web.Request) -> web.Response:
    context = context_of(request)
    require_write(context)
    data = await request.post()
    topic = str(data.get("topic", ""))
    await context.admin.delete_topic(topic)
    raise web.HTTPFound(url("/topics", flash=f"topic {topic} deleted"))



