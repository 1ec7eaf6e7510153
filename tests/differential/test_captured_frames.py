"""Frames captured from three third-party clients (tests/data/frames), replayed to Apache's
broker and to tidemq: every request must get the same response code from both, and the
answers a client reads must agree (routes, send offsets, pulled messages, consumer lists,
offsets, locked queues).

Replayed as captured -- mixed value types, ``extFields`` of null, C++ integer enums -- with
one change: a pull's suspend bit is cleared in place (``"sysFlag":6`` -> ``4``, same length),
so a pull with nothing to return answers at once instead of being parked for 15 s by both
brokers. GET_ROUTEINFO_BY_TOPIC (105) goes to the name servers, everything else to the
brokers, each captured connection on its own connection. Folders replay in sorted order and
share topic names, so both clusters see the same history.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import orjson
import pytest
import wire
from compare import assert_same, without_generated_unique_key
from wire import Session

from data_paths import CLIENT_FRAMES_DIR
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand

pytestmark = pytest.mark.differential

FOLDERS = sorted(path.name for path in CLIENT_FRAMES_DIR.iterdir() if path.is_dir())
CAPTURED_TOPICS = ("TopicTest", "TopicOrd", "OracleOrder_cap2", "OracleTags_cap1")
ROUTE_WAIT_S = 30.0
SUSPEND_FLAG = 0x2
SYS_FLAG = re.compile(rb'"sysFlag":"?(\d)')


def without_suspend(frame: bytes) -> bytes:
    """The pull frame with its FLAG_SUSPEND bit cleared in the JSON text (same length)."""
    match = SYS_FLAG.search(frame)
    assert match, "a captured pull without a sysFlag"
    value = int(match.group(1))
    cleared = str(value & ~SUSPEND_FLAG).encode()
    return frame[:match.start(1)] + cleared + frame[match.end(1):]


def frames(folder: str) -> list[tuple[dict, bytes]]:
    """(decoded description, frame bytes) of a folder, in capture order."""
    found = []
    for bin_path in sorted((CLIENT_FRAMES_DIR / folder).glob("*.bin")):
        description = json.loads(bin_path.with_suffix(".json").read_text())
        found.append((description, bin_path.read_bytes()))
    return found


@pytest.fixture(scope="module")
def captured_topics(pair):
    """The captured clients' topics exist on both brokers (4 queues) and are routed."""
    for topic in CAPTURED_TOPICS:
        answers = pair.broker_call(lambda topic=topic: wire.create_topic(topic, 4))
        assert answers.codes() == (ResponseCode.SUCCESS, ResponseCode.SUCCESS)
    for topic in CAPTURED_TOPICS:
        wait_routed(pair, topic)


def wait_routed(pair, topic: str) -> None:
    deadline = time.monotonic() + ROUTE_WAIT_S
    while True:
        answers = pair.namesrv_call(lambda: wire.request(
            RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}))
        if answers.codes() == (ResponseCode.SUCCESS, ResponseCode.SUCCESS):
            return
        assert time.monotonic() < deadline, f"{topic} not routed by both: {answers.codes()}"
        time.sleep(0.1)


def route_view(response: RemotingCommand) -> dict:
    if response.code != ResponseCode.SUCCESS:
        return {}
    route = jsonx.loads(response.body)
    return {"queues": sorted((q["readQueueNums"], q["writeQueueNums"], q["perm"])
                             for q in route["queueDatas"]),
            "brokers": sorted(len(b["brokerAddrs"]) for b in route["brokerDatas"])}


def body_view(code: int, response: RemotingCommand):
    """What of a response body both must agree on, by request code."""
    if response.code != ResponseCode.SUCCESS or not response.body:
        return None
    if code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
        return route_view(response)
    if code == RequestCode.PULL_MESSAGE:
        return [{"topic": m.topic, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
                 "body": m.body, "properties": m.properties} for m in wire.messages(response)]
    if code in (RequestCode.GET_CONSUMER_LIST_BY_GROUP, RequestCode.LOCK_BATCH_MQ):
        return jsonx.loads(response.body)
    return None


SEND_CODES = (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2)
HEADER_FIELDS = {
    RequestCode.PULL_MESSAGE: ("nextBeginOffset", "minOffset", "maxOffset",
                               "suggestWhichBrokerId"),
    RequestCode.QUERY_CONSUMER_OFFSET: ("offset",),
    RequestCode.SEND_MESSAGE: ("queueId", "queueOffset"),
    RequestCode.SEND_MESSAGE_V2: ("queueId", "queueOffset"),
}


@pytest.mark.parametrize("folder", FOLDERS)
def test_captured_client_frames_get_the_same_answers(pair, captured_topics, folder):
    sessions: dict[tuple[int, str], tuple[Session, Session]] = {}
    try:
        for description, frame in frames(folder):
            code = description["header"]["code"]
            kind = "namesrv" if code == RequestCode.GET_ROUTEINFO_BY_TOPIC else "broker"
            key = (description["conn"], kind)
            if key not in sessions:
                addrs = ((pair.apache.namesrv_addr, pair.tidemq.namesrv_addr)
                         if kind == "namesrv" else
                         (pair.apache.broker_addr, pair.tidemq_broker_addr))
                sessions[key] = (Session(addrs[0]), Session(addrs[1]))
            if code == RequestCode.PULL_MESSAGE:
                frame = without_suspend(frame)
            what = f"{folder} frame {description['seq']} ({description.get('codeName', code)})"
            if description["header"].get("flag", 0) & 0x2:  # oneway: no answer to compare
                for session in sessions[key]:
                    session.socket.sendall(frame)
                continue
            apache, tidemq = (session.call(frame) for session in sessions[key])
            assert tidemq.code == apache.code, (
                f"{what}: response codes differ\n{apache.describe()}\n{tidemq.describe()}")
            fields = HEADER_FIELDS.get(code, ())
            assert_same({f: (apache.ext_fields or {}).get(f) for f in fields},
                        {f: (tidemq.ext_fields or {}).get(f) for f in fields}, what)
            apache_body, tidemq_body = body_view(code, apache), body_view(code, tidemq)
            if code == RequestCode.PULL_MESSAGE and apache_body and tidemq_body:
                for left, right in zip(apache_body, tidemq_body, strict=False):
                    right["properties"] = without_generated_unique_key(left["properties"],
                                                                       right["properties"])
            assert_same(apache_body, tidemq_body, what)
            if code in SEND_CODES and apache.code == ResponseCode.SUCCESS:
                # Apache dispatches to its consume queue just after answering: a pull in the
                # next frame must find the message on both.
                ext = description["header"]["extFields"]
                pair.wait_dispatched(ext.get("topic", ext.get("b")),
                                     int(apache.ext_fields["queueId"]),
                                     int(apache.ext_fields["queueOffset"]) + 1)
            if code == RequestCode.HEART_BEAT:
                for consumer in orjson.loads(frame[8 + description["headerLength"]:]).get(
                        "consumerDataSet") or []:
                    wait_routed(pair, f"%RETRY%{consumer['groupName']}")
    finally:
        for pair_of_sessions in sessions.values():
            for session in pair_of_sessions:
                session.close()


def test_the_frames_are_where_the_readme_says():
    assert FOLDERS, f"no captured frames under {CLIENT_FRAMES_DIR}"
    assert Path(CLIENT_FRAMES_DIR / "README.md").exists()
