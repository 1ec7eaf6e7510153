"""Acknowledged topic and subscription-group changes survive a crash (issue 18's side effect).

A real broker process gets a burst of concurrent UPDATE_AND_CREATE_TOPIC and
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP requests (the admin client), then a few one after
another, is SIGKILLed the moment the last answer arrives (from the same coroutine, before the
client even closes), and is started again on the same store: every topic and group that was
answered SUCCESS must be there. With topics.json and subscriptionGroup.json saved only in the
background (at most every 100 ms, commit 798bb8e), the last creates were lost; the group
commit answers a change only once a save holding it is durable.
"""

from __future__ import annotations

import asyncio
import os
import signal

from server_processes import remoting_call
from tidemq.client import Admin
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting.loop import run

COUNT = 60  # topics, and as many groups, in flight together
TAIL = 5  # then this many of each one after another


async def create_all_then_kill(broker_addr: str, namesrv: str, pid: int
                               ) -> tuple[list[str], list[str]]:
    """Create COUNT topics and COUNT groups at once, then TAIL of each one by one, and
    SIGKILL the broker at the last answer; returns the names answered SUCCESS."""
    topics = [f"Durable{index:03d}" for index in range(COUNT)]
    groups = [f"DurableGroup{index:03d}" for index in range(COUNT)]
    async with Admin(namesrv, request_timeout_ms=60_000) as admin:
        results = await asyncio.gather(
            *(admin.create_topic(topic, 2, broker_addr=broker_addr) for topic in topics),
            *(admin.update_subscription_group(group, broker_addr=broker_addr)
              for group in groups),
            return_exceptions=True,
        )
        failures = [result for result in results if isinstance(result, BaseException)]
        assert not failures, f"creates failed: {failures[:3]}"
        for index in range(COUNT, COUNT + TAIL):
            topics.append(f"Durable{index:03d}")
            await admin.create_topic(topics[-1], 2, broker_addr=broker_addr)
            groups.append(f"DurableGroup{index:03d}")
            await admin.update_subscription_group(groups[-1], broker_addr=broker_addr)
        os.kill(pid, signal.SIGKILL)  # at the last answer: no clean stop, no final save
    return topics, groups


def table_names(addr: str, code: int, table: str, key: str) -> set[str]:
    response = remoting_call(addr, RemotingCommand.request(code))
    assert response.code == ResponseCode.SUCCESS, response.remark
    entries = jsonx.loads(response.body)[table]
    return {entry[key] for entry in entries.values()} | set(entries)


def test_acknowledged_topics_and_groups_survive_a_sigkill(tidemq_cluster):
    cluster = tidemq_cluster()
    broker = cluster.broker("broker-a")
    topics, groups = run(create_all_then_kill(broker.addr, cluster.namesrv_addr, broker.pid))
    broker.kill(signal.SIGKILL)  # reaps the process killed above
    broker.start()
    held_topics = table_names(broker.addr, RequestCode.GET_ALL_TOPIC_CONFIG,
                              "topicConfigTable", "topicName")
    held_groups = table_names(broker.addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
                              "subscriptionGroupTable", "groupName")
    lost_topics = sorted(set(topics) - held_topics)
    lost_groups = sorted(set(groups) - held_groups)
    assert not lost_topics and not lost_groups, (
        f"acknowledged but lost after SIGKILL: {len(lost_topics)} topics {lost_topics[:5]}, "
        f"{len(lost_groups)} groups {lost_groups[:5]}\n{broker.log_tail()}")
