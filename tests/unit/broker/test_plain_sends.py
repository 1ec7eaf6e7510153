"""Plain single sends served by columns (broker/plain_sends.py): the same stored records and
the same answer bytes as the general group path, and the general path for anything else."""

from __future__ import annotations

import asyncio

import pytest
from test_send_group import FakePeer, resolved
from test_send_processor import stored, with_topic

from tidemq.broker.plain_sends import (
    plain_messages,
    read_plain_sends,
    read_send_run,
    send_columns,
)
from tidemq.protocol.codes import FLAG_ONEWAY, FLAG_RESPONSE, RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.message import (
    SYSFLAG_MULTI_TAGS,
    decode_properties,
    decode_records,
    encode_properties,
)
from tidemq.protocol.send_run import SendRun, decode_send_run
from tidemq.remoting.dispatch import EncodedAnswers
from tidemq.store.record_encoder import index_keys, tag_code_of

PEER = "127.0.0.1:45678"
TOPIC = "Orders"


def producer_send(number: int, *, topic: str = TOPIC, queue_id: int | None = None,
                  properties: dict[str, str] | None = None, body: bytes | None = None,
                  extra_fields: dict[str, str] | None = None) -> RemotingCommand:
    """A SEND_MESSAGE_V2 request with the extFields tidemq's Producer sends for
    ``send(Message(...))`` (tests/unit/client pins that shape; the a..n short names)."""
    if properties is None:
        properties = {"UNIQ_KEY": f"C0A80001{number:024X}"}
    fields = {"a": "pg", "b": topic, "c": "TBW102", "d": "4",
              "e": str(number % 4 if queue_id is None else queue_id), "f": "0",
              "g": str(1_700_000_000_000 + number), "h": "0",
              "i": encode_properties(properties), "n": "broker-a", **(extra_fields or {})}
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, fields,
                                   body if body is not None else f"m{number}".encode())


def answer_bytes(requests, answered) -> bytes:
    """The bytes the dispatcher writes for a group handler's answer (dispatch.py)."""
    if type(answered) is EncodedAnswers:
        return answered.frames
    frames = []
    for request, response in zip(requests, answered, strict=True):
        response.opaque = request.opaque
        response.flag |= FLAG_RESPONSE
        response.serialize_type = request.serialize_type
        frames.append(response.encode())
    return b"".join(frames)


def as_run(requests: list[RemotingCommand]) -> SendRun:
    """``requests`` as the frame decoder hands a read of them over (protocol/send_run.py)."""
    data = b"".join(request.encode() for request in requests)
    decoded = decode_send_run(data, 0, 1 << 30, frames_min=1)
    assert decoded is not None and decoded[1] == len(data)
    return decoded[0]


def serve(broker, requests, *, plain: bool, run: bool = False):
    """One group through the server's group handler (``plain``; as a read's ``SendRun``
    with ``run``) or the general one; the topic's name was sent to once before, as the
    general path remembers names it checked."""

    async def scenario():
        peer = FakePeer(PEER)
        processor = broker.send_processor
        warm = producer_send(10_000, topic=requests[0].ext_fields["b"], queue_id=0)
        processor.handle_group_now([warm], peer)
        if run:
            answered = processor.serve_group_now(as_run(requests), peer)
        elif plain:
            answered = processor.serve_group_now(requests, peer)
        else:
            answered = processor.handle_group_now(requests, peer)
        if not isinstance(answered, (list, EncodedAnswers)):
            answered = await answered
        return answered

    return asyncio.run(scenario())


def records_of(broker, topic=TOPIC):
    """What two brokers store alike (a UNIQ_KEY the broker made for a send without one is
    random: only its presence compared; store times differ)."""
    return [
        (record.queue_offset, record.physical_offset, record.body,
         {**record.properties, "UNIQ_KEY": bool(record.properties.get("UNIQ_KEY"))},
         record.flag, record.sysflag, record.born_timestamp, record.born_host)
        for queue_id in range(4) for record in stored(broker, topic, queue_id)
    ]


def derived_of(broker, topic=TOPIC):
    """The consume-queue entries and what each stored message's keys find in the index."""
    entries = [broker.store.consume_queue_entries(topic, queue_id, 0, 1000)
               for queue_id in range(4)]
    keys = sorted({key for queue_id in range(4) for record in stored(broker, topic, queue_id)
                   for key in index_keys(record.properties)} - {""})
    found = [[decode_records(record)[0].physical_offset
              for record in broker.store.query_messages(topic, key, 64, 0, 2**62).records]
             for key in keys]
    return entries, keys, found


