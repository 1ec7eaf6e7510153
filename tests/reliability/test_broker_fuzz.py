"""Seeded fuzz of a live broker process: random requests, mutated frames and random bytes.

Whatever arrives, the broker process stays up, answers a well-formed request after every bad
one, and keeps what it stored. Each well-framed request that expects an answer must get one
(any code: "missing or unparsable field -> SYSTEM_ERROR naming it", never a closed
connection), except pulls, which the broker may park.

The seed is printed (and named in every failure); rerun one with
``TIDEMQ_FUZZ_SEED=<seed> pytest tests/reliability/test_broker_fuzz.py``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import socket
from dataclasses import dataclass
from typing import Any

import pytest

from server_processes import remoting_call
from tidemq.client import Admin, Message, MessageQueue, Producer, PullConsumer
from tidemq.protocol.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    LanguageCode,
    RequestCode,
    ResponseCode,
    SerializeType,
)
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.frame import FrameDecoder
from tidemq.protocol.message import BatchEntry, encode_batch_body, encode_properties

pytestmark = pytest.mark.reliability


CASES = 300
KEPT_TOPIC = "FuzzKept"  # written before the fuzz, read back after; no fuzz input names it
KEPT_MESSAGES = 20
# Waits for one fuzz case. A well-framed request expecting an answer must get it within
# ANSWER_WAIT_S (a healthy broker needs milliseconds; the bound is for a loaded CI machine,
# and only a broker that never answers waits it out); other cases may end in silence (a
# parked pull, a oneway request, bytes the decoder still waits on) and are given up sooner.
ANSWER_WAIT_S = 30.0
PULL_WAIT_S = 0.5
SILENCE_WAIT_S = 1.0
HEALTH_WAIT_S = 10.0
ROUTE_WAIT_S = 20.0

TOPICS = ["FuzzTopic", "TBW102", "%RETRY%fuzz_group", "%DLQ%fuzz_group", "SCHEDULE_TOPIC_XXXX",
          "", " ", "bad topic", "T" * 300, "\u4e2d\u6587"]
GROUPS = ["fuzz_group", "", "CID_\u00e9", "g" * 300, "%RETRY%x"]
# Request header fields per code (what real clients send), so random values reach the checks
# behind the header parsing and not only the "missing field" branch.
FIELDS: dict[int, list[str]] = {
    RequestCode.SEND_MESSAGE: [
        "producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
        "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "batch",
        "maxReconsumeTimes"],
    RequestCode.SEND_MESSAGE_V2: list("abcdefghijklmn"),
    RequestCode.SEND_BATCH_MESSAGE: list("abcdefghijklmn"),
    RequestCode.PULL_MESSAGE: [
        "consumerGroup", "topic", "queueId", "queueOffset", "maxMsgNums", "sysFlag",
        "commitOffset", "suspendTimeoutMillis", "subscription", "subVersion", "expressionType"],
    RequestCode.QUERY_MESSAGE: [
        "topic", "key", "maxNum", "beginTimestamp", "endTimestamp", "_UNIQUE_KEY_QUERY"],
    RequestCode.QUERY_CONSUMER_OFFSET: ["consumerGroup", "topic", "queueId"],
    RequestCode.UPDATE_CONSUMER_OFFSET: ["consumerGroup", "topic", "queueId", "commitOffset"],
    RequestCode.UPDATE_AND_CREATE_TOPIC: [
        "topic", "defaultTopic", "readQueueNums", "writeQueueNums", "perm", "topicFilterType",
        "topicSysFlag", "order"],
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: ["topic", "queueId", "timestamp"],
    RequestCode.GET_MAX_OFFSET: ["topic", "queueId"],
    RequestCode.GET_MIN_OFFSET: ["topic", "queueId"],
    RequestCode.GET_EARLIEST_MSG_STORETIME: ["topic", "queueId"],
    RequestCode.VIEW_MESSAGE_BY_ID: ["offset"],
    RequestCode.HEART_BEAT: [],
    RequestCode.UNREGISTER_CLIENT: ["clientID", "producerGroup", "consumerGroup"],
    RequestCode.CONSUMER_SEND_MSG_BACK: [
        "offset", "group", "delayLevel", "originMsgId", "originTopic", "unitMode",
        "maxReconsumeTimes"],
    RequestCode.END_TRANSACTION: [
        "producerGroup", "tranStateTableOffset", "commitLogOffset", "commitOrRollback",
        "fromTransactionCheck", "msgId", "transactionId"],
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: ["consumerGroup"],
    RequestCode.LOCK_BATCH_MQ: [],
    RequestCode.UNLOCK_BATCH_MQ: [],
    RequestCode.CHECK_CLIENT_CONFIG: [],
    RequestCode.GET_ALL_TOPIC_CONFIG: [],
    RequestCode.GET_BROKER_RUNTIME_INFO: [],
    RequestCode.GET_TOPIC_STATS_INFO: ["topic"],
    RequestCode.GET_CONSUME_STATS: ["consumerGroup", "topic"],
    RequestCode.GET_CONSUMER_CONNECTION_LIST: ["consumerGroup"],
    RequestCode.GET_PRODUCER_CONNECTION_LIST: ["producerGroup"],
    RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: ["topic"],
    RequestCode.DELETE_SUBSCRIPTIONGROUP: ["groupName", "removeOffset"],
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: [],
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: [],
    RequestCode.GET_ALL_CONSUMER_OFFSET: [],
    RequestCode.GET_ALL_DELAY_OFFSET: [],
}
# Requests that may legitimately stay unanswered: a pull can be parked; END_TRANSACTION with
# an unknown state is ignored without a response, as RocketMQ does.
MAY_STAY_SILENT = {RequestCode.PULL_MESSAGE, RequestCode.END_TRANSACTION}
# Left out on purpose: UPDATE_BROKER_CONFIG (25) would let random input rewrite the broker's
# own settings (e.g. brokerPermission=0), which is an admin's right, not a robustness case.


def random_value(rng: random.Random) -> str:
    choice = rng.randrange(14)
    if choice == 0:
        return str(rng.randint(-5, 40))
    if choice == 1:
        return str(rng.randint(-(2**31), 2**31))
    if choice == 2:
        return rng.choice(["9223372036854775808", "-9223372036854775809", "1" * 40, "1e9",
                           "0x10", " 7 ", "NaN"])
    if choice == 3:
        return rng.choice(["", " ", "true", "false", "null", "None", "{}", "[]"])
    if choice == 4:
        return rng.choice(TOPICS)
    if choice == 5:
        return rng.choice(GROUPS)
    if choice == 6:
        return rng.choice(["*", "TagA || TagB", "||", "a = 1", "TAG", "SQL92", "CLASS"])
    if choice == 7:
        return "x" * rng.randint(200, 20_000)
    if choice == 8:
        return "".join(chr(rng.choice([0, 1, 2, 0x7F, 0xE9, 0x4E2D, 0x1F600, 0xFFFF]))
                       for _ in range(rng.randint(1, 12)))
    if choice == 9:
        return encode_properties({"TAGS": rng.choice(["TagA", ""]), "KEYS": "k1 k2",
                                  "DELAY": random_value(rng), "TRAN_MSG": "true",
                                  "UNIQ_KEY": "ABC"})
    if choice == 10:
        return "\x01\x02" * rng.randint(1, 5)
    return str(rng.randint(0, 8))


def random_json(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.randrange(9 if depth < 3 else 5)
    if choice == 0:
        return None
    if choice == 1:
        return rng.randint(-(2**63), 2**63)
    if choice == 2:
        return random_value(rng)
    if choice == 3:
        return rng.random() > 0.5
    if choice == 4:
        return rng.random() * 1e20
    if choice in (5, 6):
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["clientID", "groupName", "topic", "subString", "tagsSet", "codeSet",
                        "consumerDataSet", "producerDataSet", "subscriptionDataSet", "mqSet",
                        "brokerName", "queueId", "consumerGroup", "clientId", "expressionType",
                        "subscriptionData", "group", random_value(rng)]):
            random_json(rng, depth + 1) for _ in range(rng.randint(0, 5))}


def random_body(rng: random.Random, code: int) -> bytes | None:
    choice = rng.randrange(6)
    if choice == 0:
        return None
    if choice == 1:
        return rng.randbytes(rng.randint(1, 2000))
    if choice == 2 or code in (RequestCode.HEART_BEAT, RequestCode.LOCK_BATCH_MQ,
                               RequestCode.UNLOCK_BATCH_MQ, RequestCode.CHECK_CLIENT_CONFIG):
        document = random_json(rng)
        if code == RequestCode.HEART_BEAT and rng.random() < 0.5:
            document = {"clientID": random_value(rng), "consumerDataSet": [{
                "groupName": rng.choice(GROUPS), "consumeType": random_value(rng),
                "messageModel": rng.choice(["CLUSTERING", "BROADCASTING", 3, None]),
                "consumeFromWhere": random_value(rng), "subscriptionDataSet": [{
                    "topic": rng.choice(TOPICS), "subString": random_value(rng),
                    "tagsSet": random_json(rng, 2), "codeSet": random_json(rng, 2),
                    "subVersion": random_json(rng, 2),
                    "expressionType": random_value(rng)}]}],
                "producerDataSet": [{"groupName": random_json(rng, 2)}]}
        return json.dumps(document).encode()
    if choice == 3:
        entries = [BatchEntry(rng.randbytes(rng.randint(0, 50)),
                              encode_properties({"TAGS": "b", "DELAY": random_value(rng)}),
                              rng.randint(-5, 5)) for _ in range(rng.randint(0, 4))]
        body = encode_batch_body(entries)
        return body[:rng.randint(0, len(body))] if rng.random() < 0.5 else body
    if choice == 4:
        return b"x" * rng.randint(1, 100)
    return bytes(rng.randint(1, 64))


def random_request(rng: random.Random) -> RemotingCommand:
    """A well-framed request with a plausible or random code and random header values."""
    code = rng.choice([*FIELDS, rng.randint(0, 400), rng.randint(401, 32767)])
    if code == RequestCode.UPDATE_BROKER_CONFIG:
        code = RequestCode.GET_BROKER_CONFIG  # see the note at MAY_STAY_SILENT
    names = FIELDS.get(code, [])
    fields = {name: random_value(rng) for name in names if rng.random() < 0.85}
    for _ in range(rng.randint(0, 2)):
        fields[random_value(rng)[:30]] = random_value(rng)
    request = RemotingCommand.request(
        code, fields if fields or rng.random() < 0.5 else None, random_body(rng, code),
        serialize_type=rng.choice([SerializeType.JSON, SerializeType.ROCKETMQ]))
    if rng.random() < 0.1:
        request.flag = rng.choice([FLAG_ONEWAY, FLAG_RESPONSE, FLAG_RESPONSE | FLAG_ONEWAY, 0x7F])
    if rng.random() < 0.1:
        request.remark = random_value(rng)
    if rng.random() < 0.05:
        request.language = rng.randint(0, 255)
    request.version = rng.choice([409, 0, -1, 32767])
    return request


def mutate(rng: random.Random, data: bytes) -> bytes:
    """Flip, overwrite, insert, delete or cut bytes of a frame (keeping it non-empty)."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(out)) if out else 0
        action = rng.randrange(5)
        if action == 0 and out:
            out[at] ^= 1 << rng.randrange(8)
        elif action == 1:
            out[at:at + 4] = rng.randbytes(4)
        elif action == 2:
            out[at:at] = rng.randbytes(rng.randint(1, 16))
        elif action == 3 and len(out) > 1:
            del out[at:at + rng.randint(1, 8)]
        elif len(out) > 1:
            del out[rng.randint(1, len(out)):]
    return bytes(out or b"\x00")


