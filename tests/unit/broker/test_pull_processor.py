"""PULL_MESSAGE: RocketMQ's pre-checks, the status -> code table, tag filtering, commit offsets.

Pulls are handed to the broker's own handlers in-process (``handlers`` fixture); messages are
appended straight to its MemoryMessageStore. Long polling is in test_pull_long_polling.py.
"""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from test_send_group import FakePeer

from tidemq.broker.pull_processor import (
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
)
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.message import iter_records
from tidemq.store.config_tables import SubscriptionGroupConfig, TopicConfig
from tidemq.store.interface import StoreMessage

TOPIC = "TopicTest"
GROUP = "cg_pull"
PULL_HEADER_FIELDS = ("suggestWhichBrokerId", "nextBeginOffset", "minOffset", "maxOffset")


def put(broker, tags: str | None = None, *, topic: str = TOPIC, queue_id: int = 0,
        body: bytes = b"hello") -> int:
    """Append one message to the broker's store; returns its physical offset."""
    properties = {"TAGS": tags} if tags else {}
    result = broker.store.put_message(StoreMessage(
        topic, queue_id, body, properties, born_timestamp=int(time.time() * 1000),
        born_host="127.0.0.1:50000",
    ))
    assert result.ok, result.remark
    return result.physical_offset


def pull_request(
    offset: int = 0,
    *,
    topic: str = TOPIC,
    queue_id: int = 0,
    group: str = GROUP,
    flags: int = PULL_FLAG_SUBSCRIPTION,
    subscription: str | None = "*",
    expression_type: str | None = None,
    max_msg_nums: int = 32,
    commit_offset: int = 0,
    sub_version: int = 0,
) -> RemotingCommand:
    ext = {
        "consumerGroup": group,
        "topic": topic,
        "queueId": str(queue_id),
        "queueOffset": str(offset),
        "maxMsgNums": str(max_msg_nums),
        "sysFlag": str(flags),
        "commitOffset": str(commit_offset),
        "suspendTimeoutMillis": "15000",
        "subVersion": str(sub_version),
    }
    if subscription is not None:
        ext["subscription"] = subscription
    if expression_type is not None:
        ext["expressionType"] = expression_type
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, ext)


@pytest.fixture
def setup(make_broker, handlers):
    """A broker with topic TopicTest (4 queues) and a way to ask it."""

    def build(**overrides):
        broker = make_broker(**overrides)
        broker.topic_config_manager.update(TopicConfig(TOPIC, 4, 4))
        table = handlers(broker)

        def ask(request: RemotingCommand) -> RemotingCommand:
            response = asyncio.run(table.ask(request))
            assert response.opaque == request.opaque
            return response

        return broker, ask

    return build


def header_of(response: RemotingCommand) -> dict[str, int]:
    """The four pull header fields as ints; fails if one is missing."""
    assert response.ext_fields is not None, response.remark
    return {name: int(response.ext_fields[name]) for name in PULL_HEADER_FIELDS}


# -- status -> code table ------------------------------------------------------------------------


def test_found_answers_success_with_the_stored_records_as_they_are(setup):
    broker, ask = setup()
    offsets = [put(broker, "TagA", body=f"m{i}".encode()) for i in range(3)]
    response = ask(pull_request(0))
    assert response.code == ResponseCode.SUCCESS
    assert response.remark == "FOUND"  # the store status's name, as RocketMQ's remark
    assert header_of(response) == {
        "suggestWhichBrokerId": 0, "nextBeginOffset": 3, "minOffset": 0, "maxOffset": 3,
    }
    assert response.body == b"".join(broker.store.read_message(o) for o in offsets)
    messages = list(iter_records(response.body))
    assert [m.body for m in messages] == [b"m0", b"m1", b"m2"]
    assert [m.queue_offset for m in messages] == [0, 1, 2]


def test_max_msg_nums_bounds_the_messages_and_next_begin_offset(setup):
    broker, ask = setup()
    for _ in range(5):
        put(broker)
    response = ask(pull_request(1, max_msg_nums=2))
    assert response.code == ResponseCode.SUCCESS
    assert [m.queue_offset for m in iter_records(response.body)] == [1, 2]
    assert header_of(response)["nextBeginOffset"] == 3


