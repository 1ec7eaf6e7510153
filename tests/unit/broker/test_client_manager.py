"""Clients and groups: HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP, NOTIFY on
changes, channel expiry, CHECK_CLIENT_CONFIG and the connection lists of admins.

Consumers here are real RemotingClients on loopback (one connection each), so the broker's
NOTIFY_CONSUMER_IDS_CHANGED requests and connection closes are the real thing.
"""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
import pytest

from tidemq.broker.pull_processor import PULL_FLAG_SUBSCRIPTION
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.message import iter_records
from tidemq.remoting.client import RemotingClient
from tidemq.store.config_tables import SubscriptionGroupConfig, TopicConfig
from tidemq.store.interface import StoreMessage

GROUP = "cg_members"
TOPIC = "TopicTest"
WAIT_BOUND_S = 10.0


def heartbeat_body(client_id: str, *, group: str = GROUP, sub_string: str = "*",
                   topic: str = TOPIC, producer_group: str | None = None) -> bytes:
    document = {
        "clientID": client_id,
        "consumerDataSet": [{
            "groupName": group,
            "consumeType": "CONSUME_PASSIVELY",
            "messageModel": "CLUSTERING",
            "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
            "subscriptionDataSet": [{
                "classFilterMode": False, "topic": topic, "subString": sub_string,
                "tagsSet": [] if sub_string == "*" else [sub_string], "codeSet": [],
                "subVersion": 1700000000000, "expressionType": "TAG",
            }],
            "unitMode": False,
        }] if group else [],
        "producerDataSet": [{"groupName": producer_group}] if producer_group else [],
    }
    return orjson.dumps(document)


class Member:
    """A client with one loopback connection that records NOTIFY_CONSUMER_IDS_CHANGED."""

    def __init__(self, link, client_id: str) -> None:
        self.link = link
        self.client_id = client_id
        self.client = RemotingClient()
        self.notified: list[str] = []
        self.client.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_notify)

    async def _on_notify(self, request: RemotingCommand, connection) -> None:
        assert request.is_oneway
        self.notified.append(request.ext_fields["consumerGroup"])

    async def ask(self, request: RemotingCommand) -> RemotingCommand:
        return await self.client.invoke(self.link.address, request, 5000)

    async def heartbeat(self, body: bytes | None = None, **kwargs) -> RemotingCommand:
        body = body if body is not None else heartbeat_body(self.client_id, **kwargs)
        response = await self.ask(RemotingCommand.request(RequestCode.HEART_BEAT, body=body))
        assert response.code == ResponseCode.SUCCESS, response.remark
        assert response.version == 409  # Java clients take it as the broker's version
        return response

    async def consumer_ids(self, group: str = GROUP) -> RemotingCommand:
        return await self.ask(RemotingCommand.request(
            RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group}
        ))

    async def unregister(self, group: str = GROUP) -> RemotingCommand:
        return await self.ask(RemotingCommand.request(RequestCode.UNREGISTER_CLIENT, {
            "clientID": self.client_id, "consumerGroup": group, "producerGroup": "",
        }))

    async def close(self) -> None:
        await self.client.close()


async def wait_until(condition, what: str) -> None:
    async with asyncio.timeout(WAIT_BOUND_S):
        while not condition():
            await asyncio.sleep(0.005)
    assert condition(), what


def ids_of(response: RemotingCommand) -> list[str]:
    assert response.code == ResponseCode.SUCCESS, response.remark
    return orjson.loads(response.body)["consumerIdList"]


@pytest.fixture
def run_scenario(serve, fake_namesrv):
    """``run_scenario(broker, scenario)``: run ``scenario(link, member)`` against ``broker``
    started on loopback; ``member(client_id)`` makes a client that is closed at the end.

    The broker registers with a (fake) name server, as a deployed broker does: heartbeats
    create retry topics, which trigger registrations.
    """

    def run(broker, scenario) -> None:
        async def main():
            async with fake_namesrv() as namesrv:
                broker.config.namesrv_addr = namesrv.address
                async with serve(broker) as link:
                    members: list[Member] = []

                    def member(client_id: str) -> Member:
                        members.append(Member(link, client_id))
                        return members[-1]

                    try:
                        await scenario(link, member)
                    finally:
                        for m in members:
                            await m.close()

        asyncio.run(main())

    return run


def test_heartbeat_registers_and_consumer_list_includes_the_caller(broker, run_scenario):
    async def scenario(link, member):
        a, b = member("10.0.0.1@a"), member("10.0.0.2@b")
        await a.heartbeat()
        assert ids_of(await a.consumer_ids()) == ["10.0.0.1@a"]
        await b.heartbeat()
        assert sorted(ids_of(await b.consumer_ids())) == ["10.0.0.1@a", "10.0.0.2@b"]

    run_scenario(broker, scenario)