@dataclass
class Case:
    """One fuzz input and how the broker may answer it."""

    label: str
    data: bytes
    request: RemotingCommand | None  # set when the bytes are exactly this request's frame
    wait_s: float
    must_answer: bool


def make_case(rng: random.Random, index: int) -> Case:
    kind = rng.choices(["request", "mutated", "random bytes"], weights=[6, 3, 1])[0]
    if kind == "random bytes":
        data = rng.randbytes(rng.randint(1, 256))
        if rng.random() < 0.5:  # a sane length prefix, so the header word gets looked at
            data = len(data).to_bytes(4, "big") + data
        return Case(f"#{index} random bytes", data, None, SILENCE_WAIT_S, False)
    request = random_request(rng)
    try:
        data = request.encode()
    except Exception:  # a value our own encoder refuses to write (e.g. an unknown language)
        request.serialize_type = SerializeType.JSON
        request.language = LanguageCode.PYTHON
        data = request.encode()
    label = f"#{index} {kind} code {request.code} {request.serialize_type.name}"
    if kind == "mutated":
        return Case(label, mutate(rng, data), None, SILENCE_WAIT_S, False)
    silent_ok = request.flag != 0 or request.code in MAY_STAY_SILENT
    wait_s = PULL_WAIT_S if request.code == RequestCode.PULL_MESSAGE else (
        SILENCE_WAIT_S if silent_ok else ANSWER_WAIT_S)
    return Case(label, data, request, wait_s, not silent_ok)


