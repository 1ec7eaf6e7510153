"""Sends that arrive together (``handle_group``): each answered as ``handle`` answers it, the
single messages stored in one append, every queue in arrival order."""

from __future__ import annotations

import asyncio

import pytest
from test_send_processor import send_request, stored, with_topic

from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.message import BatchEntry, encode_batch_body, encode_properties
from tidemq.protocol.msgid import decode_offset_msg_id
from tidemq.remoting.dispatch import LaterResponse

PEER = "127.0.0.1:45678"


class FakePeer:
    """The parts of a Connection the send handlers read."""

    def __init__(self, remote_address: str) -> None:
        self.remote_address = remote_address
        self.attributes: dict = {}
        self.on_close: list = []
        self.is_closing = False
        self.loop = asyncio.get_running_loop()

    def flush(self) -> None:
        """Nothing is corked here: a handler's responses are returned to the caller."""


def batch_request(topic: str, bodies: list[bytes], queue_id: int):
    entries = [BatchEntry(body, encode_properties({"TAGS": "b"})) for body in bodies]
    body = encode_batch_body(entries)
    return send_request(
        topic, body, code=RequestCode.SEND_BATCH_MESSAGE, queue_id=queue_id,
        properties={"WAIT": "true"},
    )


async def resolved(response):
    """A SYNC_FLUSH send's ``LaterResponse`` once resolved; any other response as it is."""
    if isinstance(response, LaterResponse):
        answer = asyncio.get_running_loop().create_future()
        response.on_resolved(answer.set_result)
        return await answer
    return response


def serve_group(broker, requests):
    async def scenario():
        responses = await broker.send_processor.handle_group(requests, FakePeer(PEER))
        return [await resolved(response) for response in responses]

    return asyncio.run(scenario())


def serve_one_by_one(broker, requests):
    async def scenario():
        return [await resolved(await broker.send_processor.handle(r, FakePeer(PEER)))
                for r in requests]

    return asyncio.run(scenario())


@pytest.mark.parametrize("count", [3, 20])
def test_group_of_single_sends_is_stored_in_order_per_queue(broker, count):
    with_topic(broker, "Orders")
    requests = [
        send_request("Orders", f"m{n}".encode(), queue_id=n % 3,
                     properties={"TAGS": "t", "KEYS": f"k{n}", "WAIT": "true"})
        for n in range(count)
    ]
    responses = serve_group(broker, requests)

    assert [response.code for response in responses] == [ResponseCode.SUCCESS] * count
    for queue_id in range(3):
        expected = [f"m{n}".encode() for n in range(count) if n % 3 == queue_id]
        records = stored(broker, "Orders", queue_id)
        assert [record.body for record in records] == expected
        answered = [r for n, r in enumerate(responses) if n % 3 == queue_id]
        assert [int(r.ext_fields["queueOffset"]) for r in answered] == list(range(len(expected)))
        assert [r.ext_fields["queueId"] for r in answered] == [str(queue_id)] * len(expected)
        assert [decode_offset_msg_id(r.ext_fields["msgId"])[1] for r in answered] == [
            record.physical_offset for record in records
        ]
        assert all(record.born_host == PEER for record in records)
        assert all(record.properties["CLUSTER"] for record in records)


def test_group_answers_bad_sends_as_handle_does_and_stores_the_rest(make_broker):
    def mixed_requests():
        return [
            send_request("Orders", b"first", queue_id=0),
            send_request("Bad Topic!", b"illegal topic name"),
            send_request("Orders", b"x" * (4 * 1024 * 1024 + 1), queue_id=1),
            send_request("Orders", b"queue out of range", queue_id=99),
            send_request("Orders", b"last", queue_id=0),
        ]

    grouped_broker, single_broker = make_broker(), make_broker()
    for broker in (grouped_broker, single_broker):
        with_topic(broker, "Orders")
    grouped = serve_group(grouped_broker, mixed_requests())
    one_by_one = serve_one_by_one(single_broker, mixed_requests())

    assert [r.code for r in grouped] == [r.code for r in one_by_one]
    assert [r.remark for r in grouped] == [r.remark for r in one_by_one]
    assert grouped[0].code == ResponseCode.SUCCESS
    assert grouped[1].code != ResponseCode.SUCCESS
    assert grouped[2].code == ResponseCode.MESSAGE_ILLEGAL
    assert [record.body for record in stored(grouped_broker, "Orders", 0)] == [b"first", b"last"]


