"""Store compatibility both ways: a store Apache's broker wrote is served by tidemq, and a
store tidemq wrote is served by Apache's broker -- every message, queue offset, index entry,
consumer offset, topic and subscription group (docs/migration.md).

Each direction: the first broker takes sends (single and batch, tags, keys, properties, two
topics, several queues), a consumer offset and a subscription group; what it serves is
recorded; it stops cleanly; the other broker starts on the same storePathRootDir with the
same file sizes and must serve the same, then take new sends after the old ones.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
import wire
from compare import assert_same

from reference_cluster import REFERENCE_BROKER_SETTINGS, ReferenceCluster
from server_processes import TEST_BROKER_SETTINGS
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.message import BatchEntry, encode_batch_body, encode_properties
from tidemq.protocol.msgid import decode_offset_msg_id

pytestmark = pytest.mark.differential

TOPICS = {"MigrateOrders": 3, "MigrateLogs": 1}
GROUP = "cg_migrate"
KEPT_GROUP = "cg_kept"
COMMITTED = {("MigrateOrders", 1): 2}
WAIT_S = 60.0

# The same store file sizes on both sides (tidemq's test sizes are the reference's).
assert TEST_BROKER_SETTINGS["mappedFileSizeCommitLog"] == (
    REFERENCE_BROKER_SETTINGS["mappedFileSizeCommitLog"])
assert TEST_BROKER_SETTINGS["mappedFileSizeConsumeQueue"] == (
    REFERENCE_BROKER_SETTINGS["mappedFileSizeConsumeQueue"])


def call(session: wire.Session, request) -> object:
    answer = session.call(request)
    assert answer.code == ResponseCode.SUCCESS, answer.describe()
    return answer


def batch(topic: str, queue_id: int, count: int) -> object:
    entries = [BatchEntry(body=f"batch-{i}".encode(), flag=0,
                          properties=encode_properties({"KEYS": f"bk{i}", "TAGS": "TagB",
                                                        "UNIQ_KEY": f"{i:032X}"}))
               for i in range(count)]
    return wire.request(RequestCode.SEND_BATCH_MESSAGE, {
        "a": "pg_migrate", "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id),
        "f": "0", "g": str(int(time.time() * 1000)), "h": "0", "i": "", "j": "0",
        "k": "false", "m": "true"}, encode_batch_body(entries))


def write_sample(broker_addr: str) -> list[str]:
    """Topics, singles and a batch, a committed offset and a group; the offset msg ids."""
    ids = []
    with_session = wire.Session(broker_addr)
    try:
        for topic, queues in TOPICS.items():
            call(with_session, wire.create_topic(topic, queues))
        for i in range(12):
            topic = "MigrateOrders" if i % 4 else "MigrateLogs"
            answer = call(with_session, wire.send(
                topic, f"single-{i}".encode(), queue_id=i % TOPICS[topic], keys=f"key-{i}",
                tags="TagA" if i % 2 else "TagC", properties={"n": str(i)}))
            ids.append(answer.ext_fields["msgId"])
        answer = call(with_session, batch("MigrateOrders", 2, 5))
        ids += answer.ext_fields["msgId"].split(",")
        call(with_session, wire.heartbeat(GROUP, list(TOPICS)))
        for (topic, queue_id), offset in COMMITTED.items():
            call(with_session, wire.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
                "consumerGroup": GROUP, "topic": topic, "queueId": str(queue_id),
                "commitOffset": str(offset)}))
        call(with_session, wire.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None,
                                        orjson.dumps({"groupName": KEPT_GROUP,
                                                      "retryMaxTimes": 3})))
    finally:
        with_session.close()
    return ids


def served(broker_addr: str, ids: list[str]) -> dict:
    """Everything a client can read back about the sample, from one broker."""
    session = wire.Session(broker_addr)
    seen: dict = {"queues": {}, "by_id": [], "by_key": {}, "offsets": {}}
    try:
        call(session, wire.heartbeat(GROUP, list(TOPICS)))
        for topic, queues in TOPICS.items():
            for queue_id in range(queues):
                max_offset = int(call(session, wire.queue_request(
                    RequestCode.GET_MAX_OFFSET, topic, queue_id)).ext_fields["offset"])
                messages = []
                if max_offset:
                    answer = call(session, wire.pull(topic, queue_id, 0, group=GROUP))
                    messages = [{"offset": m.queue_offset, "body": m.body, "flag": m.flag,
                                 "born": m.born_timestamp, "store": m.store_timestamp,
                                 "properties": m.properties, "sysflag": m.sysflag}
                                for m in wire.messages(answer)]
                offset = session.call(wire.request(RequestCode.QUERY_CONSUMER_OFFSET, {
                    "consumerGroup": GROUP, "topic": topic, "queueId": str(queue_id)}))
                seen["queues"][f"{topic}:{queue_id}"] = {"max": max_offset,
                                                         "messages": messages}
                seen["offsets"][f"{topic}:{queue_id}"] = (offset.code, (
                    offset.ext_fields or {}).get("offset"))
        for msg_id in ids:
            answer = call(session, wire.request(RequestCode.VIEW_MESSAGE_BY_ID, {
                "offset": str(decode_offset_msg_id(msg_id)[1])}))
            message = wire.messages(answer)[0]
            seen["by_id"].append((message.topic, message.queue_offset, message.body))
        for key in ("key-1", "key-9", "bk3"):
            answer = call(session, wire.request(RequestCode.QUERY_MESSAGE, {
                "topic": "MigrateOrders", "key": key, "maxNum": "32", "beginTimestamp": "0",
                "endTimestamp": str(2**62)}))
            seen["by_key"][key] = sorted(m.body for m in wire.messages(answer))
        groups = jsonx.loads(call(session, wire.request(
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)).body)["subscriptionGroupTable"]
        seen["kept_group_retry_max"] = groups[KEPT_GROUP]["retryMaxTimes"]
        topics = jsonx.loads(call(session, wire.request(
            RequestCode.GET_ALL_TOPIC_CONFIG)).body)["topicConfigTable"]
        seen["topics"] = {name: (topics[name]["readQueueNums"], topics[name]["perm"])
                          for name in TOPICS}
    finally:
        session.close()
    return seen


def send_after(broker_addr: str) -> tuple[str, str]:
    """One more send to queue 0 of MigrateLogs: (queueOffset, msgId)."""
    session = wire.Session(broker_addr)
    try:
        answer = call(session, wire.send("MigrateLogs", b"after-migration", keys="after"))
        return answer.ext_fields["queueOffset"], answer.ext_fields["msgId"]
    finally:
        session.close()


def wait_dispatched(broker_addr: str, expected: dict) -> None:
    """Until every queue's max offset is what the sample wrote (Apache dispatches late)."""
    deadline = time.monotonic() + WAIT_S
    session = wire.Session(broker_addr)
    try:
        while True:
            offsets = {f"{topic}:{queue_id}": int(session.call(wire.queue_request(
                RequestCode.GET_MAX_OFFSET, topic, queue_id)).ext_fields.get("offset", -1))
                for topic, queues in TOPICS.items() for queue_id in range(queues)}
            if offsets == expected:
                return
            assert time.monotonic() < deadline, f"max offsets {offsets}, expected {expected}"
            time.sleep(0.1)
    finally:
        session.close()


