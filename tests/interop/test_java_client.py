"""The official RocketMQ Java client 4.9.8 against real tidemq processes.

tests/interop/java holds the scenarios, written in Java against the client's own API
(DefaultMQProducer, TransactionMQProducer, DefaultMQPushConsumer, DefaultLitePullConsumer,
DefaultMQAdminExt); scripts/test builds it with Maven. Each group of scenarios runs in one JVM
(start-up costs a second or two), once per serialisation of the remoting headers: JSON, and
RocketMQ's binary ``ROCKETMQ`` type (``-Drocketmq.serialize.type=ROCKETMQ``). Every scenario is
its own test here; the Java side checks what the client observed and throws on a fault, and
its stack trace is this test's failure message.

The broker runs with short delay levels and a 1 s transaction check so that retries, delays
and transaction checks take seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from client_process import ClientProcess

from java_runtime import client_command
from server_processes import TidemqCluster, start_cluster

pytestmark = pytest.mark.interop

GROUP_TIMEOUT_S = 60.0  # each wait inside a scenario; a scenario has a few

# What the scenarios need of the broker: SQL92 filters, short delay levels (the client's
# retries use levels 3 and up), transaction checks within seconds.
BROKER_SETTINGS = {
    "enablePropertyFilter": "true",
    "messageDelayLevel": "1s 2s " + " ".join(["1s"] * 16),
    "transactionTimeOut": "1000",
    "transactionCheckInterval": "1000",
}

SCENARIOS = {
    "produce": ["sync_send", "async_send", "oneway_send", "batch_send", "query_message",
                "search_offset"],
    "consume": ["push_clustering", "push_broadcasting", "lite_pull_subscribe",
                "lite_pull_assign_seek", "tag_filter", "sql92_filter",
                "orderly_with_queue_locks"],
    "reliability": ["delay_levels", "retry_then_dlq", "transaction_check"],
    "admin": ["cluster_and_broker", "topic_create_route_stats", "consume_stats_connections",
              "offset_reset"],
    "request_reply": ["request_reply"],
}
# JSON headers for every group; the binary ROCKETMQ headers for the groups whose requests
# carry the most header kinds (sends, queries, admin) and broker-to-client requests
# (transaction checks, offset resets, pushed replies).
SERIALIZE_TYPES = {"JSON": list(SCENARIOS),
                   "ROCKETMQ": ["produce", "reliability", "admin", "request_reply"]}
CASES = [pytest.param(serialize_type, group, scenario, id=f"{serialize_type}-{scenario}")
         for serialize_type, groups in SERIALIZE_TYPES.items()
         for group in groups for scenario in SCENARIOS[group]]


class GroupRuns:
    """Runs each (serialisation, group) once, on first use, and keeps its result document."""

    def __init__(self, cluster: TidemqCluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.documents: dict[tuple[str, str], dict] = {}
        self.processes: dict[tuple[str, str], ClientProcess] = {}

    def result(self, serialize_type: str, group: str) -> tuple[dict, ClientProcess]:
        key = (serialize_type, group)
        if key not in self.documents:
            folder = self.workdir / f"{serialize_type}-{group}"
            folder.mkdir(parents=True, exist_ok=True)
            command = client_command([group, "--namesrv", self.cluster.namesrv_addr], folder,
                                     serialize_type)
            process = ClientProcess(f"Java client {serialize_type} {group}", folder, command,
                                    GROUP_TIMEOUT_S * len(SCENARIOS[group]))
            self.processes[key] = process
            try:
                self.documents[key] = process.start().result()
            finally:
                process.kill()
        return self.documents[key], self.processes[key]


@pytest.fixture(scope="module")
def java_groups(tmp_path_factory: pytest.TempPathFactory):
    """One tidemq name server and broker for the module, and the group runner."""
    workdir = tmp_path_factory.mktemp("java-client")
    processes = []
    try:
        cluster = start_cluster(workdir / "cluster", processes,
                                broker_overrides=BROKER_SETTINGS)
        yield GroupRuns(cluster, workdir)
    finally:
        for process in reversed(processes):
            process.stop()


@pytest.mark.parametrize(("serialize_type", "group", "scenario"), CASES)
def test_java_client_scenario(java_groups, serialize_type, group, scenario):
    document, process = java_groups.result(serialize_type, group)
    assert document["serializeType"] == serialize_type
    outcome = document["scenarios"][scenario]
    assert outcome["ok"], (
        f"{scenario} ({serialize_type} headers) failed in the Java client:\n"
        f"{outcome['error']}\nobserved: {json.dumps(outcome['observed'])}\n"
        f"{process.report()}\n{java_groups.cluster.brokers[0].log_tail()}")