def columns_taken(broker) -> list[bool]:
    """Whether each ``put_send_columns`` of ``broker``'s store took its group."""
    store = broker.store
    put = store.put_send_columns
    taken: list[bool] = []

    def spied(sends):
        result = put(sends)
        taken.append(result is not None)
        return result

    store.put_send_columns = spied
    return taken


# The properties of a plain send: a UNIQ_KEY alone (tidemq's producer's commonest), one with
# separators in its value, and with tags and keys beside it.
PLAIN_PROPERTIES = {
    "uniq key": lambda n: None,
    "uniq key holding \\x01": lambda n: {"UNIQ_KEY": f"AB\x01{n}"},
    "tags and keys": lambda n: {"TAGS": "t", "UNIQ_KEY": f"C0A8{n:028X}", "KEYS": f"k{n} x"},
}


@pytest.mark.parametrize("properties", sorted(PLAIN_PROPERTIES))
@pytest.mark.parametrize("filter_type", ["SINGLE_TAG", "MULTI_TAG"])
@pytest.mark.parametrize("count", [2, 31])
def test_a_plain_group_is_stored_and_answered_as_the_general_path_does(
        make_broker, count, filter_type, properties):
    plain_broker, general_broker = make_broker(), make_broker()
    for broker in (plain_broker, general_broker):
        with_topic(broker, TOPIC, topic_filter_type=filter_type)
    requests = [producer_send(n, properties=PLAIN_PROPERTIES[properties](n))
                for n in range(count)]

    taken = columns_taken(plain_broker)

    plain = serve(plain_broker, requests, plain=True)
    general = serve(general_broker, requests, plain=False)

    assert type(plain) is EncodedAnswers  # the columns' path answered, not the general one
    assert taken == [True]  # the store took the group as columns
    assert plain.code == ResponseCode.SUCCESS
    assert answer_bytes(requests, plain) == answer_bytes(requests, general)
    assert records_of(plain_broker) == records_of(general_broker)
    plain_derived, general_derived = derived_of(plain_broker), derived_of(general_broker)
    assert plain_derived == general_derived
    assert len(plain_derived[1]) >= count  # each send's UNIQ_KEY at least
    entries = [entry for queue in plain_derived[0] for entry in queue]
    assert sorted(tag for _, _, tag in entries) == sorted(
        tag_code_of(record.properties) for queue_id in range(4)
        for record in stored(plain_broker, TOPIC, queue_id))
    assert [record.properties for queue_id in range(4)
            for record in stored(plain_broker, TOPIC, queue_id)] == [
        record.properties for queue_id in range(4)
        for record in stored(general_broker, TOPIC, queue_id)]
    records = records_of(plain_broker)
    assert len(records) == count + 1
    assert all(record[3]["CLUSTER"] and record[3]["UNIQ_KEY"] for record in records)
    assert all(bool(record[5] & SYSFLAG_MULTI_TAGS) == (filter_type == "MULTI_TAG")
               for record in records)


def not_plain_groups():
    """Groups with one send the columns' path must leave to the general one (by name)."""
    def group(odd):
        return [producer_send(0), odd, producer_send(2)]

    return {
        "WAIT property": group(producer_send(1, properties={"UNIQ_KEY": "AB" * 16,
                                                            "WAIT": "false"})),
        "no UNIQ_KEY": group(producer_send(1, properties={"TAGS": "t"})),
        "delayed": group(producer_send(1, properties={"UNIQ_KEY": "AB" * 16,
                                                      "DELAY": "2"})),
        "transactional": group(producer_send(1, properties={"UNIQ_KEY": "AB" * 16,
                                                            "TRAN_MSG": "true"})),
        "CLUSTER given": group(producer_send(1, properties={"UNIQ_KEY": "AB" * 16,
                                                            "CLUSTER": "other"})),
        "another topic": group(producer_send(1, topic="Other")),
        "a field more": group(producer_send(1, extra_fields={"j": "0"})),
        "queue out of range": group(producer_send(1, queue_id=9)),
        "body too large": group(producer_send(1, body=b"x" * (4 * 1024 * 1024 + 1))),
        "empty name in properties": group(producer_send(1, properties={
            "UNIQ_KEY": "AB" * 16, "": "v"})),
        "retry topic": [producer_send(n, topic="%RETRY%g") for n in range(3)],
    }