def test_consumer_list_of_a_group_without_members_is_system_error(broker, run_scenario):
    async def scenario(link, member):
        response = await member("x@1").consumer_ids("nobody_here")
        assert response.code == ResponseCode.SYSTEM_ERROR
        assert response.remark == "no consumer for this group, nobody_here"

    run_scenario(broker, scenario)


def test_heartbeat_creates_the_retry_topic_with_the_groups_retry_queue_nums(broker, run_scenario):
    broker.subscription_group_manager.update_subscription_group_config(
        SubscriptionGroupConfig(GROUP, retry_queue_nums=3)
    )

    async def scenario(link, member):
        await member("x@1").heartbeat()
        retry = broker.topic_config_manager.get(f"%RETRY%{GROUP}")
        assert retry is not None
        assert (retry.read_queue_nums, retry.write_queue_nums, retry.perm) == (3, 3, 6)

    run_scenario(broker, scenario)


def test_heartbeat_auto_creates_the_subscription_group(broker, run_scenario):
    async def scenario(link, member):
        await member("x@1").heartbeat(group="cg_new")
        assert broker.subscription_group_manager.get("cg_new") == SubscriptionGroupConfig("cg_new")

    run_scenario(broker, scenario)


def test_members_are_notified_when_one_joins_and_when_one_leaves(broker, run_scenario):
    async def scenario(link, member):
        a, b = member("10.0.0.1@a"), member("10.0.0.2@b")
        await a.heartbeat()
        await wait_until(lambda: a.notified == [GROUP], "A told of its own join")
        await b.heartbeat()
        await wait_until(lambda: len(a.notified) == 2 and b.notified == [GROUP],
                         "A and B told of B's join")
        response = await b.unregister()
        assert response.code == ResponseCode.SUCCESS
        await wait_until(lambda: len(a.notified) == 3, "A told of B's leave")
        assert ids_of(await a.consumer_ids()) == ["10.0.0.1@a"]
        assert b.notified == [GROUP]

    run_scenario(broker, scenario)


def test_unchanged_heartbeat_notifies_nobody(broker, run_scenario):
    async def scenario(link, member):
        a = member("10.0.0.1@a")
        await a.heartbeat()
        await wait_until(lambda: a.notified == [GROUP], "A told of its join")
        await a.heartbeat()
        await a.consumer_ids()  # a round trip after which a notify would have arrived
        await asyncio.sleep(0.05)
        assert a.notified == [GROUP]

    run_scenario(broker, scenario)


def test_subscription_change_notifies_the_members(broker, run_scenario):
    async def scenario(link, member):
        a = member("10.0.0.1@a")
        await a.heartbeat(sub_string="TagA")
        await wait_until(lambda: len(a.notified) == 1, "A told of its join")
        await a.heartbeat(sub_string="TagB")
        await wait_until(lambda: len(a.notified) == 2, "A told of the new subscription")
        subscription = broker.consumer_manager.find_subscription(GROUP, TOPIC)
        assert subscription.tags_set == ("TagB",)

    run_scenario(broker, scenario)


def test_closed_connection_leaves_the_group_and_the_rest_are_notified(broker, run_scenario):
    async def scenario(link, member):
        a, b = member("10.0.0.1@a"), member("10.0.0.2@b")
        await a.heartbeat()
        await b.heartbeat()
        await wait_until(lambda: len(a.notified) == 2, "A told of B's join")
        await b.close()
        await wait_until(lambda: len(a.notified) == 3, "A told of B's connection closing")
        assert ids_of(await a.consumer_ids()) == ["10.0.0.1@a"]
        await a.close()
        await wait_until(lambda: broker.consumer_manager.get(GROUP) is None,
                         "the group gone with its last member")

    run_scenario(broker, scenario)


def test_notify_can_be_switched_off(make_broker, run_scenario):
    broker = make_broker(notify_consumer_ids_changed_enable=False)

    async def scenario(link, member):
        a, b = member("10.0.0.1@a"), member("10.0.0.2@b")
        await a.heartbeat()
        await b.heartbeat()
        await b.close()
        await wait_until(lambda: len(ids_of_now(broker)) == 1, "B gone")
        await a.consumer_ids()
        await asyncio.sleep(0.05)
        assert a.notified == []

    run_scenario(broker, scenario)


def ids_of_now(broker) -> list[str]:
    info = broker.consumer_manager.get(GROUP)
    return info.client_ids() if info is not None else []


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 5_000_000

    def __call__(self) -> int:
        return self.now_ms