def test_a_batch_in_the_group_keeps_its_place_in_the_queue_order(broker):
    with_topic(broker, "Orders")
    requests = [
        send_request("Orders", b"before", queue_id=2),
        batch_request("Orders", [b"b1", b"b2"], queue_id=2),
        send_request("Orders", b"after", queue_id=2),
    ]
    responses = serve_group(broker, requests)

    assert [r.code for r in responses] == [ResponseCode.SUCCESS] * 3
    assert [record.body for record in stored(broker, "Orders", 2)] == [
        b"before", b"b1", b"b2", b"after"
    ]
    assert responses[1].ext_fields["queueOffset"] == "1"
    assert len(responses[1].ext_fields["msgId"].split(",")) == 2


def test_delayed_send_in_a_group_is_answered_with_the_producers_queue(broker):
    with_topic(broker, "Orders")
    requests = [
        send_request("Orders", b"now", queue_id=1),
        send_request("Orders", b"later", queue_id=1,
                     properties={"DELAY": "2", "WAIT": "true"}),
    ]
    responses = serve_group(broker, requests)

    assert [r.code for r in responses] == [ResponseCode.SUCCESS] * 2
    assert [r.ext_fields["queueId"] for r in responses] == ["1", "1"]
    assert [record.body for record in stored(broker, "Orders", 1)] == [b"now"]
    assert [record.body for record in stored(broker, "SCHEDULE_TOPIC_XXXX", 1)] == [b"later"]


def test_group_still_reroutes_special_sends_between_plain_ones(broker):
    """Plain sends skip the special-delivery hook; a transactional one still becomes a half
    and a forged scheduler mark (DELAY_QUEUE_OFFSET) is still dropped."""
    with_topic(broker, "Orders")
    requests = [
        send_request("Orders", b"plain", queue_id=0),
        send_request("Orders", b"forged mark", queue_id=0,
                     properties={"DELAY_QUEUE_OFFSET": "2:0", "WAIT": "true"}),
        send_request("Orders", b"half", queue_id=0,
                     properties={"TRAN_MSG": "true", "PGROUP": "pg", "WAIT": "true"}),
        send_request("Orders", b"plain again", queue_id=0),
    ]
    responses = serve_group(broker, requests)

    assert [r.code for r in responses] == [ResponseCode.SUCCESS] * 4
    records = stored(broker, "Orders", 0)
    assert [record.body for record in records] == [b"plain", b"forged mark", b"plain again"]
    assert "DELAY_QUEUE_OFFSET" not in records[1].properties
    assert [record.body for record in stored(broker, "RMQ_SYS_TRANS_HALF_TOPIC", 0)] == [b"half"]


def test_sends_over_the_network_that_arrive_together_are_all_stored(broker, serve):
    with_topic(broker, "Orders")
    count = 200

    async def scenario():
        async with serve(broker) as link:
            requests = [
                send_request("Orders", f"m{n}".encode(), queue_id=n % 4) for n in range(count)
            ]
            responses = await asyncio.gather(*(link.invoke(request) for request in requests))
            queues = [stored(broker, "Orders", queue_id) for queue_id in range(4)]
            return responses, queues

    responses, queues = asyncio.run(scenario())
    assert [r.code for r in responses] == [ResponseCode.SUCCESS] * count
    for queue_id, records in enumerate(queues):
        assert [record.body for record in records] == [
            f"m{n}".encode() for n in range(count) if n % 4 == queue_id
        ]


# -- batches served in one loop iteration: one append (broker/batch_appender.py) -------------


