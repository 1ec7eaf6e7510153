"""Transactional messages seen by a third-party RocketMQ consumer (PyPI ``rocketmq`` 0.4.4,
the Apache C++ client 1.x), against real tidemq name server and broker processes.

tidemq's TransactionProducer commits some transactions, rolls others back, leaves some to
the broker's check, and leaves one open for good; the C++ push consumer, subscribed to the
topic throughout, must receive exactly the committed messages, each once, with the
producer's message ids, and never a half or a rolled-back one.

The 0.4.4 binding exposes no transactional producer (its C API has none, only the C++ class
behind it), so the third-party side here is the consumer; a third-party client's half
messages are in test_node_transaction.py (ali-ons), and the rest of the producer side of the
wire is covered by tidemq's own client and the broker's unit tests of END_TRANSACTION and
CHECK_TRANSACTION_STATE.
"""

from __future__ import annotations

import asyncio
import collections

import pytest
from tidemq_side import create_topic

from tidemq.client import Message
from tidemq.client.transaction_producer import TransactionProducer, TransactionState

pytestmark = pytest.mark.interop

RECEIVE_WAIT_S = 60.0  # the checked transactions need transactionTimeOut (6 s) and a round


def test_cpp_consumer_gets_committed_transactions_once_and_nothing_else(
        tidemq_cluster, cpp_client, tmp_path):
    cluster = tidemq_cluster()
    namesrv = cluster.namesrv_addr
    topic = "CppTxOrders"
    create_topic(cluster, topic)
    stop_file = tmp_path / "stop"
    consumer = cpp_client("tx-consumer", "consume", "--namesrv", namesrv, "--topic", topic,
                          "--group", "cpp_tx_group", "--stop-file", str(stop_file),
                          timeout_s=120)
    consumer.wait_for_output("CONSUMER STARTED")

    decisions = {
        **{f"commit-{i}": TransactionState.COMMIT for i in range(12)},
        **{f"rollback-{i}": TransactionState.ROLLBACK for i in range(8)},
        # Left undecided: the broker asks the producer (after transactionTimeOut, 6 s).
        **{f"checked-commit-{i}": TransactionState.UNKNOWN for i in range(3)},
        **{f"checked-rollback-{i}": TransactionState.UNKNOWN for i in range(3)},
    }

    def check(message) -> TransactionState:
        body = message.body.decode()
        return (TransactionState.COMMIT if body.startswith("checked-commit")
                else TransactionState.ROLLBACK)

    async def produce() -> dict[str, str]:
        ids: dict[str, str] = {}
        async with TransactionProducer("cpp-tx-producer", namesrv, check=check) as producer:
            for body, state in decisions.items():
                result = await producer.send_in_transaction(
                    Message(topic, body.encode(), tags="tx", keys=[body]),
                    lambda message, state=state: state)
                ids[body] = result.msg_id
            # One more half the producer never ends (the check later rolls it back).
            await producer.send_half(Message(topic, b"never-ended"))
            # The producer stays open (its loop free) to answer the broker's checks.
            expected = str(sum(b.startswith(("commit", "checked-commit")) for b in decisions))
            for _ in range(int(RECEIVE_WAIT_S / 0.1)):
                if consumer.last_output("RECEIVED") == expected:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"the C++ consumer did not receive {expected} messages "
                                     f"within {RECEIVE_WAIT_S} s")
        return ids

    ids = asyncio.run(produce())
    stop_file.touch()
    received = consumer.result()["received"]

    committed = sorted(b for b in decisions if b.startswith(("commit", "checked-commit")))
    counts = collections.Counter(record["body"] for record in received)
    assert sorted(counts) == committed
    assert all(count == 1 for count in counts.values()), counts
    for record in received:
        assert record["topic"] == topic and record["tags"] == "tx"
        assert record["keys"] == record["body"]
        assert record["msg_id"] == ids[record["body"]]  # the producer's UNIQ_KEY
