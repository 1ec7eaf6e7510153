"""A slave serves every read and refuses every write a master would take (issue 11 item 3,
RocketMQ 4.9's rules: consumer offsets may be committed to a slave, messages may not)."""

from __future__ import annotations

import asyncio
import time

from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.message import iter_records
from tidemq.store.config_tables import TopicConfig
from tidemq.store.interface import StoreMessage

TOPIC = "Orders"
GROUP = "cg_slave"


def slave_with_a_message(make_broker, handlers):
    slave = make_broker(broker_role="SLAVE", broker_id=1)
    slave.topic_config_manager.update(TopicConfig(TOPIC, 4, 4))
    # Stands for a record the HA stream copied from the master.
    result = slave.store.put_message(StoreMessage(
        TOPIC, 0, b"copied", {"KEYS": "order-7", "UNIQ_KEY": "u-7"},
        born_timestamp=int(time.time() * 1000), born_host="127.0.0.1:50000"))
    assert result.ok
    table = handlers(slave)
    return slave, result, lambda request: asyncio.run(table.ask(request))


def request(code: int, **fields: object) -> RemotingCommand:
    return RemotingCommand.request(code, {k: str(v) for k, v in fields.items()})


def test_a_slave_serves_queries_by_key_and_id_and_queue_offsets(make_broker, handlers):
    _, stored, ask = slave_with_a_message(make_broker, handlers)
    now = int(time.time() * 1000)
    by_key = ask(request(RequestCode.QUERY_MESSAGE, topic=TOPIC, key="order-7", maxNum=8,
                         beginTimestamp=0, endTimestamp=now + 60_000))
    assert by_key.code == ResponseCode.SUCCESS
    assert [r.body for r in iter_records(by_key.body)] == [b"copied"]
    by_id = ask(request(RequestCode.VIEW_MESSAGE_BY_ID, offset=stored.physical_offset))
    assert by_id.code == ResponseCode.SUCCESS and b"copied" in by_id.body
    max_offset = ask(request(RequestCode.GET_MAX_OFFSET, topic=TOPIC, queueId=0))
    assert max_offset.ext_fields["offset"] == "1"
    searched = ask(request(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, topic=TOPIC, queueId=0,
                           timestamp=stored.store_timestamp))
    assert searched.code == ResponseCode.SUCCESS and searched.ext_fields["offset"] == "0"


def test_a_slave_takes_consumer_offsets_as_rocketmq_does(make_broker, handlers):
    slave, _, ask = slave_with_a_message(make_broker, handlers)
    update = ask(request(RequestCode.UPDATE_CONSUMER_OFFSET, consumerGroup=GROUP, topic=TOPIC,
                         queueId=0, commitOffset=1))
    assert update.code == ResponseCode.SUCCESS
    query = ask(request(RequestCode.QUERY_CONSUMER_OFFSET, consumerGroup=GROUP, topic=TOPIC,
                        queueId=0))
    assert query.ext_fields["offset"] == "1"
    assert slave.consumer_offset_manager.local_commits == {(GROUP, TOPIC, 0): 1}


def test_a_slave_refuses_every_write_of_messages_and_topics(make_broker, handlers):
    slave, stored, ask = slave_with_a_message(make_broker, handlers)
    send = ask(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
        "a": "pg", "b": TOPIC, "c": "TBW102", "d": "4", "e": "0", "f": "0",
        "g": str(int(time.time() * 1000)), "h": "0", "i": "", "j": "0", "k": "false",
    }, b"x"))
    assert send.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "slave" in send.remark and "master" in send.remark and TOPIC in send.remark
    back = ask(request(RequestCode.CONSUMER_SEND_MSG_BACK, offset=stored.physical_offset,
                       group=GROUP, delayLevel=0, originMsgId="x", originTopic=TOPIC,
                       unitMode="false", maxReconsumeTimes=16))
    assert back.code == ResponseCode.SERVICE_NOT_AVAILABLE and "slave" in back.remark
    end = ask(request(RequestCode.END_TRANSACTION, producerGroup="pg", tranStateTableOffset=0,
                      commitLogOffset=stored.physical_offset, commitOrRollback=8,
                      fromTransactionCheck="false", msgId="x"))
    assert end.code == ResponseCode.SLAVE_NOT_AVAILABLE
    create = ask(request(RequestCode.UPDATE_AND_CREATE_TOPIC, topic="New", defaultTopic="TBW102",
                         readQueueNums=4, writeQueueNums=4, perm=6, topicFilterType="SINGLE_TAG",
                         topicSysFlag=0, order="false"))
    assert create.code == ResponseCode.SYSTEM_ERROR and "slave" in create.remark
    assert slave.store.max_offset(TOPIC, 0) == 1  # nothing was stored
