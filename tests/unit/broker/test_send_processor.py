"""SEND_MESSAGE / SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE: responses, stored bytes, every check."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

import pytest

from data_paths import CLIENT_FRAMES_DIR
from tidemq.broker.config import PERM_READ, PERM_WRITE
from tidemq.broker.topic_config_manager import TopicConfig
from tidemq.protocol.codes import RequestCode, ResponseCode, SerializeType
from tidemq.protocol.command import RemotingCommand, decode_command
from tidemq.protocol.headers import SendMessageRequestHeader
from tidemq.protocol.message import (
    SYSFLAG_MULTI_TAGS,
    BatchEntry,
    decode_records,
    encode_batch_body,
    encode_properties,
)
from tidemq.protocol.msgid import decode_offset_msg_id, encode_offset_msg_id
from tidemq.store.interface import PutStatus

ORACLE_FRAMES = CLIENT_FRAMES_DIR
PEER_ADDRESS = "127.0.0.1:45678"


def send_request(
    topic: str,
    body: bytes = b"hello",
    *,
    code: int = RequestCode.SEND_MESSAGE_V2,
    properties: dict[str, str] | None = None,
    queue_id: int = 0,
    default_topic: str = "TBW102",
    default_topic_queue_nums: int = 4,
    sys_flag: int = 0,
    flag: int = 0,
    reconsume_times: int | None = None,
    max_reconsume_times: int | None = None,
    serialize_type: SerializeType = SerializeType.JSON,
) -> RemotingCommand:
    if properties is None:
        properties = {"TAGS": "TagA", "KEYS": "k1 k2", "WAIT": "true"}
    header = SendMessageRequestHeader(
        producer_group="pg",
        topic=topic,
        default_topic=default_topic,
        default_topic_queue_nums=default_topic_queue_nums,
        queue_id=queue_id,
        sys_flag=sys_flag,
        born_timestamp=1_700_000_000_123,
        flag=flag,
        properties=encode_properties(properties),
        reconsume_times=reconsume_times,
        max_reconsume_times=max_reconsume_times,
        batch=code == RequestCode.SEND_BATCH_MESSAGE,
    )
    ext_fields = header.to_ext_fields(v2=code != RequestCode.SEND_MESSAGE)
    return RemotingCommand.request(code, ext_fields, body, serialize_type=serialize_type)


def stored(broker, topic: str, queue_id: int = 0, offset: int = 0):
    result = broker.store.get_messages(topic, queue_id, offset, 64, 64 * 1024 * 1024)
    return decode_records(result.body)


def ask(broker, handlers, *requests, peer_address: str = PEER_ADDRESS):
    table = handlers(broker)

    async def scenario():
        return [await table.ask(request, peer_address=peer_address) for request in requests]

    responses = asyncio.run(scenario())
    return responses[0] if len(responses) == 1 else responses


def with_topic(broker, name: str, queues: int = 4, **fields) -> None:
    broker.topic_config_manager.update(TopicConfig(name, queues, queues, **fields))


# -- accepted sends -----------------------------------------------------------------------------


@pytest.mark.parametrize("code", [RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2])
def test_send_is_stored_and_answered_with_offset_msg_id(broker, handlers, code):
    with_topic(broker, "Orders")
    properties = {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "AB" * 16, "WAIT": "true"}
    first, second = ask(
        broker,
        handlers,
        send_request("Orders", b"one", code=code, properties=properties, flag=7),
        send_request("Orders", b"two", code=code, properties=properties),
    )
    assert first.code == ResponseCode.SUCCESS, first.remark
    assert first.is_response
    ext = first.ext_fields
    assert ext["queueId"] == "0"
    assert ext["queueOffset"] == "0"
    assert ext["MSG_REGION"] == "DefaultRegion"
    assert ext["TRACE_ON"] == "true"
    assert second.ext_fields["queueOffset"] == "1"
    records = stored(broker, "Orders")
    assert [r.body for r in records] == [b"one", b"two"]
    record = records[0]
    assert ext["msgId"] == encode_offset_msg_id(broker.broker_address, record.physical_offset)
    assert decode_offset_msg_id(ext["msgId"]) == (broker.broker_address, record.physical_offset)
    assert record.properties == {
        "TAGS": "TagA",
        "KEYS": "k1 k2",
        "UNIQ_KEY": "AB" * 16,
        "CLUSTER": "DefaultCluster",
    }
    assert record.born_host == PEER_ADDRESS
    assert record.born_timestamp == 1_700_000_000_123
    assert record.flag == 7
    assert record.queue_offset == 0
    assert record.store_host == broker.broker_address


def test_broker_generates_a_missing_unique_key(broker, handlers):
    with_topic(broker, "Orders")
    response = ask(broker, handlers, send_request("Orders", properties={"TAGS": "a"}))
    assert response.code == ResponseCode.SUCCESS
    unique_key = stored(broker, "Orders")[0].properties["UNIQ_KEY"]
    assert len(unique_key) == 32
    int(unique_key, 16)


def test_multi_tag_topic_sets_the_multi_tags_sysflag(broker, handlers):
    with_topic(broker, "Tagged", topic_filter_type="MULTI_TAG")
    with_topic(broker, "Plain")
    ask(broker, handlers, send_request("Tagged"), send_request("Plain"))
    assert stored(broker, "Tagged")[0].sysflag & SYSFLAG_MULTI_TAGS
    assert not stored(broker, "Plain")[0].sysflag & SYSFLAG_MULTI_TAGS


def test_negative_queue_id_picks_a_writable_queue(broker, handlers):
    with_topic(broker, "Orders", queues=3)
    responses = ask(broker, handlers, *[send_request("Orders", queue_id=-1) for _ in range(12)])
    queue_ids = {int(r.ext_fields["queueId"]) for r in responses}
    assert queue_ids <= {0, 1, 2}
    assert sum(len(stored(broker, "Orders", q)) for q in range(3)) == 12


def test_batch_is_one_put_with_batch_properties_on_every_message(broker, handlers):
    with_topic(broker, "Orders")
    entries = [
        BatchEntry(b"m0", encode_properties({"TAGS": "a", "UNIQ_KEY": "00" * 16, "WAIT": "true"})),
        BatchEntry(b"m1", encode_properties({"TAGS": "b", "KEYS": "order-1"}), flag=3),
        BatchEntry(b"m2", ""),
    ]
    request = send_request(
        "Orders",
        encode_batch_body(entries),
        code=RequestCode.SEND_BATCH_MESSAGE,
        properties={"WAIT": "true", "SHARED": "yes"},
        queue_id=2,
    )
    response = ask(broker, handlers, request)
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert response.ext_fields["queueId"] == "2"
    assert response.ext_fields["queueOffset"] == "0"
    records = stored(broker, "Orders", 2)
    assert [r.body for r in records] == [b"m0", b"m1", b"m2"]
    assert [r.queue_offset for r in records] == [0, 1, 2]
    assert response.ext_fields["msgId"].split(",") == [
        encode_offset_msg_id(broker.broker_address, r.physical_offset) for r in records
    ]
    for record in records:
        assert "WAIT" not in record.properties
        assert record.properties["SHARED"] == "yes"
        assert record.properties["CLUSTER"] == "DefaultCluster"
        assert len(record.properties["UNIQ_KEY"]) == 32
        assert record.born_host == PEER_ADDRESS
    assert records[0].properties["UNIQ_KEY"] == "00" * 16
    assert records[1].properties["KEYS"] == "order-1"
    assert records[1].flag == 3


def test_every_oracle_send_frame_of_real_clients_is_stored(broker, handlers):
    frames = sorted(ORACLE_FRAMES.glob("*/*_c2s_code310.bin")) + sorted(
        ORACLE_FRAMES.glob("*/*_c2s_code10.bin")
    )
    assert len(frames) >= 20
    requests = [decode_command(frame.read_bytes()[4:]) for frame in frames]
    responses = ask(broker, handlers, *requests)
    for frame, request, response in zip(frames, requests, responses, strict=True):
        assert response.code == ResponseCode.SUCCESS, (frame, response.remark)
        assert response.opaque == request.opaque
        assert all(isinstance(v, str) for v in response.ext_fields.values())
    topics = {r.ext_fields.get("b") or r.ext_fields.get("topic") for r in requests}
    for topic in topics:
        # created from TBW102 with the clients' 4 queues
        assert broker.topic_config_manager.get(topic).write_queue_nums == 4
    assert broker.stats.put_message_times_total == len(frames)


# -- refused sends ------------------------------------------------------------------------------


def test_missing_header_field_is_system_error_naming_it(broker, handlers):
    request = send_request("Orders")
    del request.ext_fields["b"]
    response = ask(broker, handlers, request)
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "'b' (topic)" in response.remark
    request = send_request("Orders")
    request.ext_fields["e"] = "first"
    response = ask(broker, handlers, request)
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "queueId" in response.remark and "first" in response.remark
    assert broker.store.commit_log_max_offset() == 0


def test_slave_refuses_sends(make_broker, handlers):
    broker = make_broker(broker_role="SLAVE", broker_id=1)
    response = ask(broker, handlers, send_request("Orders"))
    assert response.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "slave" in response.remark and "Orders" in response.remark


def test_read_only_broker_refuses_sends(make_broker, handlers):
    broker = make_broker(broker_permission=PERM_READ)
    response = ask(broker, handlers, send_request("Orders"))
    assert response.code == ResponseCode.NO_PERMISSION
    assert "brokerPermission=4" in response.remark and "Orders" in response.remark
    assert broker.store.commit_log_max_offset() == 0


def test_five_mib_body_is_refused_before_the_store_is_touched(broker, handlers):
    response = ask(broker, handlers, send_request("BigTopic", b"x" * (5 * 1024 * 1024)))
    assert response.code == ResponseCode.MESSAGE_ILLEGAL
    assert "5242880 bytes" in response.remark
    assert "maxMessageSize=4194304" in response.remark
    assert broker.store.commit_log_max_offset() == 0
    assert broker.topic_config_manager.get("BigTopic") is None  # not even auto-created


def test_body_limit_follows_max_message_size(make_broker, handlers):
    broker = make_broker(store_overrides={"max_message_size": 100})
    with_topic(broker, "Orders")
    too_big, fits = ask(
        broker, handlers, send_request("Orders", b"x" * 101), send_request("Orders", b"x" * 100)
    )
    assert too_big.code == ResponseCode.MESSAGE_ILLEGAL
    assert "maxMessageSize=100" in too_big.remark
    assert fits.code == ResponseCode.SUCCESS


def test_properties_over_32767_bytes_are_refused(broker, handlers):
    with_topic(broker, "Orders")
    response = ask(broker, handlers, send_request("Orders", properties={"BIG": "v" * 40000}))
    assert response.code == ResponseCode.MESSAGE_ILLEGAL
    assert "32767" in response.remark
    assert broker.store.commit_log_max_offset() == 0


@pytest.mark.parametrize(
    ("topic", "words"),
    [
        ("bad topic!", "characters outside"),
        ("x" * 128, "longer than the limit of 127"),
        ("SCHEDULE_TOPIC_XXXX", "system topic"),
        ("RMQ_SYS_TRANS_HALF_TOPIC", "system topic"),
        ("OFFSET_MOVED_EVENT", "system topic"),
    ],
)
def test_invalid_and_system_topics_are_system_error(broker, handlers, topic, words):
    response = ask(broker, handlers, send_request(topic))
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert words in response.remark
    assert broker.store.commit_log_max_offset() == 0


def test_a_topic_sent_to_before_is_refused_once_the_broker_stops_taking_writes(broker,
                                                                               handlers):
    # A topic's name is checked once (it passes or fails by its text alone); the broker's
    # state is checked on every send: a fence after a stored send refuses the next one.
    with_topic(broker, "Orders")
    for topic in ("bad topic!", "SCHEDULE_TOPIC_XXXX"):  # refused every time, not only once
        again = ask(broker, handlers, send_request(topic), send_request(topic))
        assert [response.code for response in again] == [ResponseCode.SYSTEM_ERROR] * 2
    stored = ask(broker, handlers, send_request("Orders"))
    broker.role.fence("lease lost (test)")
    fenced = ask(broker, handlers, send_request("Orders"))
    assert stored.code == ResponseCode.SUCCESS
    assert fenced.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "fenced: lease lost (test)" in fenced.remark and "Orders" in fenced.remark


def test_unknown_topic_is_created_from_tbw102(make_broker, handlers, fake_namesrv):
    async def scenario():
        async with fake_namesrv() as namesrv:
            broker = make_broker(namesrv_addr=namesrv.address)
            await broker.start()
            try:
                await namesrv.wait_registrations(1)
                response = await handlers(broker).ask(send_request("Fresh"))
                # the new topic is registered with the name servers at once
                await namesrv.wait_registrations(2)
                records = stored(broker, "Fresh")
                return broker, response, namesrv.registrations[-1].body, records
            finally:
                await broker.shutdown(grace_s=1.0)

    broker, response, registered, records = asyncio.run(scenario())
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert broker.topic_config_manager.get("Fresh") == TopicConfig(
        "Fresh", 4, 4, perm=PERM_READ | PERM_WRITE
    )
    assert b'"Fresh"' in registered
    assert len(records) == 1


def test_unknown_topic_without_auto_create_is_topic_not_exist(make_broker, handlers):
    broker = make_broker(auto_create_topic_enable=False)
    response = ask(broker, handlers, send_request("Missing"))
    assert response.code == ResponseCode.TOPIC_NOT_EXIST
    assert "topic Missing does not exist" in response.remark
    assert "tidemq admin updateTopic -t Missing" in response.remark
    assert "autoCreateTopicEnable=true" in response.remark
    assert broker.topic_config_manager.get("Missing") is None


def test_unknown_topic_with_a_template_that_cannot_be_inherited(broker, handlers):
    with_topic(broker, "NotATemplate")
    response = ask(broker, handlers, send_request("Missing", default_topic="NotATemplate"))
    assert response.code == ResponseCode.TOPIC_NOT_EXIST
    assert "NotATemplate" in response.remark


def test_queue_id_out_of_range_is_system_error(broker, handlers):
    with_topic(broker, "Orders", queues=4)
    response = ask(broker, handlers, send_request("Orders", queue_id=4))
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "queueId 4" in response.remark and "Orders" in response.remark
    assert broker.store.commit_log_max_offset() == 0


def test_read_only_topic_refuses_sends(broker, handlers):
    with_topic(broker, "ReadOnly", perm=PERM_READ)
    response = ask(broker, handlers, send_request("ReadOnly"))
    assert response.code == ResponseCode.NO_PERMISSION
    assert "ReadOnly" in response.remark


# -- retry and dead-letter topics ---------------------------------------------------------------


def test_retry_send_goes_to_the_retry_topic_then_the_dlq(broker, handlers):
    retry, dead, header_limit = ask(
        broker,
        handlers,
        send_request("%RETRY%g1", reconsume_times=3),
        send_request("%RETRY%g1", reconsume_times=17),
        send_request("%RETRY%g1", reconsume_times=3, max_reconsume_times=2),
    )
    for response in (retry, dead, header_limit):
        assert response.code == ResponseCode.SUCCESS, response.remark
    assert broker.topic_config_manager.get("%RETRY%g1").write_queue_nums == 1
    retried = stored(broker, "%RETRY%g1")
    assert len(retried) == 1
    assert retried[0].reconsume_times == 3
    dead_letters = stored(broker, "%DLQ%g1")
    assert [r.reconsume_times for r in dead_letters] == [17, 3]
    assert broker.topic_config_manager.get("%DLQ%g1").write_queue_nums == 1


def test_retry_send_for_an_unknown_group_without_auto_create(make_broker, handlers):
    broker = make_broker(auto_create_subscription_group=False)
    response = ask(broker, handlers, send_request("%RETRY%nobody", reconsume_times=1))
    assert response.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    assert "nobody" in response.remark


# -- refused batches ----------------------------------------------------------------------------


def batch_request(topic: str, entries: list[BatchEntry], **kwargs) -> RemotingCommand:
    return send_request(
        topic, encode_batch_body(entries), code=RequestCode.SEND_BATCH_MESSAGE, **kwargs
    )


@pytest.mark.parametrize(
    ("request_factory", "words"),
    [
        (lambda: batch_request("Orders", [BatchEntry(b"a", "DELAY\x013")]), "delay level 3"),
        (lambda: batch_request("Orders", [BatchEntry(b"a")], sys_flag=0x4), "transactional"),
        (
            lambda: send_request("Orders", b"\x00\x00\x00\x30garbage", code=320),
            "malformed",
        ),
        (lambda: send_request("Orders", b"", code=320), "no messages"),
        (lambda: batch_request("%RETRY%g1", [BatchEntry(b"a")]), "retry topic"),
    ],
)
def test_bad_batches_are_message_illegal(broker, handlers, request_factory, words):
    with_topic(broker, "Orders")
    response = ask(broker, handlers, request_factory())
    assert response.code == ResponseCode.MESSAGE_ILLEGAL
    assert words in response.remark
    assert broker.store.commit_log_max_offset() == 0


# -- durability ---------------------------------------------------------------------------------


class GatedStore:
    """A store whose appends become durable only when the test says so."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.gates: list[concurrent.futures.Future] = []

    def _gate(self, result):
        gate: concurrent.futures.Future = concurrent.futures.Future()
        result.durable = gate
        self.gates.append(gate)
        return result

    def put_message(self, message):
        return self._gate(self.inner.put_message(message))

    def put_messages(self, messages):
        return self._gate(self.inner.put_messages(messages))

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_sync_flush_send_is_answered_only_after_it_is_durable(make_broker, handlers):
    broker = make_broker(wrap_store=GatedStore)
    gated = broker.store
    with_topic(broker, "Orders")

    async def scenario():
        table = handlers(broker)
        answers = []
        pending = asyncio.create_task(table.ask(send_request("Orders")))
        pending.add_done_callback(lambda _: answers.append("answered"))
        for _ in range(50):  # let the handler run up to its wait
            await asyncio.sleep(0)
        assert len(gated.gates) == 1
        assert answers == []  # stored, but not durable: no answer yet
        gated.gates[0].set_result(PutStatus.PUT_OK)
        response = await asyncio.wait_for(pending, 10)
        # WAIT=false: answered without waiting for the disk
        no_wait = await table.ask(send_request("Orders", properties={"WAIT": "false"}))
        # the disk did not make it in time: FLUSH_DISK_TIMEOUT, still counted as stored
        late = asyncio.create_task(table.ask(send_request("Orders")))
        for _ in range(50):
            await asyncio.sleep(0)
        gated.gates[2].set_result(PutStatus.FLUSH_DISK_TIMEOUT)
        return response, no_wait, await asyncio.wait_for(late, 10)

    response, no_wait, late = asyncio.run(scenario())
    assert response.code == ResponseCode.SUCCESS
    assert no_wait.code == ResponseCode.SUCCESS
    assert not gated.gates[1].done()
    assert late.code == ResponseCode.FLUSH_DISK_TIMEOUT
    assert late.ext_fields["queueOffset"] == "2"
    assert late.ext_fields["msgId"]
    assert "syncFlushTimeout" in late.remark