def count_put_batches(broker) -> list[int]:
    """The number of batches of each ``put_batches`` call the broker makes from now on."""
    calls: list[int] = []
    real = broker.store.put_batches

    def counted(batches):
        calls.append(len(batches))
        return real(batches)

    broker.store.put_batches = counted
    return calls


def serve_tasks(broker, *groups):
    """Each group served by its own task, as the dispatcher serves one read's groups."""
    async def scenario():
        peer = FakePeer(PEER)
        return await asyncio.gather(
            *(broker.send_processor.handle_group(group, peer) for group in groups))

    return asyncio.run(scenario())


def test_batches_of_one_iteration_are_appended_together_each_with_its_own_answer(broker):
    with_topic(broker, "Orders")
    calls = count_put_batches(broker)
    shapes = [(0, 3), (1, 2), (0, 4)]  # (queue id, messages)
    groups = [[batch_request("Orders", [f"q{q}m{n}".encode() for n in range(count)], q)]
              for q, count in shapes]

    answered = [group[0] for group in serve_tasks(broker, *groups)]

    assert calls == [3]
    assert [r.code for r in answered] == [ResponseCode.SUCCESS] * 3
    assert [int(r.ext_fields["queueOffset"]) for r in answered] == [0, 0, 3]
    for queue_id in (0, 1):
        records = stored(broker, "Orders", queue_id)
        expected = [f"q{q}m{n}".encode() for q, count in shapes if q == queue_id
                    for n in range(count)]
        assert [record.body for record in records] == expected
        ids = ",".join(r.ext_fields["msgId"] for (q, _), r in zip(shapes, answered, strict=True)
                       if q == queue_id).split(",")
        assert [decode_offset_msg_id(i)[1] for i in ids] == [
            record.physical_offset for record in records]


def test_a_single_send_between_batches_is_stored_in_its_place(broker):
    with_topic(broker, "Orders")
    calls = count_put_batches(broker)
    first = [batch_request("Orders", [b"b1", b"b2"], 0)]
    single = [send_request("Orders", b"single", queue_id=0)]
    last = [batch_request("Orders", [b"b3"], 0)]

    answered = serve_tasks(broker, first, single, last)

    assert [group[0].code for group in answered] == [ResponseCode.SUCCESS] * 3
    assert [record.body for record in stored(broker, "Orders", 0)] == [
        b"b1", b"b2", b"single", b"b3"]
    assert calls == [1, 1]  # the first batch was appended before the single send


def test_batches_queued_before_the_broker_stops_taking_writes_are_refused(broker):
    with_topic(broker, "Orders")

    async def scenario():
        peer = FakePeer(PEER)
        served = asyncio.ensure_future(broker.send_processor.handle_group(
            [batch_request("Orders", [b"m"], 0)], peer))
        await asyncio.sleep(0)  # served and queued; appended at the end of the next iteration
        broker.role.fence("a newer master took over")
        return await served

    (answer,) = asyncio.run(scenario())

    assert answer.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "a newer master took over" in answer.remark
    assert stored(broker, "Orders", 0) == []


def test_each_send_of_a_group_with_a_queued_batch_is_answered_once(broker, monkeypatch):
    # A single send before a batch queued for the iteration's append: answering it (which
    # may register a wait for the disk's sync, or start a coroutine for a slave) happens
    # once, after the append, not once before it is known a batch waits and again after.
    with_topic(broker, "Orders")
    processor = broker.send_processor
    answered: list[str] = []
    answer = processor._answer

    def counting_answer(request, stored, ext_fields, connection):
        answered.append(request.body.decode(errors="replace") if request.code
                        != RequestCode.SEND_BATCH_MESSAGE else "batch")
        return answer(request, stored, ext_fields, connection)

    monkeypatch.setattr(processor, "_answer", counting_answer)
    requests = [
        send_request("Orders", b"before", queue_id=0),
        batch_request("Orders", [b"b1", b"b2"], queue_id=0),
        send_request("Orders", b"after", queue_id=0),
    ]
    responses = serve_group(broker, requests)

    assert [r.code for r in responses] == [ResponseCode.SUCCESS] * 3
    assert answered == ["before", "batch", "after"]
