"""Two more third-party RocketMQ clients against real tidemq processes: ali-ons 3.12.0 (npm,
a pure JavaScript implementation of the 4.x protocol) and rocketmq-nodejs 1.1.2 (npm, a
native addon around the Apache C++ client 2.x core).

``scripts/test`` installs them into tests/interop/node/node_modules from the committed
package-lock.json. Each client runs one scenario of tests/interop/node/scenarios.js in its
own process; tidemq's Python client creates topics, produces, and reads back what the
Node.js producers stored.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from tidemq_side import create_topic, produce, read_back

from tidemq.client import Message, Producer

pytestmark = pytest.mark.interop

NODE_DIR = Path(__file__).resolve().parent / "node"
CLIENTS = ["ons", "cpp2"]
SEND_OK = {"ons": "SEND_OK", "cpp2": 0}
UNIQUE_KEY_PATTERN = re.compile(r"[0-9A-F]{32}")
# A send-back in the C++ 2.x core's log (its logDir is the scenario's cpp2-logs file).
CPP_CONSUME_FAIL = re.compile(r"(\d\d:\d\d:\d\d\.\d+)\].*?consume fail, MQ is:MessageQueue "
                              r"\[topic=([^,]+), [^\]]*queueId=(\d+)\].*?index is:(\d+), "
                              r"reconsume times is:(\d+)")


@pytest.fixture(scope="module", autouse=True)
def node_clients_installed() -> None:
    assert shutil.which("node"), "node is not on PATH: these tests drive Node.js clients"
    for package in ("ali-ons", "rocketmq-nodejs"):
        assert (NODE_DIR / "node_modules" / package / "package.json").exists(), (
            f"{package} is not installed in {NODE_DIR}/node_modules; scripts/test installs it "
            f"(npm ci --prefix {NODE_DIR})")


def numbered(topic: str, count: int) -> list[Message]:
    """``msg-i`` with tag TagA / TagB alternating and key ``key-i``."""
    return [Message(topic, f"msg-{i}", tags="TagA" if i % 2 == 0 else "TagB", keys=[f"key-{i}"])
            for i in range(count)]


def bodies_once(received: list[dict]) -> list[str]:
    counts = collections.Counter(record["body"] for record in received)
    doubled = sorted(body for body, count in counts.items() if count > 1)
    assert not doubled, f"delivered more than once: {doubled[:10]}"
    return sorted(counts)


def expected_bodies(indexes) -> list[str]:
    return sorted(f"msg-{i}" for i in indexes)


@pytest.mark.parametrize("client", CLIENTS)
def test_node_producer_sends_are_stored_with_tags_keys_and_send_results(
        client, tidemq_cluster, node_client):
    cluster = tidemq_cluster()
    topic, count = f"NodeProduced_{client}", 30
    create_topic(cluster, topic)

    result = node_client(client, "producer", "produce", "--namesrv", cluster.namesrv_addr,
                         "--topic", topic, "--count", str(count)).result()

    sends = result["sends"]
    assert [send["status"] for send in sends] == [SEND_OK[client]] * count
    stored = read_back(cluster.namesrv_addr, topic)
    assert sorted(m.body.decode() for m in stored) == expected_bodies(range(count))
    by_body = {m.body.decode(): m for m in stored}
    for send in sends:
        i = send["index"]
        message = by_body[f"msg-{i}"]
        assert (message.tags, message.keys) == ("TagA" if i % 2 == 0 else "TagB", [f"key-{i}"])
        assert message.queue_offset == send["offset"]
        # ali-ons reports the broker's offset msg id; the C++ 2.x core its own UNIQ_KEY.
        wanted_id = message.offset_msg_id if client == "ons" else message.unique_key
        assert send["msg_id"] == wanted_id


@pytest.mark.parametrize("client", CLIENTS)
def test_node_push_consumer_gets_every_message_once_and_tag_filters_apply(
        client, tidemq_cluster, node_client):
    cluster = tidemq_cluster()
    topic, count = f"NodePush_{client}", 100
    create_topic(cluster, topic)
    everything = node_client(client, "all", "consume", "--namesrv", cluster.namesrv_addr,
                             "--topic", topic, "--group", f"node_all_{client}",
                             "--expect", str(count))
    tag_a = node_client(client, "tag-a", "consume", "--namesrv", cluster.namesrv_addr,
                        "--topic", topic, "--group", f"node_tag_a_{client}",
                        "--expression", "TagA", "--expect", str(count // 2))
    for consumer in (everything, tag_a):
        consumer.wait_for_output("CONSUMER STARTED")

    produce(cluster.namesrv_addr, numbered(topic, count))

    received = everything.result()["received"]
    assert bodies_once(received) == expected_bodies(range(count))
    for record in received:
        i = int(record["body"].removeprefix("msg-"))
        assert (record["topic"], record["tags"], record["keys"]) == (
            topic, "TagA" if i % 2 == 0 else "TagB", f"key-{i}")
    assert bodies_once(tag_a.result()["received"]) == expected_bodies(range(0, count, 2))


@pytest.mark.parametrize("client", CLIENTS)
def test_node_consumer_gets_a_failed_message_again_from_the_retry_topic(
        client, tidemq_cluster, node_client):
    # Every delay level 1 s, so a handed-back message comes again in a second, not in 10 s.
    cluster = tidemq_cluster(broker_overrides={"messageDelayLevel": " ".join(["1s"] * 18)})
    topic, group, count = f"NodeRetry_{client}", f"node_retry_{client}", 10
    create_topic(cluster, topic)
    # Created up front: these clients look the retry topic's route up before their first
    # heartbeat creates it, and only every 30 s after that.
    create_topic(cluster, f"%RETRY%{group}", queue_nums=1)
    consumer = node_client(client, "retrying", "consume", "--namesrv", cluster.namesrv_addr,
                           "--topic", topic, "--group", group, "--fail-first",
                           "--expect", str(2 * count))
    consumer.wait_for_output("CONSUMER STARTED")

    # One message at a time, each after the consumer's first delivery of the one before:
    # the C++ 2.x core hands a whole pull result to the listener and, when one message of it
    # fails, sends every message of it back (scenarios.js, cpp2Consume, says more). Produced
    # in a burst, two messages of a queue can come in one pull, and a failed first delivery
    # then sends back a message the listener never saw or already acked.
    produce_each(cluster.namesrv_addr, numbered(topic, count),
                 lambda message: consumer.wait_for_output(
                     f"delivered {message.body.decode()} attempt 1\n"))

    received = deliveries_or_explained(consumer)
    timeline = delivery_timeline(received) + send_backs_seen(consumer)
    attempts = collections.defaultdict(list)
    for record in received:
        attempts[record["body"]].append(record["attempt"])
    assert dict(attempts) == {body: [1, 2] for body in expected_bodies(range(count))}, (
        f"each message should fail once, then succeed once; deliveries:\n{timeline}")
    for record in received:
        if record["attempt"] != 2:
            continue
        i = int(record["body"].removeprefix("msg-"))
        # Back from %RETRY%<group> with the original topic, tags and keys restored.
        assert (record["topic"], record["tags"], record["keys"]) == (
            topic, "TagA" if i % 2 == 0 else "TagB", f"key-{i}"), timeline


def produce_each(namesrv: str, messages: list[Message],
                 after_each: Callable[[Message], None]) -> None:
    """Send ``messages`` in order with one tidemq Producer, calling ``after_each(message)``
    (in a thread, so the producer's own tasks run meanwhile) after each send."""

    async def send_each() -> None:
        async with Producer("py_interop_producer", namesrv=namesrv) as producer:
            for message in messages:
                await producer.send(message)
                await asyncio.to_thread(after_each, message)

    asyncio.run(send_each())


def deliveries_or_explained(process) -> list[dict]:
    """The consumer's deliveries. When it did not complete (say a message went to the DLQ
    after a fourth failed delivery, so --expect never came), the failure adds what came per
    body from its result document and the C++ core's send-backs."""
    try:
        return process.result()["received"]
    except AssertionError as error:
        path = process.out_path
        received = json.loads(path.read_text()).get("received", []) if path.exists() else []
        raise AssertionError(f"{error}\ndeliveries:\n{delivery_timeline(received)}"
                             f"{send_backs_seen(process)}") from None


def delivery_timeline(received: list[dict]) -> str:
    """One line per body: each delivery's attempt number, milliseconds since the scenario
    started, and topic, in arrival order (for a failed test's message)."""
    by_body: dict[str, list[str]] = collections.defaultdict(list)
    for record in received:
        by_body[record["body"]].append(
            f"#{record['attempt']} at {record.get('at_ms', '?')} ms ({record['topic']})")
    return "\n".join(f"  {body}: {', '.join(deliveries)}"
                     for body, deliveries in sorted(by_body.items(), key=body_order))


def body_order(item: tuple[str, object]) -> int:
    return int(item[0].removeprefix("msg-"))


def send_backs_seen(process) -> str:
    """What the C++ 2.x core logged of its send-backs (each "consume fail" line names the
    message's index in the batch the core handed to the listener); "" for other clients."""
    log = process.workdir / "cpp2-logs"
    if not log.exists():
        return ""
    lines = CPP_CONSUME_FAIL.findall(log.read_text(errors="replace"))
    return (f"\nthe C++ core logged {len(lines)} send-backs, "
            f"{sum(1 for *_, index, _ in lines if int(index) > 0)} of them at batch index > 0:\n"
            + "\n".join(f"  {at} {topic} queue {queue}: batch index {index}, reconsume times "
                         f"{times}" for at, topic, queue, index, times in lines[:60]))