def test_file_store_sync_flush_over_loopback(make_broker, serve):
    """One run on the real FileMessageStore, SYNC_FLUSH, both header encodings, over TCP."""
    broker = make_broker(store_kind="file", store_overrides={"flush_disk_type": "SYNC_FLUSH"})
    with_topic(broker, "Orders")
    durable_at_answer = []
    real_put = broker.store.put_message

    def put_and_watch(message):
        result = real_put(message)
        durable_at_answer.append(result)
        return result

    broker.store.put_message = put_and_watch
    batch = encode_batch_body([BatchEntry(b"b0"), BatchEntry(b"b1")])

    async def scenario():
        async with serve(broker) as link:
            single = await link.invoke(send_request("Orders", b"s0"))
            assert durable_at_answer[0].durable is not None
            assert durable_at_answer[0].durable.done()  # answered after the fsync
            binary = await link.invoke(
                send_request("Orders", b"s1", serialize_type=SerializeType.ROCKETMQ)
            )
            batched = await link.invoke(
                send_request("Orders", batch, code=RequestCode.SEND_BATCH_MESSAGE)
            )
            return single, binary, batched, stored(broker, "Orders")

    single, binary, batched, records = asyncio.run(scenario())
    assert single.code == binary.code == batched.code == ResponseCode.SUCCESS
    assert binary.serialize_type == SerializeType.ROCKETMQ
    assert binary.ext_fields["queueOffset"] == "1"
    assert batched.ext_fields["queueOffset"] == "2"
    assert len(batched.ext_fields["msgId"].split(",")) == 2
    assert [r.body for r in records] == [b"s0", b"s1", b"b0", b"b1"]
    assert all(r.born_host.startswith("127.0.0.1:") for r in records)


def test_a_send_has_the_topics_other_queue_files_made_ahead(make_broker, handlers):
    # The first send to a topic asks the store to make its other queues' first files in the
    # background, so their first messages do not create files on the event loop.
    import time

    broker = make_broker(store_kind="file",
                         store_overrides={"mapped_file_size_consume_queue": 6_000_000})
    with_topic(broker, "Wide", 4)
    assert ask(broker, handlers, send_request("Wide", b"first")).code == ResponseCode.SUCCESS
    queue_dir = Path(broker.store_config.store_path_root_dir) / "consumequeue" / "Wide"
    deadline = time.monotonic() + 10
    while not all((queue_dir / str(q) / "00000000000000000000").exists() for q in (1, 2, 3)):
        assert time.monotonic() < deadline, "the other queues' files were not made ahead"
        time.sleep(0.005)
    response = ask(broker, handlers, send_request("Wide", b"second", queue_id=3))
    assert response.code == ResponseCode.SUCCESS
    assert [r.body for r in stored(broker, "Wide", 3)] == [b"second"]
