"""Create a topic through the admin API and wait until the name server routes it.

Every integration-type test that needs a topic before it sends does this; one helper, so the
bound (400 x 50 ms = 20 s) and what counts as routed (its queues are readable) are the same
everywhere.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tidemq.client import Admin, MessageQueue

ROUTE_POLLS = 400
ROUTE_POLL_S = 0.05


async def create_routed_topic(namesrv: str, topic: str, queues: int,
                              **admin_options: Any) -> list[MessageQueue]:
    """Create ``topic`` with ``queues`` queues and return its readable queues once the name
    server routes it (bounded, 20 s). ``admin_options`` go to ``Admin`` (``credentials``,
    ``tls``).

    Raises:
        AssertionError: the topic was never routed within the bound.
    """
    async with Admin(namesrv, **admin_options) as admin:
        await admin.create_topic(topic, queues)
        for _ in range(ROUTE_POLLS):
            try:
                found = (await admin.topic_route(topic)).subscribe_queues(topic)
                if found:
                    return found
            except Exception:  # not routed yet: the name server answers with an error
                pass
            await asyncio.sleep(ROUTE_POLL_S)
    raise AssertionError(f"topic {topic} never showed up in the route")