def test_silent_member_expires_is_disconnected_and_the_rest_are_notified(broker, run_scenario):
    clock = FakeClock()
    broker.clients.clock_ms = clock

    async def scenario(link, member):
        a, b = member("10.0.0.1@a"), member("10.0.0.2@b")
        await a.heartbeat()
        await b.heartbeat()
        await wait_until(lambda: len(a.notified) == 2, "A told of B's join")
        clock.now_ms += 100_000
        await a.heartbeat()  # A keeps talking; B falls silent
        clock.now_ms += 30_000  # B silent for 130 s, A for 30 s
        broker.consumption.scan_client_channels()
        assert ids_of_now(broker) == ["10.0.0.1@a"]
        await wait_until(lambda: len(a.notified) == 3, "A told of B's expiry")
        await wait_until(lambda: not b.client.connections, "B's connection closed by the broker")

    run_scenario(broker, scenario)


def test_members_subscribing_differently_are_named_in_a_warning(broker, caplog, run_scenario):
    async def scenario(link, member):
        a, b = member("10.0.0.1@a"), member("10.0.0.2@b")
        with caplog.at_level(logging.WARNING, logger="tidemq.broker"):
            await a.heartbeat(sub_string="TagA")
            await b.heartbeat(sub_string="TagB")
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(
            "subscribe differently" in w and "10.0.0.1@a" in w and "10.0.0.2@b" in w
            and "'TagA'" in w and "'TagB'" in w
            for w in warnings
        ), warnings

    run_scenario(broker, scenario)


# The HEART_BEAT body of the C++ 1.x client (oracle frames cpp_produce_consume, seq 13): integer
# enums, subVersion as a string, codeSet [0] for tag "TagA", no producerDataSet.
CPP_HEARTBEAT = (
    b'{"clientID":"20025-127.0.0.1@DEFAULT","consumerDataSet":[{"consumeFromWhere":0,'
    b'"consumeType":1,"groupName":"cg_capture","messageModel":1,"subscriptionDataSet":['
    b'{"subString":"*","subVersion":"1795360694768","topic":"%RETRY%cg_capture"},'
    b'{"codeSet":[0],"subString":"TagA","subVersion":"1795360694768","tagsSet":["TagA"],'
    b'"topic":"TopicTest"}]}]}\n'
)


def test_cpp_heartbeat_with_code_set_zero_still_filters_by_tag(broker, run_scenario):
    broker.topic_config_manager.update(TopicConfig(TOPIC, 4, 4))
    for tags in ("TagA", "TagB", "TagA", None):
        broker.store.put_message(StoreMessage(
            TOPIC, 0, tags.encode() if tags else b"none", {"TAGS": tags} if tags else {},
            born_timestamp=int(time.time() * 1000), born_host="127.0.0.1:50000",
        ))

    async def scenario(link, member):
        cpp = member("20025-127.0.0.1@DEFAULT")
        await cpp.heartbeat(CPP_HEARTBEAT)
        assert ids_of(await cpp.consumer_ids("cg_capture")) == ["20025-127.0.0.1@DEFAULT"]
        pull = RemotingCommand.request(RequestCode.PULL_MESSAGE, {
            "consumerGroup": "cg_capture", "topic": TOPIC, "queueId": "0", "queueOffset": "0",
            "maxMsgNums": "32", "sysFlag": "0", "commitOffset": "0",
            "suspendTimeoutMillis": "15000", "subVersion": "1795360694768",
        })
        response = await cpp.ask(pull)
        assert response.code == ResponseCode.SUCCESS, response.remark
        assert [m.body for m in iter_records(response.body)] == [b"TagA", b"TagA"]
        connections = await cpp.ask(RemotingCommand.request(
            RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "cg_capture"}
        ))
        described = orjson.loads(connections.body)
        assert (described["consumeType"], described["messageModel"],
                described["consumeFromWhere"]) == (
            "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET")
        assert described["subscriptionTable"][TOPIC]["codeSet"] == [2598919]

    run_scenario(broker, scenario)