@pytest.mark.parametrize("name", sorted(not_plain_groups()))
def test_a_group_that_is_not_plain_is_answered_by_the_general_path(make_broker, name):
    plain_broker, general_broker = make_broker(), make_broker()
    for broker in (plain_broker, general_broker):
        for topic in (TOPIC, "Other", "%RETRY%g"):
            with_topic(broker, topic)

    plain = serve(plain_broker, not_plain_groups()[name], plain=True)
    general = serve(general_broker, not_plain_groups()[name], plain=False)

    assert type(plain) is list
    assert [r.code for r in plain] == [r.code for r in general]
    assert [r.remark for r in plain] == [r.remark for r in general]
    assert [r.ext_fields for r in plain] == [r.ext_fields for r in general]
    for topic in (TOPIC, "Other", "%RETRY%g"):
        assert records_of(plain_broker, topic) == records_of(general_broker, topic)


def test_a_oneway_send_in_the_group_leaves_it_to_the_general_path(broker):
    with_topic(broker, TOPIC)
    oneway = producer_send(1)
    oneway.flag |= FLAG_ONEWAY
    answered = serve(broker, [producer_send(0), oneway], plain=True)
    assert type(answered) is list
    assert len(records_of(broker)) == 3


def test_a_slave_refuses_a_plain_group_as_the_general_path_does(make_broker):
    slave = make_broker(broker_role="SLAVE", broker_id=1)
    with_topic(slave, TOPIC)
    answered = serve(slave, [producer_send(n) for n in range(3)], plain=True)
    assert type(answered) is list
    assert {r.code for r in answered} == {ResponseCode.SERVICE_NOT_AVAILABLE}


def test_plain_sends_that_arrive_together_over_the_network_are_answered_by_columns(
        broker, serve):
    with_topic(broker, TOPIC)
    processor = broker.send_processor
    by_columns = []
    serve_plain = processor._serve_plain

    def counted(sends, requests, connection):
        answered = serve_plain(sends, requests, connection)
        # Answered by columns, from a read's run (no command made per send)?
        by_columns.append((type(answered) is EncodedAnswers, type(requests) is SendRun))
        return answered

    processor._serve_plain = counted
    count = 200

    async def scenario():
        async with serve(broker) as link:
            await link.invoke(producer_send(count, queue_id=0))  # the topic's name checked
            requests = [producer_send(n) for n in range(count)]
            responses = await asyncio.gather(*(link.invoke(request) for request in requests))
            return responses, [stored(broker, TOPIC, queue_id) for queue_id in range(4)]

    responses, queues = asyncio.run(scenario())
    assert [r.code for r in responses] == [ResponseCode.SUCCESS] * count
    assert (True, True) in by_columns  # several sends of one read went the columns' way
    for queue_id in range(4):
        records = [record for record in queues[queue_id]
                   if record.body != f"m{count}".encode()]  # the first send, before them
        assert [record.body for record in records] == [
            f"m{n}".encode() for n in range(count) if n % 4 == queue_id]
        answered = [r for n, r in enumerate(responses) if n % 4 == queue_id]
        assert [int(r.ext_fields["queueOffset"]) for r in answered] == [
            record.queue_offset for record in records]
        assert [r.ext_fields["msgId"] for r in answered] == [
            record.offset_msg_id for record in records]


def test_under_sync_flush_a_plain_group_is_answered_once_synced_by_the_general_answers(
        make_broker, serve):
    broker = make_broker(store_kind="file", store_overrides={"flush_disk_type": "SYNC_FLUSH"})
    with_topic(broker, TOPIC)
    requests = [producer_send(n) for n in range(6)]

    async def scenario():
        async with serve(broker):
            peer = FakePeer(PEER)
            processor = broker.send_processor
            processor.handle_group_now([producer_send(99, queue_id=0)], peer)  # name checked
            answered = processor.serve_group_now(requests, peer)
            if not isinstance(answered, list):
                answered = await answered
            return answered, [await resolved(r) for r in answered], [
                stored(broker, TOPIC, queue_id) for queue_id in range(4)]

    answered, responses, queues = asyncio.run(scenario())
    assert type(answered) is list  # not EncodedAnswers: each waits for the disk's sync
    assert [r.code for r in responses] == [ResponseCode.SUCCESS] * 6
    for n, response in enumerate(responses):
        records = [record for record in queues[n % 4] if record.body == f"m{n}".encode()]
        assert response.ext_fields["msgId"] == records[0].offset_msg_id
        assert response.ext_fields["queueOffset"] == str(records[0].queue_offset)