@dataclass
class CaseOutcome:
    """What one case got: ``kind`` is "answered", "closed" or "silent"; ``problem`` is None
    when the broker behaved, else what went wrong; ``answer`` is the response read, if any."""

    kind: str
    problem: str | None = None
    answer: RemotingCommand | None = None


def run_case(address: tuple[str, int], case: Case) -> CaseOutcome:
    """Send the case's bytes on a new connection, half-close, and judge what comes back:
    a closed connection (EOF or reset) is told apart from silence (nothing within
    ``case.wait_s``), and each is a problem only when ``case.must_answer``."""
    decoder = FrameDecoder()
    with socket.create_connection(address, timeout=case.wait_s) as connection:
        try:
            connection.sendall(case.data)
            connection.shutdown(socket.SHUT_WR)  # the broker answers what it has, then closes
        except OSError:
            return CaseOutcome("closed", "closed while the request was written"
                               if case.must_answer else None)
        try:
            while True:  # ends: each recv is bounded by the socket timeout
                chunk = connection.recv(65536)
                if not chunk:
                    return CaseOutcome("closed", "closed without an answer"
                                       if case.must_answer else None)
                commands = decoder.feed(chunk)
                if commands:
                    response = commands[0]
                    if case.request is not None and (
                            not response.is_response or response.opaque != case.request.opaque):
                        return CaseOutcome("answered",
                                           f"not a response to it: {response.describe()}",
                                           response)
                    return CaseOutcome("answered", None, response)
        except ConnectionResetError:
            return CaseOutcome("closed", "reset without an answer" if case.must_answer else None)
        except TimeoutError:
            return CaseOutcome("silent", f"no answer within {case.wait_s} s"
                               if case.must_answer else None)
        except Exception as e:  # the broker's bytes did not decode
            return CaseOutcome("answered", f"unreadable answer: {e!r}")


