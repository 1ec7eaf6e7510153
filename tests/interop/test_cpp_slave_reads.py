"""The Apache C++ client 1.x (PyPI ``rocketmq``) consumes from a slave while its master is
SIGKILLed (issue 11 item 3), and what it commits there reaches the master when it returns
(item 4): a third-party consumer needs nothing of tidemq's own client for either.
"""

from __future__ import annotations

import pytest
from test_cpp_client import assert_numbered_received_once, numbered_messages
from tidemq_side import create_topic, produce

from replication_group import start_group, wait_caught_up
from server_processes import remoting_call, wait_until
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand

pytestmark = pytest.mark.interop

TOPIC = "CppSlaveReads"
GROUP = "cpp_slave_reads"
COUNT = 100
QUEUES = 4
WAIT_S = 120.0


def committed(addr: str) -> list[int | None]:
    offsets: list[int | None] = []
    for queue_id in range(QUEUES):
        response = remoting_call(addr, RemotingCommand.request(
            RequestCode.QUERY_CONSUMER_OFFSET,
            {"consumerGroup": GROUP, "topic": TOPIC, "queueId": str(queue_id)}))
        offsets.append(int(response.ext_fields["offset"])
                       if response.code == ResponseCode.SUCCESS else None)
    return offsets


def queue_ends(addr: str) -> list[int]:
    return [int(remoting_call(addr, RemotingCommand.request(
        RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": str(q)})).ext_fields["offset"])
        for q in range(QUEUES)]


def test_cpp_consumer_reads_from_the_slave_while_the_master_is_down(tidemq_cluster,
                                                                     cpp_client):
    cluster, master, slave = start_group(tidemq_cluster)
    create_topic(cluster, TOPIC, QUEUES)
    produce(cluster.namesrv_addr, numbered_messages(TOPIC, COUNT))
    wait_caught_up(master, slave)
    wait_until(lambda: TOPIC.encode() in (remoting_call(slave.addr, RemotingCommand.request(
        RequestCode.GET_ALL_TOPIC_CONFIG)).body or b""), WAIT_S, 0.2, "the slave's topic copy")
    master.kill()  # SIGKILL: the name server drops it, the route names only the slave
    consumer = cpp_client("slave-reader", "consume", "--namesrv", cluster.namesrv_addr,
                          "--topic", TOPIC, "--group", GROUP, "--expect", str(COUNT),
                          timeout_s=WAIT_S)
    received = consumer.result()["received"]
    assert_numbered_received_once(received, list(range(COUNT)), TOPIC)
    ends = queue_ends(slave.addr)
    # The C++ client commits to the slave (its master is gone), and the slave hands the
    # offsets to the master once it is back.
    wait_until(lambda: committed(slave.addr) == ends, WAIT_S, 0.2, "commits on the slave")
    master.start()
    wait_until(lambda: committed(master.addr) == ends, WAIT_S, 0.2,
               "the slave to hand the offsets back to the master")