@pytest.mark.parametrize("properties", sorted(PLAIN_PROPERTIES))
def test_a_plain_message_s_properties_text_says_what_its_properties_say(properties):
    # StoreMessage.properties_text is stored as it is, while the store takes tags and index
    # keys from the dict: the two must agree (store/interface.py).
    requests = [producer_send(n, properties=PLAIN_PROPERTIES[properties](n)) for n in range(3)]
    sends = read_plain_sends(requests)
    assert sends is not None
    messages = plain_messages(sends, "DefaultCluster", False, PEER)
    assert messages is not None
    for message in messages:
        assert message.properties["CLUSTER"] == "DefaultCluster"
        assert message.properties_text == encode_properties(message.properties)
        assert decode_properties(message.properties_text) == message.properties


@pytest.mark.parametrize("properties", sorted(PLAIN_PROPERTIES))
@pytest.mark.parametrize("multi_tags", [False, True])
def test_a_group_s_columns_say_what_its_messages_say(properties, multi_tags):
    # The store takes a group either way: as columns (send_columns) or as messages
    # (plain_messages, when it does not take the columns); both must say the same.
    requests = [producer_send(n, properties=PLAIN_PROPERTIES[properties](n)) for n in range(3)]
    sends = read_plain_sends(requests)
    assert sends is not None
    columns = send_columns(sends, "DefaultCluster", multi_tags, PEER)
    messages = plain_messages(sends, "DefaultCluster", multi_tags, PEER)
    assert columns is not None and messages is not None
    assert columns.topic == TOPIC and columns.born_host == PEER
    assert list(columns.properties) == [m.properties_text for m in messages]
    assert columns.queue_ids == [m.queue_id for m in messages]
    assert columns.bodies == [m.body for m in messages]
    assert columns.flags == [m.flag for m in messages]
    assert columns.sysflags == [m.sysflag for m in messages]
    assert columns.born_timestamps == [m.born_timestamp for m in messages]
    assert [list(keys) for keys in columns.keys] == [index_keys(m.properties) for m in messages]
    tags = [m.properties.get("TAGS") for m in messages]
    assert columns.tags == (None if tags == [None] * 3 else tags)


def test_a_group_the_store_leaves_is_stored_as_messages_and_answered_alike(make_broker):
    plain_broker, general_broker = make_broker(), make_broker()
    for broker in (plain_broker, general_broker):
        with_topic(broker, TOPIC)
    plain_broker.store.put_send_columns = lambda sends: None  # as a store without columns
    requests = [producer_send(n) for n in range(5)]

    plain = serve(plain_broker, requests, plain=True)
    general = serve(general_broker, requests, plain=False)

    assert type(plain) is EncodedAnswers
    assert answer_bytes(requests, plain) == answer_bytes(requests, general)
    assert records_of(plain_broker) == records_of(general_broker)
    assert derived_of(plain_broker) == derived_of(general_broker)


def test_a_request_whose_fields_are_not_text_is_not_plain():
    odd = producer_send(1)
    odd.ext_fields["g"] = 1_700_000_000_000  # a number, as a command made in process may hold
    assert read_plain_sends([producer_send(0), odd]) is None
    odd.ext_fields["g"] = "1700000000000"
    odd.ext_fields["e"] = ["0"]
    assert read_plain_sends([producer_send(0), odd]) is None


def _odd(change):
    """A group of three plain sends whose middle one ``change`` made odd."""
    def group():
        odd = producer_send(1)
        change(odd)
        return [producer_send(0), odd, producer_send(2)]
    return group


def _set_field(name, value):
    def change(request):
        request.ext_fields[name] = value
    return change


def _set(attribute, value):
    def change(request):
        setattr(request, attribute, value)
    return change