# Singles i = 0..11: i % 4 == 0 go to MigrateLogs, the others to MigrateOrders queue i % 3;
# the batch of 5 to MigrateOrders queue 2.
EXPECTED_MAX = {"MigrateOrders:0": 3, "MigrateOrders:1": 3, "MigrateOrders:2": 8,
                "MigrateLogs:0": 3}


def check_store_files(store: Path) -> None:
    for name in ("commitlog", "consumequeue", "index", "config", "checkpoint"):
        assert (store / name).exists(), f"{store / name} missing"
    assert not (store / "abort").exists(), "the store was not closed cleanly"


def test_tidemq_serves_a_store_apache_wrote(tmp_path, tidemq_cluster):
    apache = ReferenceCluster(tmp_path / "apache")
    try:
        apache.start()
        ids = write_sample(apache.broker_addr)
        wait_dispatched(apache.broker_addr, EXPECTED_MAX)
        before = served(apache.broker_addr, ids)
    finally:
        apache.stop()
    store = apache.store_dir
    check_store_files(store)
    cluster = tidemq_cluster(broker_overrides={"storePathRootDir": str(store)})
    broker = cluster.brokers[0].addr
    after = served(broker, ids)
    assert_same(before, after, "what Apache served and what tidemq serves from its store")
    assert after["queues"]["MigrateOrders:2"]["max"] == 8
    assert after["offsets"]["MigrateOrders:1"] == (ResponseCode.SUCCESS, "2")
    offset, _ = send_after(broker)
    assert offset == "3", "a new send goes after the migrated messages"


def test_apache_serves_a_store_tidemq_wrote(tmp_path, tidemq_cluster):
    store = tmp_path / "tidemq-store"
    cluster = tidemq_cluster(broker_overrides={"storePathRootDir": str(store)})
    broker = cluster.brokers[0]
    ids = write_sample(broker.addr)
    before = served(broker.addr, ids)
    assert broker.stop() == 0
    check_store_files(store)
    apache = ReferenceCluster(tmp_path / "apache")
    try:
        apache.start(store_dir=store)
        wait_dispatched(apache.broker_addr, EXPECTED_MAX)
        after = served(apache.broker_addr, ids)
        assert_same(before, after, "what tidemq served and what Apache serves from its store")
        offset, _ = send_after(apache.broker_addr)
        assert offset == "3", "a new send goes after the migrated messages"
    finally:
        apache.stop()