def test_offset_at_the_end_of_the_queue_is_pull_not_found(setup):
    broker, ask = setup()
    put(broker)
    put(broker)
    response = ask(pull_request(2))
    assert response.code == ResponseCode.PULL_NOT_FOUND
    assert header_of(response) == {
        "suggestWhichBrokerId": 0, "nextBeginOffset": 2, "minOffset": 0, "maxOffset": 2,
    }
    assert not response.body
    assert "OFFSET_OVERFLOW_ONE" in response.remark


def test_offset_beyond_the_end_is_offset_moved_to_the_max(setup):
    broker, ask = setup()
    put(broker)
    put(broker)
    response = ask(pull_request(7))
    assert response.code == ResponseCode.PULL_OFFSET_MOVED
    assert header_of(response) == {
        "suggestWhichBrokerId": 0, "nextBeginOffset": 2, "minOffset": 0, "maxOffset": 2,
    }
    assert "OFFSET_OVERFLOW_BADLY" in response.remark and "7" in response.remark


def test_empty_queue_is_not_found_at_offset_0_and_moved_elsewhere(setup):
    _, ask = setup()
    at_zero = ask(pull_request(0, queue_id=1))
    assert at_zero.code == ResponseCode.PULL_NOT_FOUND
    assert header_of(at_zero) == {
        "suggestWhichBrokerId": 0, "nextBeginOffset": 0, "minOffset": 0, "maxOffset": 0,
    }
    elsewhere = ask(pull_request(5, queue_id=1))
    assert elsewhere.code == ResponseCode.PULL_OFFSET_MOVED
    assert header_of(elsewhere)["nextBeginOffset"] == 0


def test_offset_below_the_min_after_retention_is_moved_to_the_min(setup):
    # Small commit-log segments, so retention can delete the first ones.
    broker, ask = setup(store_overrides={"mapped_file_size_commit_log": 4096})
    for _ in range(12):
        put(broker, body=b"x" * 900)
    deleted = broker.store.run_retention(int(time.time() * 1000), disk_used_ratio=99.0)
    assert deleted >= 1
    min_offset = broker.store.min_offset(TOPIC, 0)
    assert min_offset > 0
    response = ask(pull_request(0))
    assert response.code == ResponseCode.PULL_OFFSET_MOVED
    assert header_of(response) == {
        "suggestWhichBrokerId": 0, "nextBeginOffset": min_offset, "minOffset": min_offset,
        "maxOffset": 12,
    }
    assert "OFFSET_TOO_SMALL" in response.remark
    from_min = ask(pull_request(min_offset))
    assert from_min.code == ResponseCode.SUCCESS
    assert next(iter_records(from_min.body)).queue_offset == min_offset


@pytest.mark.parametrize("store_kind", ["memory", "file"])
def test_a_suspended_pull_parks_exactly_where_a_plain_pull_is_not_found(setup, store_kind):
    # A suspended pull at the end of its queue is parked without reading the queue (the
    # read would say PULL_NOT_FOUND): everywhere else it is answered as a plain pull is, so
    # the two must agree on which offsets are "nothing new": the end of a written queue, 0
    # of an empty or never written one; not below the min (retention), not past the end.
    broker, ask = setup(store_kind=store_kind,
                        store_overrides={"mapped_file_size_commit_log": 4096})
    put(broker, queue_id=2)
    for _ in range(12):
        put(broker, body=b"x" * 900)
    assert broker.store.run_retention(int(time.time() * 1000), disk_used_ratio=99.0) >= 1
    min_offset = broker.store.min_offset(TOPIC, 0)
    assert 0 < min_offset < 12
    handler = broker.pull_processor.handle
    reads = [(0, offset) for offset in (0, min_offset - 1, min_offset, 11, 12, 13)]
    reads += [(1, 0), (1, 3), (2, 0), (2, 1), (2, 2)]

    plain = [ask(pull_request(offset, queue_id=queue_id)) for queue_id, offset in reads]

    async def main():
        peer = FakePeer("127.0.0.1:40001")
        for (queue_id, offset), answer in zip(reads, plain, strict=True):
            suspended = pull_request(offset, queue_id=queue_id,
                                     flags=PULL_FLAG_SUBSCRIPTION | PULL_FLAG_SUSPEND)
            parked_before = broker.pull_hold_service.parked_count
            suspended_answer = handler(suspended, peer)
            parked = broker.pull_hold_service.parked_count - parked_before
            where = f"queue {queue_id} offset {offset}: {answer.remark}"
            if answer.code == ResponseCode.PULL_NOT_FOUND:
                assert (suspended_answer, parked) == (None, 1), where
            else:
                assert parked == 0, where
                assert (suspended_answer.code, suspended_answer.remark,
                        suspended_answer.ext_fields, suspended_answer.body) == (
                    answer.code, answer.remark, answer.ext_fields, answer.body), where
        peer.is_closing = True  # the parked pulls are dropped, not answered, at the stop
        await broker.pull_hold_service.stop()

    asyncio.run(main())
    parks = [read for read, answer in zip(reads, plain, strict=True)
             if answer.code == ResponseCode.PULL_NOT_FOUND]
    assert parks == [(0, 12), (1, 0), (2, 1)]