ODD_SENDS = {
    "SEND_MESSAGE v1": _set("code", int(RequestCode.SEND_MESSAGE)),
    "oneway": _set("flag", FLAG_ONEWAY),
    "a response": _set("flag", FLAG_RESPONSE),
    "ROCKETMQ header": _set("serialize_type", 1),
    "no body": _set("body", None),
    "no extFields": _set("ext_fields", None),
    "a field missing": lambda request: request.ext_fields.pop("h"),
    "transaction prepared sysFlag": _set_field("f", "4"),
    "transaction commit sysFlag": _set_field("f", "8"),
    "sysFlag past the table": _set_field("f", "1024"),
    "sysFlag not canonical": _set_field("f", "01"),
    "flag negative": _set_field("h", "-1"),
    "queue id past the table": _set_field("e", "1024"),
    "defaultTopicQueueNums not a number": _set_field("d", "four"),
    "born timestamp empty": _set_field("g", ""),
    "born timestamp of 19 digits": _set_field("g", "1" * 19),
    "born timestamp signed": _set_field("g", "+1700000000000"),
    "born timestamp of other digits": _set_field("g", "\u0661\u0667\u0660\u0660"),  # Arabic-Indic
}


@pytest.mark.parametrize("name", sorted(ODD_SENDS))
def test_a_group_with_one_odd_send_is_not_read_as_plain(name):
    assert read_plain_sends([producer_send(0), producer_send(1)]) is not None
    assert read_plain_sends(_odd(ODD_SENDS[name])()) is None


def test_a_plain_group_is_read_into_its_columns():
    requests = [producer_send(number) for number in range(5)]
    requests[3].ext_fields["f"] = str(SYSFLAG_MULTI_TAGS)
    requests[4].ext_fields["g"] = "1" * 18
    sends = read_plain_sends(requests)
    assert sends is not None
    assert sends.topic == TOPIC
    assert sends.queue_ids == [0, 1, 2, 3, 0]
    assert sends.sys_flags == [0, 0, 0, SYSFLAG_MULTI_TAGS, 0]
    assert sends.born_timestamps == [1_700_000_000_000 + n for n in range(4)] + [int("1" * 18)]
    assert sends.flags == [0] * 5
    assert list(sends.properties) == [request.ext_fields["i"] for request in requests]
    assert sends.bodies == [request.body for request in requests]
    assert sends.opaques == [request.opaque for request in requests]
    assert read_plain_sends([]) is None


@pytest.mark.parametrize("properties", sorted(PLAIN_PROPERTIES))
@pytest.mark.parametrize("count", [2, 31])
def test_a_read_s_run_of_plain_sends_is_stored_and_answered_as_their_commands_are(
        make_broker, count, properties):
    run_broker, commands_broker = make_broker(), make_broker()
    for broker in (run_broker, commands_broker):
        with_topic(broker, TOPIC)
    requests = [producer_send(n, properties=PLAIN_PROPERTIES[properties](n))
                for n in range(count)]

    by_run = serve(run_broker, requests, plain=True, run=True)
    by_commands = serve(commands_broker, requests, plain=True)

    assert type(by_run) is EncodedAnswers
    assert answer_bytes(requests, by_run) == answer_bytes(requests, by_commands)
    assert records_of(run_broker) == records_of(commands_broker)
    assert derived_of(run_broker) == derived_of(commands_broker)


@pytest.mark.parametrize("name", sorted(not_plain_groups()))
def test_a_read_s_run_that_is_not_plain_is_answered_by_the_general_path(make_broker, name):
    run_broker, general_broker = make_broker(), make_broker()
    for broker in (run_broker, general_broker):
        for topic in (TOPIC, "Other", "%RETRY%g"):
            with_topic(broker, topic)

    requests = not_plain_groups()[name]
    by_run = serve(run_broker, requests, plain=True, run=True)
    general = serve(general_broker, requests, plain=False)

    assert type(by_run) is list
    assert answer_bytes(requests, by_run) == answer_bytes(requests, general)
    for topic in (TOPIC, "Other", "%RETRY%g"):
        assert records_of(run_broker, topic) == records_of(general_broker, topic)


@pytest.mark.parametrize("name", sorted(ODD_SENDS))
def test_a_run_with_one_odd_send_is_not_read_as_plain(name):
    requests = _odd(ODD_SENDS[name])()
    decoded = decode_send_run(b"".join(request.encode() for request in requests), 0, 1 << 30,
                              frames_min=1)
    # Not a run at all (the frame decoder's rules), or a run the broker does not read.
    assert decoded is None or read_send_run(decoded[0]) is None


def test_a_run_is_read_into_the_columns_of_its_commands():
    requests = [producer_send(number) for number in range(5)]
    requests[3].ext_fields["f"] = str(SYSFLAG_MULTI_TAGS)
    requests[4].ext_fields["g"] = "1" * 18
    run = as_run(requests)
    assert read_send_run(run) == read_plain_sends(requests)
    assert read_send_run(run) == read_plain_sends(run.commands())
