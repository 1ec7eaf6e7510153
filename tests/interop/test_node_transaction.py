"""Half messages from a third-party client: ali-ons 3.12.0 (npm, a pure JavaScript
implementation of the 4.x protocol) against real tidemq name server and broker processes.

ali-ons's only transactional capability is the prepared send: a message with property
TRAN_MSG=true goes out with the prepared sysflag. It has no END_TRANSACTION and does not
answer CHECK_TRANSACTION_STATE, so the test ends the halves itself, with END_TRANSACTION
requests built from ali-ons's send results (offset msg id and half-queue offset), as a
RocketMQ producer does. The broker must keep every half out of the topic until it is
committed, never show a rolled-back one, and discard the ones nobody ends after its checks.
"""

from __future__ import annotations

import time

import pytest
from test_node_clients import expected_bodies
from tidemq_side import create_topic, read_back

from tidemq.client.errors import NoRouteError
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import EndTransactionRequestHeader
from tidemq.protocol.message import TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE
from tidemq.protocol.msgid import decode_offset_msg_id

pytestmark = pytest.mark.interop

FAST_CHECKS = {"transactionTimeOut": "1000", "transactionCheckInterval": "1000",
               "transactionCheckMax": "2"}
GROUP = "ons_tx_producer"
DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
WAIT_BOUND_S = 60.0


def wait_for_bodies(namesrv: str, topic: str, wanted: list[str]) -> list[str]:
    """The bodies stored in ``topic`` once they are ``wanted`` (bounded wait)."""
    deadline = time.monotonic() + WAIT_BOUND_S
    while True:
        try:
            found = sorted(m.body.decode() for m in read_back(namesrv, topic))
        except NoRouteError:
            found = []  # the discard topic is made with the first discarded half
        if found == wanted or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_ons_halves_stay_hidden_until_committed_and_are_discarded_when_nobody_ends_them(
        tidemq_cluster, node_client, remoting_call):
    cluster = tidemq_cluster(broker_overrides=FAST_CHECKS)
    namesrv = cluster.namesrv_addr
    topic = "OnsTxOrders"
    create_topic(cluster, topic)

    result = node_client("ons", "tx-producer", "half", "--namesrv", namesrv, "--topic", topic,
                         "--count", "9", "--group", GROUP).result()
    sends = result["sends"]
    assert [send["status"] for send in sends] == ["SEND_OK"] * 9
    assert read_back(namesrv, topic) == []  # halves: nothing a consumer can see

    broker = cluster.broker("broker-a").addr
    for send in sends[:6]:  # msg-0..2 committed, msg-3..5 rolled back, msg-6..8 left open
        _, commit_log_offset = decode_offset_msg_id(send["msg_id"])
        header = EndTransactionRequestHeader(
            producer_group=GROUP, tran_state_table_offset=send["offset"],
            commit_log_offset=commit_log_offset,
            commit_or_rollback=(TRANSACTION_COMMIT_TYPE if send["index"] < 3
                                else TRANSACTION_ROLLBACK_TYPE),
            from_transaction_check=False, msg_id=send["msg_id"], transaction_id=send["msg_id"],
        )
        answer = remoting_call(broker, RemotingCommand.request(
            RequestCode.END_TRANSACTION, header.to_ext_fields()))
        assert answer.code == ResponseCode.SUCCESS, answer.remark

    assert wait_for_bodies(namesrv, topic, expected_bodies(range(3))) == expected_bodies(
        range(3))
    # ali-ons's producer is gone: after two unanswered checks the open ones are discarded.
    assert wait_for_bodies(namesrv, DISCARD_TOPIC, expected_bodies(range(6, 9))) == (
        expected_bodies(range(6, 9)))
    committed = {m.body.decode(): m for m in read_back(namesrv, topic)}
    for send in sends[:3]:
        message = committed[f"msg-{send['index']}"]
        assert (message.tags, message.keys) == ("TagTx", [f"key-{send['index']}"])
        assert message.transaction_type == TRANSACTION_COMMIT_TYPE
        assert "REAL_TOPIC" not in message.properties
    assert sorted(committed) == expected_bodies(range(3))  # nothing rolled back shows up
