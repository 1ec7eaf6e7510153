"""Message trace across clients: the official RocketMQ Java client 4.9.8 with
``enableMsgTrace`` writes Pub, SubBefore and SubAfter records through tidemq (its own
TraceView reads them back: the Java side checks that), and tidemq's reader, the one behind
``tidemq admin QueryMsgTraceById`` and the console, reads the same records with the Java
groups, hosts and timings.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from client_process import ClientProcess

from java_runtime import client_command
from tidemq.client import Admin
from tidemq.client.trace_query import MessageTrace, query_message_trace

pytestmark = pytest.mark.interop

TIMEOUT_S = 90.0


def test_java_enable_msg_trace_reads_the_same_in_tidemq(tidemq_cluster, tmp_path: Path
                                                       ) -> None:
    cluster = tidemq_cluster(broker_overrides={"traceTopicEnable": "true"})
    folder = tmp_path / "java-trace"
    folder.mkdir()
    command = client_command(["trace", "--namesrv", cluster.namesrv_addr], folder)
    process = ClientProcess("Java client trace", folder, command, TIMEOUT_S)
    try:
        document = process.start().result()
    finally:
        process.kill()
    outcome = document["scenarios"]["traced_send_consume"]
    assert outcome["ok"], (f"the Java client failed:\n{outcome['error']}\n"
                           f"{json.dumps(outcome['observed'])}\n{process.report()}")
    observed = outcome["observed"]

    async def read() -> MessageTrace:
        async with Admin(cluster.namesrv_addr) as admin:
            deadline = time.monotonic() + TIMEOUT_S
            while True:
                trace = await query_message_trace(admin, observed["msgId"])
                attempts = trace.consume_attempts()
                if trace.sends and attempts and attempts[0].success is not None:
                    return trace
                assert time.monotonic() < deadline, f"records: {trace.records}"
                await asyncio.sleep(0.2)

    trace = asyncio.run(read())
    (pub,) = trace.sends
    assert (pub.group, pub.topic, pub.tags, pub.keys, pub.success) == (
        observed["producerGroup"], observed["topic"], "TagT", "java-trace-key", True)
    assert pub.store_host == cluster.brokers[0].addr
    assert pub.body_length == len(b"traced by java") and pub.cost_ms >= 0
    assert pub.client_host  # the Java trace producer's address (its trace message's born host)
    (attempt,) = trace.consume_attempts()
    assert (attempt.group, attempt.success, attempt.retry_times) == (
        observed["consumerGroup"], True, 0)
    assert attempt.ended_ms >= attempt.began_ms >= pub.timestamp_ms
