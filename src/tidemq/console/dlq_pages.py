"""Dead letters: browse a group's ``%DLQ%<group>`` and send letters back to be consumed."""

from __future__ import annotations

from aiohttp import web

from tidemq.client.errors import NoRouteError
from tidemq.console.context import context_of, require_write
from tidemq.console.html import escape, field, form, hidden, link, table, url
from tidemq.console.preview import preview_body
from tidemq.console.times import format_ms

DEAD_LETTERS_SHOWN_MAX = 500
BODY_SNIPPET_CHARS = 80


async def dlq_page(request: web.Request) -> web.Response:
    context = context_of(request)
    group = request.query.get("group", "").strip()
    body = form("/dlq", field("group", "Consumer group", group), "Show", method="get",
                form_id="dlq-form")
    if group:
        letters = await context.admin.dead_letters(group, max_num=DEAD_LETTERS_SHOWN_MAX)
        rows = []
        for letter in letters:
            message = letter.message
            snippet = preview_body(message.uncompressed_body()[:4096]).text
            if len(snippet) > BODY_SNIPPET_CHARS:
                snippet = snippet[:BODY_SNIPPET_CHARS] + "..."
            action = ""
            if context.write_enabled:
                action = form("/dlq/redrive", hidden("group", group)
                              + hidden("id", message.msg_id), "Redrive", inline=True,
                              form_id=f"redrive-{message.msg_id}")
            rows.append((link(url("/message", id=message.offset_msg_id), message.msg_id),
                         letter.original_topic or "", message.reconsume_times,
                         format_ms(message.store_timestamp),
                         "yes" if letter.redriven else "no", escape(snippet), action))
        body += f'<p id="dlq-count">{len(rows)} dead letter(s) of {escape(group)}</p>'
        body += table(("Message id", "Original topic", "Reconsumed", "Stored",
                       "Redriven", "Body", ""), rows, table_id="dead-letters",
                      raw_columns=frozenset({0, 5, 6}), numeric=frozenset({2}))
        if context.write_enabled and rows:
            body += form("/dlq/redrive", hidden("group", group) + hidden("id", "*"),
                         "Redrive every letter not redriven yet", form_id="redrive-all")
    return context.render("Dead letters", body, request)


async def redrive(request: web.Request) -> web.Response:
    context = context_of(request)
    require_write(context)
    data = await request.post()
    group = str(data.get("group", ""))
    msg_id = str(data.get("id", ""))
    try:
        sent = await context.admin.redrive_dead_letters(
            group, msg_ids=None if msg_id == "*" else [msg_id])
    except NoRouteError as e:
        raise web.HTTPFound(url("/dlq", group=group, error=str(e))) from None
    raise web.HTTPFound(url("/dlq", group=group, flash=(
        f"{len(sent)} dead letter(s) sent back to their topic: "
        + ", ".join(letter.message.msg_id for letter, _ in sent))))