def health_check(address: tuple[str, int]) -> RemotingCommand:
    request = RemotingCommand.request(RequestCode.GET_MAX_OFFSET,
                                      {"topic": KEPT_TOPIC, "queueId": "0"})
    return remoting_call(f"{address[0]}:{address[1]}", request, HEALTH_WAIT_S)


def test_broker_survives_random_and_mutated_frames_and_keeps_answering(tidemq_cluster):
    seed = int(os.environ.get("TIDEMQ_FUZZ_SEED") or random.randrange(2**32))
    print(f"broker fuzz seed {seed}: rerun with TIDEMQ_FUZZ_SEED={seed}")
    rng = random.Random(seed)
    cluster = tidemq_cluster()
    broker = cluster.broker("broker-a")
    address = ("127.0.0.1", broker.port)

    async def store_kept_messages() -> None:
        async with Admin(namesrv=cluster.namesrv_addr) as admin:
            await admin.create_topic(KEPT_TOPIC, 1)
        async with Producer("fuzz_keeper", namesrv=cluster.namesrv_addr) as producer:
            for i in range(KEPT_MESSAGES):
                await producer.send(Message(KEPT_TOPIC, f"kept-{i}", tags="kept"),
                                    queue=MessageQueue(KEPT_TOPIC, "broker-a", 0))

    asyncio.run(store_kept_messages())

    problems: list[str] = []
    outcomes: collections.Counter[str] = collections.Counter()
    for index in range(CASES):
        case = make_case(rng, index)
        outcome = run_case(address, case)
        outcomes[outcome.kind] += 1
        if outcome.problem is not None:
            problems.append(f"{case.label}: {outcome.problem}")
        assert broker.running, (f"seed {seed}: the broker died on {case.label}\n"
                                f"{broker.log_tail()}")
        health = health_check(address)
        assert (health.code, health.ext_fields) == (
            ResponseCode.SUCCESS, {**(health.ext_fields or {}), "offset": str(KEPT_MESSAGES)}), (
            f"seed {seed}: after {case.label} GET_MAX_OFFSET answered {health.describe()}")
    print(f"broker fuzz outcomes: {dict(outcomes)}")
    assert not problems, f"seed {seed}:\n" + "\n".join(problems[:30])
    # Both halves were exercised: requests the broker answered, frames it refused.
    assert outcomes["answered"] > CASES // 3 and outcomes["closed"] > CASES // 20, outcomes

    async def read_kept() -> list[bytes]:
        async with PullConsumer("fuzz_reader", namesrv=cluster.namesrv_addr) as consumer:
            result = await consumer.pull(MessageQueue(KEPT_TOPIC, "broker-a", 0), 0, 32)
            return [message.body for message in result.messages]

    assert asyncio.run(read_kept()) == [f"kept-{i}".encode() for i in range(KEPT_MESSAGES)]