def test_a_suspended_pull_that_parks_commits_its_offset_once(setup):
    broker, _ = setup()
    put(broker)
    request = pull_request(1, flags=PULL_FLAG_SUBSCRIPTION | PULL_FLAG_SUSPEND
                           | PULL_FLAG_COMMIT_OFFSET, commit_offset=1)

    async def main():
        peer = FakePeer("127.0.0.1:40001")
        assert broker.pull_processor.handle(request, peer) is None  # parked
        assert broker.pull_hold_service.parked_count == 1
        peer.is_closing = True  # dropped, not answered, at the stop
        await broker.pull_hold_service.stop()

    asyncio.run(main())
    assert broker.consumer_offset_manager.query_offset(GROUP, TOPIC, 0) == 1


# -- tag filtering ---------------------------------------------------------------------------------


def test_tag_subscription_returns_only_matching_messages(setup):
    broker, ask = setup()
    for tags in ("TagA", "TagB", "TagA", None, "TagC"):
        put(broker, tags)
    response = ask(pull_request(0, subscription="TagA"))
    assert response.code == ResponseCode.SUCCESS
    assert [m.tags for m in iter_records(response.body)] == ["TagA", "TagA"]
    assert header_of(response)["nextBeginOffset"] == 5
    both = ask(pull_request(0, subscription="TagC || TagB"))
    assert [m.tags for m in iter_records(both.body)] == ["TagB", "TagC"]
    everything = ask(pull_request(0, subscription="*"))
    assert len(list(iter_records(everything.body))) == 5


def test_tag_filter_skipping_every_entry_answers_retry_immediately_past_them(setup):
    broker, ask = setup()
    for tags in ("TagB", "TagB", "TagC"):
        put(broker, tags)
    response = ask(pull_request(0, subscription="TagA"))
    assert response.code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert not response.body
    assert header_of(response) == {
        "suggestWhichBrokerId": 0, "nextBeginOffset": 3, "minOffset": 0, "maxOffset": 3,
    }
    assert "NO_MATCHED_MESSAGE" in response.remark


# -- commit offset -------------------------------------------------------------------------------


def query_offset(ask, queue_id: int = 0, group: str = GROUP) -> RemotingCommand:
    return ask(RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, {
        "consumerGroup": group, "topic": TOPIC, "queueId": str(queue_id),
    }))


def test_commit_offset_flag_stores_the_consumers_offset(setup):
    broker, ask = setup()
    for _ in range(3):
        put(broker)
    ask(pull_request(2, flags=PULL_FLAG_SUBSCRIPTION | PULL_FLAG_COMMIT_OFFSET, commit_offset=2))
    assert query_offset(ask).ext_fields["offset"] == "2"
    # Without the flag the header's commitOffset is not stored.
    ask(pull_request(3, commit_offset=3))
    assert query_offset(ask).ext_fields["offset"] == "2"
    assert broker.consumer_offset_manager.query_offset(GROUP, TOPIC, 0) == 2


