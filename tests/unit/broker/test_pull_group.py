"""The pulls of one read served together (PullMessageProcessor.handle_group, as the server
registers it: group names checked first): every answer, refusals included, what ``handle``
gives the same pulls one by one, and a suspended pull parked as it parks it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_send_group import FakePeer

from tidemq.broker.pull_processor import (
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
)
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.store.config_tables import SubscriptionGroupConfig, TopicConfig
from tidemq.store.interface import StoreMessage

PEER = "127.0.0.1:45679"
GROUP = "cg_group"
DISABLED_GROUP = "cg_disabled"


class Routes:
    """What a RemotingServer keeps of ``register``: each code's handlers as registered."""

    def __init__(self) -> None:
        self.routes: dict[int, tuple[Any, dict[str, Any]]] = {}

    def register(self, code: int, handler: Any, **options: Any) -> None:
        self.routes[int(code)] = (handler, options)

    def register_default(self, handler: Any, **options: Any) -> None:
        pass


def pull(queue_id: int, offset: int, *, topic: str = "Alpha", group: str = GROUP,
         flags: int = PULL_FLAG_SUBSCRIPTION, subscription: str = "*",
         sub_version: int = 0) -> RemotingCommand:
    """tidemq's PullConsumer's request shape (client/broker_api.py pull_request_fields)."""
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": group, "topic": topic, "queueId": str(queue_id),
        "queueOffset": str(offset), "maxMsgNums": "32", "sysFlag": str(flags),
        "commitOffset": "0", "suspendTimeoutMillis": "20000", "subscription": subscription,
        "subVersion": str(sub_version), "expressionType": "TAG",
    })


# Pulls alike and not: found, nothing new, past the end, an illegal queue id (before and
# after one that passed), another topic, an unknown topic, a group that may not consume, a
# malformed group name, no heartbeat (no SUBSCRIPTION flag), a tag filter.
PULLS = [
    pull(0, 0), pull(0, 1), pull(0, 3), pull(0, 9), pull(1, 0), pull(3, 0), pull(7, 0),
    pull(0, 0, topic="Beta"), pull(1, 0, topic="Beta"), pull(2, 0, topic="Beta"),
    pull(0, 0, topic="Nowhere"), pull(0, 0, group=DISABLED_GROUP),
    pull(0, 0, group="bad group!"), pull(0, 0, flags=0), pull(0, 0, subscription="TagA"),
    pull(0, 0, subscription="TagB || TagA"),
]


def broker_with_messages(make_broker):
    broker = make_broker()
    broker.topic_config_manager.update(TopicConfig("Alpha", 4, 4))
    broker.topic_config_manager.update(TopicConfig("Beta", 2, 2))
    broker.subscription_group_manager.update_subscription_group_config(
        SubscriptionGroupConfig(DISABLED_GROUP, consume_enable=False))
    now = int(time.time() * 1000)
    for topic, queue_id, tags in (("Alpha", 0, "TagA"), ("Alpha", 0, "TagB"),
                                  ("Alpha", 0, None), ("Beta", 0, "TagA")):
        assert broker.store.put_message(StoreMessage(
            topic, queue_id, f"{topic}-{tags}".encode(), {"TAGS": tags} if tags else {},
            born_timestamp=now, born_host="127.0.0.1:50000")).ok
    routes = Routes()
    broker.register_processors(routes)
    return broker, routes.routes[RequestCode.PULL_MESSAGE]


def outcome(response: RemotingCommand | None) -> tuple[Any, ...] | None:
    if response is None:
        return None
    return response.code, response.remark, response.ext_fields, response.body


def copy(request: RemotingCommand) -> RemotingCommand:
    return RemotingCommand.request(request.code, request.ext_fields, request.body)


# A broker per example (the factory is the test's; each broker's state is its own).
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(range(len(PULLS))), min_size=2, max_size=12))
def test_a_read_of_pulls_is_answered_as_each_pull_alone(make_broker, picks):
    _, (handler, options) = broker_with_messages(make_broker)
    assert options.get("immediate") and options.get("group_handler") is not None
    group_handler = options["group_handler"]
    reads = [copy(PULLS[index]) for index in picks]

    async def main():
        peer = FakePeer(PEER)
        together = group_handler(reads, peer)
        alone = [handler(copy(request), peer) for request in reads]
        return together, alone

    together, alone = asyncio.run(main())
    assert isinstance(together, list) and len(together) == len(reads)
    assert [outcome(r) for r in together] == [outcome(r) for r in alone]
    codes = {r.code for r in together}
    assert codes <= {ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND,
                     ResponseCode.PULL_OFFSET_MOVED, ResponseCode.SYSTEM_ERROR,
                     ResponseCode.TOPIC_NOT_EXIST, ResponseCode.NO_PERMISSION,
                     ResponseCode.SUBSCRIPTION_NOT_EXIST}


def test_the_pulls_of_a_consumer_owning_several_queues_park_and_answer_together(make_broker):
    broker, (_, options) = broker_with_messages(make_broker)
    suspended = PULL_FLAG_SUBSCRIPTION | PULL_FLAG_SUSPEND
    # Alpha 0 has 3 messages: found at 0, parked at 3; Alpha 1-3 are empty: parked at 0.
    reads = [pull(0, 0, flags=suspended), pull(0, 3, flags=suspended),
             pull(1, 0, flags=suspended), pull(2, 0, flags=suspended),
             pull(3, 0, flags=suspended), pull(5, 0, flags=suspended)]

    async def main():
        peer = FakePeer(PEER)
        answers = options["group_handler"](reads, peer)
        parked = broker.pull_hold_service.parked_count
        peer.is_closing = True  # the parked pulls are dropped, not answered, at the stop
        await broker.pull_hold_service.stop()
        return answers, parked

    answers, parked = asyncio.run(main())
    assert answers[0].code == ResponseCode.SUCCESS
    assert answers[0].ext_fields["nextBeginOffset"] == "3"
    assert answers[1:5] == [None, None, None, None]  # parked
    assert parked == 4
    assert answers[5].code == ResponseCode.SYSTEM_ERROR and "queueId 5" in answers[5].remark
