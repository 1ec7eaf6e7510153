"""What every console page handler gets: the Admin client, the mode, the sampler."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from tidemq.client.admin import Admin
from tidemq.console.html import page
from tidemq.console.sampler import MetricsSampler


@dataclass(slots=True)
class ConsoleContext:
    """The console's state.

    Attributes:
        admin: a started Admin client (the only way the console reaches the cluster).
        write_enabled: False makes every changing action answer 403.
        trace_topic: where message traces are read from.
        sampler: the live metrics behind the charts.
    """

    admin: Admin
    write_enabled: bool
    trace_topic: str
    sampler: MetricsSampler

    def render(self, title: str, body: str, request: web.Request) -> web.Response:
        """A page with the layout; ``?flash=`` and ``?error=`` of the request as notices."""
        html = page(title, body, write_enabled=self.write_enabled,
                    flash=request.query.get("flash"), error=request.query.get("error"))
        return web.Response(text=html, content_type="text/html")


CONTEXT_KEY = web.AppKey("tidemq_console", ConsoleContext)


def context_of(request: web.Request) -> ConsoleContext:
    return request.app[CONTEXT_KEY]


def require_write(context: ConsoleContext) -> None:
    """Raises HTTPForbidden (403) unless write actions are enabled."""
    if not context.write_enabled:
        raise web.HTTPForbidden(
            text="this console is read-only; start it with --write (tidemq console) or "
                 "--consoleWrite true (tidemq dev) to allow changes")
