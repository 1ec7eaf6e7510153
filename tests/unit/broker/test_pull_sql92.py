"""SQL92 property filters at the broker: pulls keep only matching messages (offsets still move
past the others), CHECK_CLIENT_CONFIG answers, the enablePropertyFilter and
filterSupportRetry settings, and the FILTER_DATA_NOT_EXIST / parse-failure codes."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from tidemq.broker.pull_processor import PULL_FLAG_SUBSCRIPTION
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.message import iter_records
from tidemq.store.config_tables import TopicConfig
from tidemq.store.interface import StoreMessage

TOPIC = "SqlTopic"
GROUP = "cg_sql"
RETRY_TOPIC = f"%RETRY%{GROUP}"


def put(broker, properties: dict[str, str], *, topic: str = TOPIC, body: bytes = b"m") -> None:
    result = broker.store.put_message(StoreMessage(
        topic, 0, body, properties, born_timestamp=int(time.time() * 1000),
        born_host="127.0.0.1:50000",
    ))
    assert result.ok, result.remark


def pull(offset: int = 0, *, expression: str | None = None, expression_type: str = "SQL92",
         topic: str = TOPIC, flags: int = PULL_FLAG_SUBSCRIPTION, sub_version: int = 0,
         max_msg_nums: int = 32) -> RemotingCommand:
    ext = {
        "consumerGroup": GROUP, "topic": topic, "queueId": "0", "queueOffset": str(offset),
        "maxMsgNums": str(max_msg_nums), "sysFlag": str(flags), "commitOffset": "0",
        "suspendTimeoutMillis": "0", "subVersion": str(sub_version),
        "expressionType": expression_type,
    }
    if expression is not None:
        ext["subscription"] = expression
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, ext)


def heartbeat_body(subscriptions: list[dict]) -> bytes:
    return orjson.dumps({
        "clientID": "127.0.0.1@1",
        "consumerDataSet": [{
            "groupName": GROUP, "consumeType": "CONSUME_PASSIVELY",
            "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
            "subscriptionDataSet": subscriptions,
        }],
        "producerDataSet": [],
    })


def check_client_config(expression: str, expression_type: str = "SQL92") -> RemotingCommand:
    return RemotingCommand.request(RequestCode.CHECK_CLIENT_CONFIG, body=orjson.dumps({
        "clientId": "127.0.0.1@1", "group": GROUP,
        "subscriptionData": {"topic": TOPIC, "subString": expression,
                             "expressionType": expression_type, "subVersion": 1},
    }))


@pytest.fixture
def setup(make_broker, handlers):
    def build(**overrides):
        overrides.setdefault("enable_property_filter", True)
        broker = make_broker(**overrides)
        broker.topic_config_manager.update(TopicConfig(TOPIC, 1, 1))
        broker.topic_config_manager.update(TopicConfig(RETRY_TOPIC, 1, 1))
        table = handlers(broker)

        def ask(request: RemotingCommand) -> RemotingCommand:
            return asyncio.run(table.ask(request))

        return broker, ask

    return build


def offsets_of(response: RemotingCommand) -> list[int]:
    return [m.queue_offset for m in iter_records(response.body)]


def test_pull_keeps_only_messages_whose_properties_match(setup):
    broker, ask = setup()
    for i in range(10):
        put(broker, {"n": str(i), "region": "eu" if i % 2 else "us", "TAGS": f"T{i % 3}"})
    response = ask(pull(expression="region = 'eu' AND n > 3 AND TAGS <> 'T0'"))
    assert response.code == ResponseCode.SUCCESS
    # odd n > 3: 5, 7, 9; n % 3 != 0 drops 9
    assert offsets_of(response) == [5, 7]
    assert int(response.ext_fields["nextBeginOffset"]) == 10


def test_pull_where_nothing_matches_is_retry_immediately_past_the_read(setup):
    broker, ask = setup()
    for i in range(4):
        put(broker, {"n": str(i)})
    response = ask(pull(expression="n > 100"))
    assert response.code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert int(response.ext_fields["nextBeginOffset"]) == 4
    assert "NO_MATCHED_MESSAGE" in response.remark and "n > 100" in response.remark


def test_missing_property_and_unconvertible_values_are_not_delivered(setup):
    broker, ask = setup()
    put(broker, {})
    put(broker, {"amount": "lots"})
    put(broker, {"amount": "150"})
    response = ask(pull(expression="amount > 100"))
    assert offsets_of(response) == [2]


def test_heartbeat_registers_the_sql92_subscription_for_pulls_without_the_expression(setup):
    broker, ask = setup()
    put(broker, {"a": "1"})
    put(broker, {"a": "7"})
    beat = ask(RemotingCommand.request(RequestCode.HEART_BEAT, body=heartbeat_body([
        {"topic": TOPIC, "subString": "a > 5", "expressionType": "SQL92", "subVersion": 100},
    ])))
    assert beat.code == ResponseCode.SUCCESS
    assert broker.consumer_filter_table.get(GROUP, TOPIC).expression is not None
    response = ask(pull(flags=0, sub_version=100))
    assert response.code == ResponseCode.SUCCESS
    assert offsets_of(response) == [1]


def test_heartbeat_expression_that_does_not_compile_makes_pulls_filter_data_not_exist(setup):
    _, ask = setup()
    beat = ask(RemotingCommand.request(RequestCode.HEART_BEAT, body=heartbeat_body([
        {"topic": TOPIC, "subString": "a >", "expressionType": "SQL92", "subVersion": 100},
    ])))
    assert beat.code == ResponseCode.SUCCESS  # as RocketMQ: the heartbeat itself is accepted
    response = ask(pull(flags=0, sub_version=100))
    assert response.code == ResponseCode.FILTER_DATA_NOT_EXIST
    assert "position 3" in response.remark and GROUP in response.remark


def test_expression_in_the_pull_that_does_not_compile_is_subscription_parse_failed(setup):
    _, ask = setup()
    response = ask(pull(expression="a = 'open"))
    assert response.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert "position 4" in response.remark


def test_sql92_pull_is_refused_while_property_filter_is_off(setup):
    broker, ask = setup(enable_property_filter=False)
    put(broker, {"a": "1"})
    response = ask(pull(expression="a = 1"))
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "enablePropertyFilter=true" in response.remark


def test_tag_pull_is_unchanged_and_not_filtered_by_sql(setup):
    broker, ask = setup()
    put(broker, {"TAGS": "A", "a": "1"})
    put(broker, {"TAGS": "B", "a": "2"})
    response = ask(pull(expression="A", expression_type="TAG"))
    assert offsets_of(response) == [0]


def test_check_client_config_answers(setup):
    _, ask = setup()
    assert ask(check_client_config("a > 5 AND b IN ('x')")).code == ResponseCode.SUCCESS
    assert ask(check_client_config("TagA || TagB", "TAG")).code == ResponseCode.SUCCESS
    bad = ask(check_client_config("a > 'x'"))
    assert bad.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert "cannot be compared" in bad.remark and "position 4" in bad.remark


def test_check_client_config_refuses_sql92_while_property_filter_is_off(setup):
    _, ask = setup(enable_property_filter=False)
    response = ask(check_client_config("a > 5"))
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "enablePropertyFilter=true" in response.remark


def retried(broker, real_topic: str, properties: dict[str, str]) -> None:
    put(broker, {**properties, "RETRY_TOPIC": real_topic}, topic=RETRY_TOPIC)


@pytest.mark.parametrize("support_retry, expected", [(False, [0, 1]), (True, [1])])
def test_retry_messages_are_sql_filtered_only_with_filter_support_retry(
    setup, support_retry, expected
):
    broker, ask = setup(filter_support_retry=support_retry)
    ask(RemotingCommand.request(RequestCode.HEART_BEAT, body=heartbeat_body([
        {"topic": TOPIC, "subString": "a > 5", "expressionType": "SQL92", "subVersion": 100},
        {"topic": RETRY_TOPIC, "subString": "*", "expressionType": "TAG", "subVersion": 100},
    ])))
    retried(broker, TOPIC, {"a": "1"})
    retried(broker, TOPIC, {"a": "9"})
    response = ask(pull(topic=RETRY_TOPIC, flags=0, expression_type="TAG", sub_version=100))
    assert response.code == ResponseCode.SUCCESS
    assert offsets_of(response) == expected