def test_consumer_connection_list_describes_members_and_subscriptions(broker, run_scenario):
    async def scenario(link, member):
        a = member("10.0.0.1@a")
        missing = await a.ask(RemotingCommand.request(
            RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": GROUP}
        ))
        assert missing.code == ResponseCode.CONSUMER_NOT_ONLINE
        assert GROUP in missing.remark
        await a.heartbeat(sub_string="TagA")
        response = await a.ask(RemotingCommand.request(
            RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": GROUP}
        ))
        assert response.code == ResponseCode.SUCCESS
        described = orjson.loads(response.body)
        [connection] = described["connectionSet"]
        assert connection["clientId"] == "10.0.0.1@a"
        assert connection["language"] == "PYTHON" and connection["version"] == 409
        assert connection["clientAddr"].startswith("127.0.0.1:")
        assert described["consumeFromWhere"] == "CONSUME_FROM_FIRST_OFFSET"
        assert described["subscriptionTable"][TOPIC]["subString"] == "TagA"
        assert described["subscriptionTable"][TOPIC]["tagsSet"] == ["TagA"]

    run_scenario(broker, scenario)


def test_producers_show_in_the_producer_connection_list_until_they_leave(broker, run_scenario):
    async def scenario(link, member):
        p = member("10.0.0.9@p")
        request = {"producerGroup": "pg_orders"}
        missing = await p.ask(RemotingCommand.request(
            RequestCode.GET_PRODUCER_CONNECTION_LIST, request))
        assert missing.code == ResponseCode.SYSTEM_ERROR and "pg_orders" in missing.remark
        await p.heartbeat(heartbeat_body("10.0.0.9@p", group="", producer_group="pg_orders"))
        listed = await p.ask(RemotingCommand.request(
            RequestCode.GET_PRODUCER_CONNECTION_LIST, request))
        assert listed.code == ResponseCode.SUCCESS
        assert [c["clientId"] for c in orjson.loads(listed.body)["connectionSet"]] == [
            "10.0.0.9@p"]
        await p.ask(RemotingCommand.request(RequestCode.UNREGISTER_CLIENT, {
            "clientID": "10.0.0.9@p", "producerGroup": "pg_orders"}))
        gone = await p.ask(RemotingCommand.request(
            RequestCode.GET_PRODUCER_CONNECTION_LIST, request))
        assert gone.code == ResponseCode.SYSTEM_ERROR

    run_scenario(broker, scenario)


def test_malformed_heartbeats_get_system_error_naming_the_problem(broker, run_scenario):
    async def scenario(link, member):
        a = member("x@1")
        cases = {
            None: "no body",
            b"{not json": "HEART_BEAT",
            b"[]": "not a JSON object",
            b'{"consumerDataSet":[]}': "clientID",
            b'{"clientID":"c","consumerDataSet":{"a":1}}': "consumerDataSet",
            b'{"clientID":"c","consumerDataSet":[{"groupName":"g","subscriptionDataSet":'
            b'[{"subString":"*"}]}]}': "no topic",
        }
        for body, expected in cases.items():
            response = await a.ask(RemotingCommand.request(RequestCode.HEART_BEAT, body=body))
            assert response.code == ResponseCode.SYSTEM_ERROR, body
            assert expected in response.remark, (body, response.remark)

    run_scenario(broker, scenario)


def check_client_config(subscription: dict) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.CHECK_CLIENT_CONFIG, body=orjson.dumps({
        "clientId": "x@1", "group": GROUP, "subscriptionData": subscription,
    }))


def test_check_client_config_accepts_tags_and_refuses_sql92_while_it_is_off(broker, handlers):
    table = handlers(broker)

    def ask(request):
        return asyncio.run(table.ask(request))

    tag = ask(check_client_config({"topic": TOPIC, "subString": "TagA", "expressionType": "TAG"}))
    assert tag.code == ResponseCode.SUCCESS
    sql = ask(check_client_config(
        {"topic": TOPIC, "subString": "a > 1", "expressionType": "SQL92"}))
    assert sql.code == ResponseCode.SYSTEM_ERROR
    assert sql.remark == "SQL92 filter is not enabled (set enablePropertyFilter=true)"
    odd = ask(check_client_config({"topic": TOPIC, "subString": "x", "expressionType": "XPATH"}))
    assert odd.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "XPATH" in odd.remark


def test_pull_with_subscription_flag_works_without_any_heartbeat(broker, handlers):
    broker.topic_config_manager.update(TopicConfig(TOPIC, 4, 4))
    broker.store.put_message(StoreMessage(TOPIC, 0, b"m", {"TAGS": "TagA"}))
    table = handlers(broker)
    request = RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": "cg_lite", "topic": TOPIC, "queueId": 0, "queueOffset": 0,
        "maxMsgNums": 32, "sysFlag": PULL_FLAG_SUBSCRIPTION, "commitOffset": 0,
        "suspendTimeoutMillis": 0, "subVersion": 0, "subscription": "TagA",
    })
    request.ext_fields = {k: str(v) for k, v in request.ext_fields.items()}
    response = asyncio.run(table.ask(request))
    assert response.code == ResponseCode.SUCCESS
