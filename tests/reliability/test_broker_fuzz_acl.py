"""The broker fuzz (test_broker_fuzz.py's random requests, mutated frames and random bytes)
against a broker with aclEnable=true: no request gets past the ACL without a valid
signature, the broker stays up, and nothing is written, created or deleted.

Half of the random requests carry an AccessKey (a real account's or an unknown one) and a
Signature that is random, garbled, or a real signature of other content. A well-framed request
that expects an answer (not oneway) must get one, NO_PERMISSION, on its connection (a closed
connection or no answer within the broker fuzz's generous bound are failures, each named);
then the kept messages and the topic list are exactly as before. Rerun one seed with
``TIDEMQ_FUZZ_SEED=<seed>``.
"""

from __future__ import annotations

import asyncio
import os
import random

import orjson
import pytest
from test_broker_fuzz import (
    ANSWER_WAIT_S,
    CASES,
    KEPT_MESSAGES,
    KEPT_TOPIC,
    Case,
    make_case,
    run_case,
)

from server_processes import remoting_call
from tidemq.client import Admin, Credentials, Message, MessageQueue, Producer, PullConsumer
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.signature import ACCESS_KEY, SIGNATURE, Signer, sign_ext_fields

pytestmark = pytest.mark.reliability

ADMIN = Credentials("operator", "operator-secret")
ACL_YAML = """\
accounts:
  - accessKey: operator
    secretKey: operator-secret
    admin: true
  - accessKey: everyone
    secretKey: everyone-secret
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: PUB|SUB
"""


def forge(rng: random.Random, request: RemotingCommand) -> None:
    """Give ``request`` credentials that must not pass: a random or real access key with a
    random, garbled, or real-but-for-other-content signature."""
    fields = dict(request.ext_fields or {})
    access_key = rng.choice(["everyone", "operator", "nobody12", ""])
    kind = rng.randrange(3)
    if kind == 0:
        fields[SIGNATURE] = rng.randbytes(20).hex()
        fields[ACCESS_KEY] = access_key
    else:
        sign_ext_fields(fields, (request.body or b"") + b"x", access_key,
                        Signer(rng.choice(["everyone-secret", "operator-secret"])))
        if kind == 2:  # garble the real signature
            signature = list(fields[SIGNATURE])
            rng.shuffle(signature)
            fields[SIGNATURE] = "".join(signature)
    request.ext_fields = fields


def signed_request(code: int, fields: dict[str, str]) -> RemotingCommand:
    request = RemotingCommand.request(code, fields)
    sign_ext_fields(request.ext_fields, None, "operator", Signer("operator-secret"))
    return request


def test_no_request_gets_past_the_acl_without_a_valid_signature(tidemq_cluster, tmp_path):
    seed = int(os.environ.get("TIDEMQ_FUZZ_SEED") or random.randrange(2**32))
    print(f"ACL fuzz seed {seed}: rerun with TIDEMQ_FUZZ_SEED={seed}")
    rng = random.Random(seed)
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL_YAML)
    cluster = tidemq_cluster(broker_overrides={"aclEnable": "true",
                                               "aclFilePath": str(acl_file)})
    broker = cluster.broker("broker-a")
    address = ("127.0.0.1", broker.port)

    async def store_kept_messages() -> list[str]:
        async with Admin(cluster.namesrv_addr, credentials=ADMIN) as admin:
            await admin.create_topic(KEPT_TOPIC, 1)
        async with Producer("fuzz_keeper", cluster.namesrv_addr, credentials=ADMIN) as producer:
            for i in range(KEPT_MESSAGES):
                await producer.send(Message(KEPT_TOPIC, f"kept-{i}"),
                                    queue=MessageQueue(KEPT_TOPIC, "broker-a", 0))
        return await topics()

    def topic_names() -> set[str]:
        response = remoting_call(broker.addr, signed_request(RequestCode.GET_ALL_TOPIC_CONFIG,
                                                             {}))
        assert response.code == ResponseCode.SUCCESS, response.remark
        return set(orjson.loads(response.body)["topicConfigTable"])

    async def topics() -> list[str]:
        return sorted(topic_names())

    topics_before = asyncio.run(store_kept_messages())
    codes: dict[int, int] = {}
    problems: list[str] = []
    for index in range(CASES):
        case = make_case(rng, index)
        if case.request is not None:
            if rng.random() < 0.5:
                forge(rng, case.request)
                case = Case(case.label + " forged", case.request.encode(), case.request,
                            case.wait_s, case.must_answer)
            if case.request.flag == 0:
                # Refused before any processor, so even a pull or an END_TRANSACTION (which
                # may stay silent without ACL) gets its NO_PERMISSION: wait for it as long
                # as the broker fuzz waits for any answer (a busy machine is slow, a broker
                # that never answers is wrong).
                case = Case(case.label, case.data, case.request, ANSWER_WAIT_S, True)
        outcome = run_case(address, case)
        assert broker.running, f"seed {seed}: the broker died on {case.label}\n" \
                               f"{broker.log_tail()}"
        if outcome.problem is not None:
            problems.append(f"{case.label}: {outcome.problem}")
        answer = outcome.answer
        if case.request is not None and answer is not None:
            codes[answer.code] = codes.get(answer.code, 0) + 1
            assert answer.code == ResponseCode.NO_PERMISSION, (
                f"seed {seed}: {case.label} got past the ACL: {answer.describe()}")
        health = remoting_call(broker.addr, signed_request(
            RequestCode.GET_MAX_OFFSET, {"topic": KEPT_TOPIC, "queueId": "0"}))
        assert (health.code, (health.ext_fields or {}).get("offset")) == (
            ResponseCode.SUCCESS, str(KEPT_MESSAGES)), f"seed {seed}: after {case.label}"
    print(f"ACL fuzz answers by code: {codes}")
    assert not problems, f"seed {seed}:\n" + "\n".join(problems[:30])
    assert codes.get(ResponseCode.NO_PERMISSION, 0) > CASES // 3, codes
    assert asyncio.run(topics()) == topics_before  # nothing created or deleted

    async def read_kept() -> list[bytes]:
        async with PullConsumer("fuzz_reader", cluster.namesrv_addr,
                                credentials=ADMIN) as consumer:
            result = await consumer.pull(MessageQueue(KEPT_TOPIC, "broker-a", 0), 0, 32)
            return [message.body for message in result.messages]

    assert asyncio.run(read_kept()) == [f"kept-{i}".encode() for i in range(KEPT_MESSAGES)]