def test_slave_serves_pulls_suggests_the_master_and_stores_no_offset(setup):
    # RocketMQ 4.9: a slave answers what it has whatever slaveReadEnable says (a consumer
    # whose master is gone reads on from it); without slaveReadEnable it points back to 0.
    broker, ask = setup(broker_role="SLAVE", broker_id=1)
    put(broker)
    response = ask(pull_request(0, flags=PULL_FLAG_SUBSCRIPTION | PULL_FLAG_COMMIT_OFFSET,
                                commit_offset=1))
    assert response.code == ResponseCode.SUCCESS
    assert header_of(response)["suggestWhichBrokerId"] == 0
    assert [r.body for r in iter_records(response.body)] == [b"hello"]
    assert broker.consumer_offset_manager.query_offset(GROUP, TOPIC, 0) is None


def test_slave_does_not_move_a_consumer_past_what_it_has_not_copied_yet(setup):
    broker, ask = setup(broker_role="SLAVE", broker_id=1)
    put(broker)
    response = ask(pull_request(5, flags=PULL_FLAG_SUBSCRIPTION))
    assert response.code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert header_of(response)["nextBeginOffset"] == 5


def test_suggestion_with_slave_read_follows_the_group_and_the_memory_ratio(setup):
    broker, ask = setup(slave_read_enable=True)
    for _ in range(3):
        put(broker)
    broker.subscription_group_manager.update_subscription_group_config(
        SubscriptionGroupConfig(GROUP, broker_id=2, which_broker_when_consume_slowly=3))
    in_memory = ask(pull_request(0, flags=PULL_FLAG_SUBSCRIPTION))
    assert in_memory.code == ResponseCode.SUCCESS
    assert header_of(in_memory)["suggestWhichBrokerId"] == 2
    # Ratio 0: any data behind the log's end counts as no longer in memory.
    slow, ask_slow = setup(slave_read_enable=True, access_message_in_memory_max_ratio=0)
    for _ in range(3):
        put(slow)
    behind = ask_slow(pull_request(0, max_msg_nums=1, flags=PULL_FLAG_SUBSCRIPTION))
    assert behind.code == ResponseCode.SUCCESS
    assert header_of(behind)["suggestWhichBrokerId"] == 1  # whichBrokerWhenConsumeSlowly


def test_without_slave_read_the_master_always_suggests_itself(setup):
    broker, ask = setup(access_message_in_memory_max_ratio=0)
    for _ in range(3):
        put(broker)
    response = ask(pull_request(0, max_msg_nums=1, flags=PULL_FLAG_SUBSCRIPTION))
    assert header_of(response)["suggestWhichBrokerId"] == 0


# -- pre-checks, in RocketMQ's order ---------------------------------------------------------------


def test_missing_header_field_is_system_error_naming_it(setup):
    _, ask = setup()
    request = pull_request(0)
    del request.ext_fields["queueOffset"]
    response = ask(request)
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "queueOffset" in response.remark
    request = pull_request(0)
    request.ext_fields["maxMsgNums"] = "lots"
    response = ask(request)
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "maxMsgNums" in response.remark and "lots" in response.remark


def test_unreadable_broker_refuses_pulls(setup):
    _, ask = setup(broker_permission=2)
    response = ask(pull_request(0))
    assert response.code == ResponseCode.NO_PERMISSION
    assert "brokerPermission" in response.remark


def test_unknown_group_without_auto_create_is_refused(setup):
    _, ask = setup(auto_create_subscription_group=False)
    response = ask(pull_request(0))
    assert response.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    assert GROUP in response.remark and "autoCreateSubscriptionGroup" in response.remark


def test_group_auto_created_on_first_pull(setup):
    broker, ask = setup()
    assert broker.subscription_group_manager.get(GROUP) is None
    ask(pull_request(0))
    assert broker.subscription_group_manager.get(GROUP) == SubscriptionGroupConfig(GROUP)


def test_group_with_consume_disabled_is_refused(setup):
    broker, ask = setup()
    broker.subscription_group_manager.update_subscription_group_config(
        SubscriptionGroupConfig(GROUP, consume_enable=False)
    )
    response = ask(pull_request(0))
    assert response.code == ResponseCode.NO_PERMISSION
    assert GROUP in response.remark and "consumeEnable" in response.remark


def test_unknown_topic_is_topic_not_exist(setup):
    _, ask = setup()
    response = ask(pull_request(0, topic="NoSuchTopic"))
    assert response.code == ResponseCode.TOPIC_NOT_EXIST
    assert "NoSuchTopic" in response.remark


