"""CONSUMER_SEND_MSG_BACK: retry copies, dead letters, and agreement with the send path.

Messages are sent through the broker's own SEND handler, sent back by their commit-log offset
(taken from the offset msg id the send answered), and looked for in the store: in
SCHEDULE_TOPIC_XXXX while they wait, in ``%RETRY%<group>`` once the (fake) clock says they are
due, or in ``%DLQ%<group>``.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tidemq.broker.config import PERM_READ
from tidemq.broker.namesrv_registration import NameServerRegistration
from tidemq.broker.schedule_service import PROPERTY_DELAY_QUEUE_OFFSET
from tidemq.broker.topic_config_manager import TopicConfig
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import ConsumerSendMsgBackRequestHeader, SendMessageRequestHeader
from tidemq.protocol.message import decode_records, encode_properties
from tidemq.protocol.msgid import decode_offset_msg_id
from tidemq.store.config import SCHEDULE_TOPIC
from tidemq.store.config_tables import SubscriptionGroupConfig

GROUP = "cg"
RETRY = f"%RETRY%{GROUP}"
DLQ = f"%DLQ%{GROUP}"
PRODUCER_ADDRESS = "127.0.0.1:45678"
CONSUMER_ADDRESS = "127.0.0.1:46000"
# The default levels: level 3 is 10 s, so a first retry is due 10 s after it is stored.
LEVEL_3_MS = 10_000


def send_request(topic: str, *, reconsume_times: int | None = None,
                 max_reconsume_times: int | None = None,
                 extra: dict[str, str] | None = None) -> RemotingCommand:
    properties = {"TAGS": "TagA", "KEYS": "order-1", "WAIT": "true", **(extra or {})}
    header = SendMessageRequestHeader(
        producer_group="pg", topic=topic, default_topic="TBW102", default_topic_queue_nums=4,
        queue_id=0, sys_flag=0, born_timestamp=1_700_000_000_123, flag=5,
        properties=encode_properties(properties), reconsume_times=reconsume_times,
        max_reconsume_times=max_reconsume_times,
    )
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header.to_ext_fields(),
                                   b"payload")


def send_back_request(offset: int, *, delay_level: int = 0, group: str = GROUP,
                      max_reconsume_times: int | None = None, version: int | None = None,
                      origin_msg_id: str | None = None) -> RemotingCommand:
    header = ConsumerSendMsgBackRequestHeader(
        offset=offset, group=group, delay_level=delay_level, origin_msg_id=origin_msg_id,
        max_reconsume_times=max_reconsume_times,
    )
    request = RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, header.to_ext_fields())
    if version is not None:
        request.version = version
    return request


def call(broker, handlers, request: RemotingCommand, peer: str = CONSUMER_ADDRESS):
    return asyncio.run(handlers(broker).ask(request, peer_address=peer))


def send(broker, handlers, topic: str = "Orders", **options) -> int:
    """Send one message; return its commit-log offset."""
    response = call(broker, handlers, send_request(topic, **options), PRODUCER_ADDRESS)
    assert response.code == ResponseCode.SUCCESS, response.remark
    return decode_offset_msg_id(response.ext_fields["msgId"])[1]


def stored(broker, topic: str, queue_id: int = 0):
    result = broker.store.get_messages(topic, queue_id, 0, 100, 64 * 1024 * 1024)
    return decode_records(result.body)


def deliver_all_due(broker, after_ms: int) -> None:
    now_ms = time.time_ns() // 1_000_000 + after_ms
    broker.schedule_service.clock_ms = lambda: now_ms
    for level in range(1, broker.schedule_service.level_count + 1):
        broker.schedule_service.deliver_due(level)


@pytest.fixture
def broker(make_broker):
    broker = make_broker()
    broker.topic_config_manager.update(TopicConfig("Orders", 1, 1))
    return broker


def test_send_back_stores_a_delayed_retry_copy_with_its_origin(broker, handlers):
    offset = send(broker, handlers)
    (original,) = stored(broker, "Orders")
    response = call(broker, handlers, send_back_request(offset))
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert not response.ext_fields

    assert broker.topic_config_manager.get(RETRY) == TopicConfig(RETRY, 1, 1, perm=6)
    assert stored(broker, RETRY) == [], "the first retry waits at delay level 3"
    (waiting,) = stored(broker, SCHEDULE_TOPIC, 2)
    assert waiting.properties["REAL_TOPIC"] == RETRY
    assert waiting.properties["DELAY"] == "3"

    deliver_all_due(broker, LEVEL_3_MS)
    (retry,) = stored(broker, RETRY)
    assert retry.reconsume_times == 1
    assert retry.properties["RETRY_TOPIC"] == "Orders"
    assert retry.properties["ORIGIN_MESSAGE_ID"] == original.unique_key
    assert retry.unique_key == original.unique_key
    assert retry.body == b"payload" and retry.flag == 5 and retry.tags == "TagA"
    assert retry.keys == ["order-1"]
    assert retry.born_timestamp == original.born_timestamp == 1_700_000_000_123
    assert retry.born_host == PRODUCER_ADDRESS
    assert retry.store_host == broker.store_config.store_host
    assert "WAIT" not in retry.properties


def test_retry_of_a_retry_keeps_its_origin_and_waits_longer(broker, handlers):
    offset = send(broker, handlers)
    (original,) = stored(broker, "Orders")
    call(broker, handlers, send_back_request(offset))
    deliver_all_due(broker, LEVEL_3_MS)
    (first_retry,) = stored(broker, RETRY)
    assert PROPERTY_DELAY_QUEUE_OFFSET in first_retry.properties

    response = call(broker, handlers, send_back_request(first_retry.physical_offset))
    assert response.code == ResponseCode.SUCCESS, response.remark
    (waiting,) = stored(broker, SCHEDULE_TOPIC, 3)
    assert waiting.properties["DELAY"] == "4", "3 + reconsume times 1"
    assert PROPERTY_DELAY_QUEUE_OFFSET not in waiting.properties
    deliver_all_due(broker, 3_600_000)
    second_retry = stored(broker, RETRY)[1]
    assert second_retry.reconsume_times == 2
    assert second_retry.properties["RETRY_TOPIC"] == "Orders"
    assert second_retry.properties["ORIGIN_MESSAGE_ID"] == original.unique_key


def test_delay_level_chosen_by_the_consumer_is_used(broker, handlers):
    offset = send(broker, handlers)
    call(broker, handlers, send_back_request(offset, delay_level=5))
    (waiting,) = stored(broker, SCHEDULE_TOPIC, 4)
    assert waiting.properties["DELAY"] == "5"


def test_delay_level_minus_one_goes_straight_to_the_dead_letter_queue(broker, handlers):
    offset = send(broker, handlers)
    response = call(broker, handlers, send_back_request(offset, delay_level=-1))
    assert response.code == ResponseCode.SUCCESS, response.remark
    (dead,) = stored(broker, DLQ)
    assert dead.reconsume_times == 1
    assert dead.properties["RETRY_TOPIC"] == "Orders"
    assert "DELAY" not in dead.properties
    assert broker.topic_config_manager.get(DLQ) == TopicConfig(DLQ, 1, 1, perm=6)
    assert broker.topic_config_manager.get(DLQ).perm & PERM_READ, "readable for a redrive"
    assert stored(broker, RETRY) == []


def test_the_topics_a_send_back_creates_are_registered_before_its_answer(
        make_broker, handlers, monkeypatch):
    """As Apache's broker does: once the answer is out, the name servers route the new
    dead-letter (and retry) topic, so an operator's or a redrive's route lookup finds it."""
    registered: list[list[str]] = []

    async def register_topics(self, topics):
        await asyncio.sleep(0)  # a round trip to the name servers: the answer waits for it
        registered.append(sorted(topics))
        return {}

    monkeypatch.setattr(NameServerRegistration, "register_topics", register_topics)
    broker = make_broker()
    broker.topic_config_manager.update(TopicConfig("Orders", 1, 1))
    offset = send(broker, handlers)
    response = call(broker, handlers, send_back_request(offset, delay_level=-1))
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert registered == [[DLQ, RETRY]]
    # Topics that exist already are not registered again by a send-back.
    response = call(broker, handlers, send_back_request(offset, delay_level=-1))
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert registered == [[DLQ, RETRY]]
    assert len(stored(broker, DLQ)) == 2


def test_a_message_past_its_retries_goes_to_the_dead_letter_queue(broker, handlers):
    last_retry = send(broker, handlers, RETRY, reconsume_times=16)
    (retry,) = stored(broker, RETRY)
    assert retry.reconsume_times == 16
    response = call(broker, handlers, send_back_request(last_retry))
    assert response.code == ResponseCode.SUCCESS, response.remark
    (dead,) = stored(broker, DLQ)
    assert dead.reconsume_times == 17
    assert all(stored(broker, SCHEDULE_TOPIC, q) == [] for q in range(18))


def test_a_message_with_a_retry_left_is_retried(broker, handlers):
    offset = send(broker, handlers, RETRY, reconsume_times=15)
    call(broker, handlers, send_back_request(offset))
    assert stored(broker, DLQ) == []
    (waiting,) = stored(broker, SCHEDULE_TOPIC, 17)
    assert waiting.reconsume_times == 16
    assert waiting.properties["DELAY"] == "18", "3 + 15, the last level"


@pytest.mark.parametrize(("version", "dead"), [(121, True), (120, False)])
def test_header_max_reconsume_times_counts_from_version_v3_4_9(broker, handlers, version, dead):
    offset = send(broker, handlers, RETRY, reconsume_times=2)
    request = send_back_request(offset, max_reconsume_times=2, version=version)
    assert call(broker, handlers, request).code == ResponseCode.SUCCESS
    assert bool(stored(broker, DLQ)) is dead


def test_the_group_retry_max_times_is_the_limit_without_a_header(broker, handlers):
    broker.subscription_group_manager.update_subscription_group_config(
        SubscriptionGroupConfig(GROUP, retry_max_times=1)
    )
    offset = send(broker, handlers, RETRY, reconsume_times=1)
    call(broker, handlers, send_back_request(offset))
    assert len(stored(broker, DLQ)) == 1


def test_the_message_max_reconsume_times_property_is_the_limit(broker, handlers):
    offset = send(broker, handlers, "Orders", extra={"MAX_RECONSUME_TIMES": "0"})
    call(broker, handlers, send_back_request(offset))
    assert len(stored(broker, DLQ)) == 1


def test_retry_queue_nums_of_the_group_sizes_the_retry_topic(broker, handlers):
    broker.subscription_group_manager.update_subscription_group_config(
        SubscriptionGroupConfig(GROUP, retry_queue_nums=3)
    )
    offsets = [send(broker, handlers) for _ in range(12)]
    for offset in offsets:
        call(broker, handlers, send_back_request(offset))
    assert broker.topic_config_manager.get(RETRY).write_queue_nums == 3
    deliver_all_due(broker, LEVEL_3_MS)
    per_queue = [len(stored(broker, RETRY, queue_id)) for queue_id in range(4)]
    assert sum(per_queue) == 12 and per_queue[3] == 0


def test_both_paths_send_the_same_reconsume_counts_to_the_dead_letter_queue(make_broker,
                                                                           handlers):
    # The Java consumer re-sends a message to %RETRY% itself (reconsume times + 1) when the
    # send-back fails: whatever the count, both paths must pick the same topic.
    for reconsume_times in range(14, 19):
        back = make_broker()
        offset = send(back, handlers, RETRY, reconsume_times=reconsume_times)
        call(back, handlers, send_back_request(offset, max_reconsume_times=16))
        fallback = make_broker()
        send(fallback, handlers, RETRY, reconsume_times=reconsume_times + 1,
             max_reconsume_times=16)
        assert bool(stored(back, DLQ)) == bool(stored(fallback, DLQ)), reconsume_times
        assert bool(stored(back, DLQ)) == (reconsume_times >= 16)


def test_a_dead_letter_sent_on_the_send_path_is_not_delayed(broker, handlers):
    send(broker, handlers, RETRY, reconsume_times=17, extra={"DELAY": "5"})
    (dead,) = stored(broker, DLQ)
    assert "DELAY" not in dead.properties


def test_a_retry_sent_on_the_send_path_waits_for_its_delay(broker, handlers):
    send(broker, handlers, RETRY, reconsume_times=2, extra={"DELAY": "5"})
    assert stored(broker, RETRY) == []
    (waiting,) = stored(broker, SCHEDULE_TOPIC, 4)
    assert waiting.properties["REAL_TOPIC"] == RETRY


# -- refusals -----------------------------------------------------------------------------------


def test_no_message_at_the_offset_is_refused_naming_it(broker, handlers):
    offset = send(broker, handlers)
    response = call(broker, handlers, send_back_request(offset + 3))
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert f"offset {offset + 3}" in response.remark
    assert stored(broker, DLQ) == [] and stored(broker, RETRY) == []


def test_unknown_group_without_auto_creation_is_refused(make_broker, handlers):
    broker = make_broker(auto_create_subscription_group=False)
    broker.topic_config_manager.update(TopicConfig("Orders", 1, 1))
    offset = send(broker, handlers)
    response = call(broker, handlers, send_back_request(offset, group="nobody"))
    assert response.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    assert "nobody" in response.remark and "updateSubGroup" in response.remark


def test_a_missing_header_field_is_named(broker, handlers):
    request = RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK,
                                      {"group": GROUP, "delayLevel": "0"})
    response = call(broker, handlers, request)
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "offset" in response.remark


def test_a_read_only_broker_refuses_send_backs(make_broker, handlers):
    broker = make_broker()
    broker.topic_config_manager.update(TopicConfig("Orders", 1, 1))
    offset = send(broker, handlers)
    broker.config.broker_permission = PERM_READ
    response = call(broker, handlers, send_back_request(offset))
    assert response.code == ResponseCode.NO_PERMISSION
    assert "brokerPermission" in response.remark


def test_a_retry_topic_without_write_permission_is_refused(broker, handlers):
    broker.topic_config_manager.update(TopicConfig(RETRY, 1, 1, perm=PERM_READ))
    offset = send(broker, handlers)
    response = call(broker, handlers, send_back_request(offset))
    assert response.code == ResponseCode.NO_PERMISSION
    assert RETRY in response.remark


def test_a_group_without_retry_queues_drops_the_message(broker, handlers):
    broker.subscription_group_manager.update_subscription_group_config(
        SubscriptionGroupConfig(GROUP, retry_queue_nums=0)
    )
    offset = send(broker, handlers)
    assert call(broker, handlers, send_back_request(offset)).code == ResponseCode.SUCCESS
    assert broker.topic_config_manager.get(RETRY) is None
    assert all(stored(broker, SCHEDULE_TOPIC, q) == [] for q in range(18))
