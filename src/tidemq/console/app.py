"""The console's aiohttp application: routes, the error page, the pieces it owns.

A failure of the cluster (a refused request, an unknown topic, a broker that does not
answer) is shown as a page that names it, with status 404 for something not found, 400
for bad input and 502 for the cluster's refusals; never a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from tidemq.client.admin import Admin
from tidemq.client.errors import InvalidMessage, NoRouteError
from tidemq.client.trace_data import TRACE_TOPIC_DEFAULT
from tidemq.console import cluster_pages, dlq_pages, group_pages, message_pages, topic_pages
from tidemq.console.context import CONTEXT_KEY, ConsoleContext
from tidemq.console.html import escape, page
from tidemq.console.sampler import SAMPLE_INTERVAL_S, MetricsSampler
from tidemq.errors import InvalidTopicName, TidemqError

log = logging.getLogger("tidemq.console")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_pages(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except (TidemqError, ValueError) as e:
        if isinstance(e, NoRouteError):
            status = 404  # no such topic, group or message
        elif isinstance(e, ValueError | InvalidTopicName | InvalidMessage):
            status = 400  # the user's input
        else:
            status = 502  # the cluster refused or did not answer
        context: ConsoleContext = request.app[CONTEXT_KEY]
        html = page("Error", f'<p class="error" id="error">{escape(str(e) or repr(e))}</p>',
                    write_enabled=context.write_enabled)
        return web.Response(text=html, content_type="text/html", status=status)


def create_app(admin: Admin, *, write_enabled: bool = False,
               trace_topic: str = TRACE_TOPIC_DEFAULT,
               sample_interval_s: float = SAMPLE_INTERVAL_S) -> web.Application:
    """The console application over a started ``admin``.

    The metrics sampler starts and stops with the application; ``admin`` stays the
    caller's to close.
    """
    app = web.Application(middlewares=[error_pages])
    sampler = MetricsSampler(admin, sample_interval_s)
    app[CONTEXT_KEY] = ConsoleContext(admin, write_enabled, trace_topic, sampler)

    async def start_sampler(_: web.Application) -> None:
        sampler.start()

    async def stop_sampler(_: web.Application) -> None:
        await sampler.stop()

    app.on_startup.append(start_sampler)
    app.on_cleanup.append(stop_sampler)
    app.add_routes([
        web.get("/", cluster_pages.cluster_page),
        web.get("/topics", topic_pages.topics_page),
        web.get("/topic", topic_pages.topic_page),
        web.post("/topics/update", topic_pages.update_topic),
        web.post("/topics/delete", topic_pages.delete_topic),
        web.get("/groups", group_pages.groups_page),
        web.get("/group", group_pages.group_page),
        web.post("/groups/reset", group_pages.reset_offset),
        web.get("/messages", message_pages.messages_page),
        web.get("/message", message_pages.message_page),
        web.get("/trace", message_pages.trace_page),
        web.get("/dlq", dlq_pages.dlq_page),
        web.post("/dlq/redrive", dlq_pages.redrive),
    ])
    return app