def test_unreadable_topic_is_refused(setup):
    broker, ask = setup()
    broker.topic_config_manager.update(TopicConfig("WriteOnly", 4, 4, perm=2))
    response = ask(pull_request(0, topic="WriteOnly"))
    assert response.code == ResponseCode.NO_PERMISSION
    assert "WriteOnly" in response.remark


def test_queue_id_outside_read_queues_is_system_error(setup):
    _, ask = setup()
    for queue_id in (4, -1):
        response = ask(pull_request(0, queue_id=queue_id))
        assert response.code == ResponseCode.SYSTEM_ERROR
        assert f"queueId {queue_id}" in response.remark and "4 read queues" in response.remark


def test_pull_without_subscription_flag_needs_a_heartbeat(setup):
    _, ask = setup()
    response = ask(pull_request(0, flags=0, subscription=None))
    assert response.code == ResponseCode.SUBSCRIPTION_NOT_EXIST
    assert GROUP in response.remark and "HEART_BEAT" in response.remark


def heartbeat(ask, *, topic: str = TOPIC, sub_string: str = "*", sub_version: int = 100,
              message_model: str = "CLUSTERING"):
    body = orjson.dumps({
        "clientID": "127.0.0.1@1",
        "consumerDataSet": [{
            "groupName": GROUP, "consumeType": "CONSUME_PASSIVELY",
            "messageModel": message_model, "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
            "subscriptionDataSet": [
                {"topic": topic, "subString": sub_string, "subVersion": sub_version}
            ],
        }],
        "producerDataSet": [],
    })
    response = ask(RemotingCommand.request(RequestCode.HEART_BEAT, body=body))
    assert response.code == ResponseCode.SUCCESS, response.remark


def test_pull_of_a_topic_the_group_does_not_subscribe_is_refused(setup):
    _, ask = setup()
    heartbeat(ask, topic="OtherTopic")
    response = ask(pull_request(0, flags=0, subscription=None))
    assert response.code == ResponseCode.SUBSCRIPTION_NOT_EXIST
    assert TOPIC in response.remark


def test_pull_newer_than_the_heartbeat_subscription_is_not_latest(setup):
    _, ask = setup()
    heartbeat(ask, sub_version=100)
    response = ask(pull_request(0, flags=0, subscription=None, sub_version=200))
    assert response.code == ResponseCode.SUBSCRIPTION_NOT_LATEST
    assert "100" in response.remark and "200" in response.remark


def test_pull_uses_the_heartbeat_subscription_without_the_flag(setup):
    broker, ask = setup()
    for tags in ("TagA", "TagB", "TagA"):
        put(broker, tags)
    heartbeat(ask, sub_string="TagB", sub_version=100)
    response = ask(pull_request(0, flags=0, subscription=None, sub_version=100))
    assert response.code == ResponseCode.SUCCESS
    assert [m.tags for m in iter_records(response.body)] == ["TagB"]


def test_broadcasting_group_is_refused_when_the_group_forbids_it(setup):
    broker, ask = setup()
    broker.subscription_group_manager.update_subscription_group_config(
        SubscriptionGroupConfig(GROUP, consume_broadcast_enable=False)
    )
    heartbeat(ask, message_model="BROADCASTING")
    response = ask(pull_request(0, flags=0, subscription=None, sub_version=100))
    assert response.code == ResponseCode.NO_PERMISSION
    assert "broadcast" in response.remark and GROUP in response.remark


def test_sql92_subscription_is_refused_while_property_filter_is_off(setup):
    _, ask = setup()
    response = ask(pull_request(0, subscription="a > 1", expression_type="SQL92"))
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert response.remark == "SQL92 filter is not enabled (set enablePropertyFilter=true)"


def test_unknown_expression_type_is_a_parse_failure(setup):
    _, ask = setup()
    response = ask(pull_request(0, subscription="x", expression_type="REGEX"))
    assert response.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert "REGEX" in response.remark


def test_suspended_pull_over_the_parking_limit_is_system_busy(setup):
    broker, ask = setup()
    broker.pull_hold_service.parked_max = 0
    response = ask(pull_request(0, flags=PULL_FLAG_SUBSCRIPTION | PULL_FLAG_SUSPEND))
    assert response.code == ResponseCode.SYSTEM_BUSY
    assert response.remark.startswith("[REJECTREQUEST]system busy")
