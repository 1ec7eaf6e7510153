"""Producer behaviour against an in-process fake name server and brokers (real sockets)."""

from __future__ import annotations

import asyncio
import zlib

import pytest
from client_fakes import FakeCluster, properties_of

from tidemq.client.errors import BrokerRejected, ClientStateError, InvalidMessage, NoRouteError
from tidemq.client.message import Message, MessageQueue, SendStatus
from tidemq.client.producer import Producer
from tidemq.errors import InvalidTopicName, MessageTooLarge
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.message import decode_batch_body, encode_properties
from tidemq.remoting.errors import RemotingTimeout


def producer_for(cluster: FakeCluster, **options) -> Producer:
    return Producer("pg", cluster.namesrv.address, **options)


def test_send_stores_message_with_properties_and_reports_where(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("Orders", cluster.brokers)
            async with producer_for(cluster) as producer:
                message = Message("Orders", b"hello", tags="paid", keys=["o-1", "o-2"],
                                  properties={"region": "eu"}, flag=7)
                result = await producer.send(message)
            broker = cluster.brokers[0]
            assert result.status is SendStatus.SEND_OK
            assert result.msg_id == message.properties["UNIQ_KEY"]
            assert len(result.msg_id) == 32
            assert result.queue.topic == "Orders" and result.queue.broker_name == "broker-a"
            assert result.queue_offset == 0
            assert result.offset_msg_id == broker.offset_id(0)
            assert result.region == "DefaultRegion" and result.trace_on
            (request,) = broker.sends
            assert request.code == RequestCode.SEND_MESSAGE_V2
            ext = request.ext_fields
            assert ext["a"] == "pg" and ext["b"] == "Orders" and ext["c"] == "TBW102"
            assert ext["h"] == "7" and ext["f"] == "0" and ext["n"] == "broker-a"
            assert properties_of(request) == {"TAGS": "paid", "KEYS": "o-1 o-2",
                                              "region": "eu", "UNIQ_KEY": result.msg_id}
            assert broker.messages("Orders", result.queue.queue_id) == [
                (b"hello", properties_of(request))]

    run(main())


def test_send_result_names_the_queue_the_broker_answered_for(run):
    # The result's queue is the one the broker names; a broker naming another queue than
    # the one asked for (none does, but the answer is what counts) is believed.
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("Orders", cluster.brokers)
            broker = cluster.brokers[0]
            answer = broker.on_send

            async def on_send(request, connection):
                response = await answer(request, connection)
                response.ext_fields["queueId"] = "7"
                return response

            broker.server.register(RequestCode.SEND_MESSAGE_V2, on_send)
            async with producer_for(cluster) as producer:
                results = [await producer.send(Message("Orders", b"x")) for _ in range(2)]
        assert [result.queue for result in results] == [MessageQueue("Orders", "broker-a", 7)] * 2
        assert len({request.ext_fields["e"] for request in broker.sends}) == 2  # asked: 2 queues

    run(main())


def test_a_send_request_is_encoded_by_the_header_fast_path(run, monkeypatch):
    # Speed guard: the general JSON header encoder costs ~1.5 us more per send (an IntEnum
    # code, for one, is not a plain int and sends a request there).
    from tidemq.protocol import command

    def refuse(cmd):
        raise AssertionError(f"{cmd.describe()} took the general JSON header encoder")

    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("Orders", cluster.brokers)
            async with producer_for(cluster) as producer:
                await producer.send(Message("Orders", b"x"))  # routes and heartbeats first
                monkeypatch.setattr(command, "_encode_json_header_checked", refuse)
                result = await producer.send(Message("Orders", b"y", tags="t", keys="k"))
                plain = await producer.send(Message("Orders", b"z"))
        assert result.status is SendStatus.SEND_OK and plain.status is SendStatus.SEND_OK

    run(main())


def test_a_plain_send_is_rendered_from_its_template_and_arrives_as_the_general_encoding(
        run, monkeypatch):
    # Speed guard: a message with no property but its unique key is not encoded by the JSON
    # header encoder at all (its header is pasted into a template of its topic and broker);
    # the broker reads the same fields as from the general encoder.
    from tidemq.protocol import command

    encode = command._encode_json_header

    def refuse(cmd):
        if cmd.code == RequestCode.SEND_MESSAGE_V2 and not cmd.is_response:
            raise AssertionError(f"{cmd.describe()} was encoded, not rendered")
        return encode(cmd)  # the fake broker's answers

    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("Orders", cluster.brokers)
            async with producer_for(cluster) as producer:
                await producer.send(Message("Orders", b"x"))  # routes and heartbeats first
                monkeypatch.setattr(command, "_encode_json_header", refuse)
                plain = Message("Orders", b"y", flag=3)
                result = await producer.send(plain)
                monkeypatch.undo()
            (_, request) = cluster.brokers[0].sends
            assert result.status is SendStatus.SEND_OK
            general = producer._plain_fields(
                "Orders", ("0", request.ext_fields["g"], "3", plain.properties["UNIQ_KEY"]))
            general.update(e=str(result.queue.queue_id), n="broker-a")
            assert request.ext_fields == general
            assert request.code == RequestCode.SEND_MESSAGE_V2 and request.body == b"y"

    run(main())


def test_a_send_that_cannot_be_rendered_is_encoded_in_general(run):
    # A unique key that JSON must escape, a broker name the template does not take (not
    # printable), a request hook (ACL signing) that adds fields: each goes the general way,
    # with the right bytes.
    from tidemq.client.security import Credentials

    async def main():
        cluster = FakeCluster(1)
        cluster.brokers[0].name = "broker\xa0a"
        async with cluster:
            cluster.namesrv.add_topic("Orders", cluster.brokers)
            async with producer_for(cluster) as producer:
                quoted = Message("Orders", b"y", properties={"UNIQ_KEY": 'KEY"1'})
                await producer.send(Message("Orders", b"x"))
                await producer.send(quoted)
            async with producer_for(cluster, credentials=Credentials("ak", "sk")) as signer:
                await signer.send(Message("Orders", b"z"))
            first, second, signed = cluster.brokers[0].sends
            assert first.ext_fields["n"] == "broker\xa0a"
            assert properties_of(second) == {"UNIQ_KEY": 'KEY"1'}
            assert signed.ext_fields["AccessKey"] == "ak" and signed.ext_fields["Signature"]
            assert producer._send_templates == {("Orders", "broker\xa0a"): None}

    run(main())


def test_a_message_with_only_its_unique_key_sends_the_properties_text_of_any_other(run):
    # A plain message's properties text is made without encode_properties: the same text.
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("Orders", cluster.brokers)
            async with producer_for(cluster) as producer:
                plain = Message("Orders", b"x")
                own_key = Message("Orders", b"y", properties={"UNIQ_KEY": "MY-OWN-KEY"})
                results = [await producer.send(plain), await producer.send(own_key)]
            requests = cluster.brokers[0].sends
            assert [request.ext_fields["i"] for request in requests] == [
                encode_properties(plain.properties), encode_properties(own_key.properties)]
            assert [r.msg_id for r in results] == [plain.properties["UNIQ_KEY"], "MY-OWN-KEY"]
            assert {request.code for request in requests} == {RequestCode.SEND_MESSAGE_V2}

    run(main())


def test_sends_go_round_robin_over_all_queues(run):
    async def main():
        async with FakeCluster(2) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=2)
            async with producer_for(cluster) as producer:
                results = [await producer.send(Message("T", b"x")) for _ in range(8)]
            used = [r.queue for r in results]
            assert set(used) == {MessageQueue("T", b, i) for b in ("broker-a", "broker-b")
                                 for i in range(2)}
            assert used[:4] == used[4:]  # a full turn, then the same turn again

    run(main())


def test_large_body_is_zlib_compressed_with_sysflag(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers)
            async with producer_for(cluster) as producer:
                big = b"abcdefgh" * 1000
                await producer.send(Message("T", big))
                await producer.send(Message("T", b"small"))
            compressed, plain = cluster.brokers[0].sends
            assert int(compressed.ext_fields["f"]) == 0x1 | 0x300
            assert zlib.decompress(compressed.body) == big
            assert int(plain.ext_fields["f"]) == 0 and plain.body == b"small"

    run(main())


def test_retriable_refusal_is_retried_on_another_broker_which_is_then_preferred(run):
    async def main():
        async with FakeCluster(2) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            failing = cluster.broker("broker-a")
            failing.answer_sends_with = ResponseCode.SYSTEM_ERROR
            async with producer_for(cluster) as producer:
                results = [await producer.send(Message("T", b"x")) for _ in range(6)]
            assert {r.queue.broker_name for r in results} == {"broker-b"}
            # broker-a was tried at most once: afterwards it is avoided
            assert len(failing.sends) == 1
            assert len(cluster.broker("broker-b").sends) == 6

    run(main())


def test_non_retriable_refusal_raises_at_once_with_code_and_remark(run):
    async def main():
        async with FakeCluster(2) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            for broker in cluster.brokers:
                broker.answer_sends_with = ResponseCode.MESSAGE_ILLEGAL
            async with producer_for(cluster) as producer:
                with pytest.raises(BrokerRejected) as caught:
                    await producer.send(Message("T", b"x"))
            assert caught.value.code == ResponseCode.MESSAGE_ILLEGAL
            assert "refuses on purpose" in caught.value.remark
            assert "MESSAGE_ILLEGAL" in str(caught.value)
            assert not caught.value.retriable
            assert sum(len(b.sends) for b in cluster.brokers) == 1

    run(main())


def test_every_attempt_refused_raises_after_three_tries(run):
    async def main():
        async with FakeCluster(2) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            for broker in cluster.brokers:
                broker.answer_sends_with = ResponseCode.SERVICE_NOT_AVAILABLE
            async with producer_for(cluster) as producer:
                with pytest.raises(BrokerRejected) as caught:
                    await producer.send(Message("T", b"x"))
            assert caught.value.retriable
            assert sum(len(b.sends) for b in cluster.brokers) == 3

    run(main())


def test_broker_that_never_answers_times_out_within_the_budget(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers)
            cluster.brokers[0].hold_sends = True
            async with producer_for(cluster) as producer:
                with pytest.raises(RemotingTimeout):
                    await producer.send(Message("T", b"x"), timeout_ms=300)

    run(main())


def test_unreachable_broker_is_retried_on_a_live_one(run):
    async def main():
        async with FakeCluster(2) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            await cluster.broker("broker-a").stop()
            async with producer_for(cluster) as producer:
                results = [await producer.send(Message("T", b"x")) for _ in range(4)]
            assert {r.queue.broker_name for r in results} == {"broker-b"}

    run(main())


async def _warmed_up(producer: Producer, cluster: FakeCluster) -> None:
    """One stored send per broker, so the route and connections are known and the sends that
    follow take ``send``'s own first attempt (not the first-send path)."""
    while {b.name for b in cluster.brokers} - {b.name for b in cluster.brokers if b.sends}:
        await producer.send(Message("T", b"warm"))
    for broker in cluster.brokers:
        broker.requests.clear()  # ``sends`` reads these


def test_a_known_route_s_retriable_refusal_is_retried_on_another_broker(run):
    async def main():
        async with FakeCluster(2) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            async with producer_for(cluster) as producer:
                await _warmed_up(producer, cluster)
                failing = cluster.broker("broker-a")
                failing.answer_sends_with = ResponseCode.SYSTEM_ERROR
                results = [await producer.send(Message("T", b"x")) for _ in range(6)]
                assert {r.queue.broker_name for r in results} == {"broker-b"}
                assert producer.faults.unavailable_brokers == ["broker-a"]
            # broker-a was tried at most once (every other send round robin goes to it first)
            assert len(failing.sends) == 1
            assert len(cluster.broker("broker-b").sends) == 6

    run(main())


def test_a_known_route_s_refusals_raise_as_the_first_send_s_do(run):
    async def main():
        async with FakeCluster(2) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            async with producer_for(cluster) as producer:
                await _warmed_up(producer, cluster)
                for broker in cluster.brokers:
                    broker.answer_sends_with = ResponseCode.MESSAGE_ILLEGAL
                with pytest.raises(BrokerRejected) as caught:
                    await producer.send(Message("T", b"x"))
                assert caught.value.code == ResponseCode.MESSAGE_ILLEGAL
                assert not caught.value.retriable
                assert sum(len(b.sends) for b in cluster.brokers) == 1
                for broker in cluster.brokers:
                    broker.answer_sends_with = ResponseCode.SERVICE_NOT_AVAILABLE
                with pytest.raises(BrokerRejected) as caught:
                    await producer.send(Message("T", b"x"))
                assert caught.value.code == ResponseCode.SERVICE_NOT_AVAILABLE
                assert caught.value.retriable
                assert sum(len(b.sends) for b in cluster.brokers) == 1 + 3

    run(main())


def test_a_known_route_s_send_times_out_within_its_budget_after_its_retries(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers)
            async with producer_for(cluster) as producer:
                await _warmed_up(producer, cluster)
                cluster.brokers[0].hold_sends = True
                loop = asyncio.get_running_loop()
                started = loop.time()
                with pytest.raises(RemotingTimeout) as caught:
                    await producer.send(Message("T", b"x"), timeout_ms=300)
                # The first attempt took the whole budget: no time was left for another (its
                # timer may fire a ms early; the ~1 ms left then is no retry: _RETRY_MIN_MS).
                assert "within 300 ms" in str(caught.value) or "299 ms" in str(caught.value)
                assert len(cluster.brokers[0].sends) == 1
                assert loop.time() - started < 30  # bounded by the budget, not hung

    run(main())


def test_same_sharding_key_always_lands_on_one_queue(run):
    async def main():
        async with FakeCluster(2) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=4)
            async with producer_for(cluster) as producer:
                by_key: dict[str, set[MessageQueue]] = {}
                for i in range(60):
                    key = f"order-{i % 6}"
                    result = await producer.send(Message("T", f"{i}"), sharding_key=key)
                    by_key.setdefault(key, set()).add(result.queue)
                explicit = MessageQueue("T", "broker-b", 3)
                assert (await producer.send(Message("T", b"x"), queue=explicit)).queue == explicit
                chosen = await producer.send(Message("T", b"x"),
                                             selector=lambda queues, message: queues[-1])
            assert all(len(queues) == 1 for queues in by_key.values())
            assert len({q for qs in by_key.values() for q in qs}) > 1
            assert chosen.queue == MessageQueue("T", "broker-b", 3)

    run(main())


def test_ordered_send_is_not_retried_on_another_queue(run):
    async def main():
        async with FakeCluster(2) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            cluster.broker("broker-a").answer_sends_with = ResponseCode.SYSTEM_ERROR
            async with producer_for(cluster) as producer:
                with pytest.raises(BrokerRejected):
                    await producer.send(Message("T", b"x"),
                                        queue=MessageQueue("T", "broker-a", 0))
            assert cluster.broker("broker-b").sends == []

    run(main())


def test_unknown_topic_borrows_the_tbw102_route_capped_at_four_queues(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("TBW102", cluster.brokers, queue_nums=8, perm=7)
            async with producer_for(cluster) as producer:
                results = [await producer.send(Message("Fresh", b"x")) for _ in range(8)]
                assert len(await producer.queues("Fresh")) == 4
            assert {r.queue.queue_id for r in results} == {0, 1, 2, 3}
            assert all(r.ext_fields["c"] == "TBW102" and r.ext_fields["d"] == "4"
                       for r in cluster.brokers[0].sends)

    run(main())


def test_topic_without_route_or_auto_create_raises_no_route(run):
    async def main():
        async with FakeCluster(1) as cluster, producer_for(cluster) as producer:
            with pytest.raises(NoRouteError, match="updateTopic"):
                await producer.send(Message("Nowhere", b"x"))

    run(main())


def test_invalid_messages_fail_before_anything_is_sent(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers)
            async with producer_for(cluster, max_message_size=100) as producer:
                with pytest.raises(InvalidTopicName):
                    await producer.send(Message("bad topic", b"x"))
                with pytest.raises(InvalidMessage):
                    await producer.send(Message("T", b""))
                with pytest.raises(MessageTooLarge):
                    await producer.send(Message("T", b"x" * 101))
                with pytest.raises(MessageTooLarge, match="properties"):
                    await producer.send(Message("T", b"x", properties={"p": "v" * 40000}))
            assert cluster.namesrv.route_requests == []
            assert cluster.brokers[0].requests == []

    run(main())


def test_send_batch_splits_into_chunks_and_keeps_order(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            messages = [Message("T", f"m{i:03d}".encode() * 10, keys=f"k{i}")
                        for i in range(50)]
            async with producer_for(cluster, max_message_size=1000) as producer:
                results = await producer.send_batch(messages)
            sends = cluster.brokers[0].sends
            assert len(results) == len(sends) > 1
            assert all(r.code == RequestCode.SEND_BATCH_MESSAGE and r.ext_fields["m"] == "true"
                       for r in sends)
            bodies = [e.body for r in sends for e in decode_batch_body(r.body)]
            assert bodies == [m.body for m in messages]
            ids = [i for r in results for i in r.msg_ids]
            assert ids == [m.properties["UNIQ_KEY"] for m in messages]
            assert results[0].queue_offset == 0
            assert sum(len(r.offset_msg_ids) for r in results) == 50
            stored = cluster.brokers[0].messages("T", 0)
            assert [p["KEYS"] for _, p in stored] == [f"k{i}" for i in range(50)]

    run(main())


def test_send_oneway_writes_a_oneway_request(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            async with producer_for(cluster) as producer:
                assert await producer.send_oneway(Message("T", b"fire")) is None
                # a later two-way send on the same connection proves the oneway went first
                await producer.send(Message("T", b"after"))
            first, second = cluster.brokers[0].sends
            assert first.is_oneway and first.body == b"fire"
            assert not second.is_oneway

    run(main())


def test_many_concurrent_sends_all_succeed_with_distinct_ids(run):
    async def main():
        async with FakeCluster(2) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers)
            async with producer_for(cluster) as producer:
                results = await asyncio.gather(
                    *(producer.send(Message("T", f"{i}")) for i in range(200))
                )
            assert len({r.msg_id for r in results}) == 200
            # one route lookup served all 200 concurrent first sends
            assert cluster.namesrv.route_requests.count("T") == 1

    run(main())


def test_producer_heartbeats_its_group_and_unregisters_at_close(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers)
            producer = producer_for(cluster)
            await producer.start()
            await producer.send(Message("T", b"x"))
            for _ in range(50):  # the first heartbeat goes out in the background
                if cluster.brokers[0].heartbeats:
                    break
                await asyncio.sleep(0.02)
            await producer.close()
            beat = cluster.brokers[0].heartbeats[0]
            assert beat["clientID"] == producer.client_id
            assert beat["producerDataSet"] == [{"groupName": "pg"}]
            assert cluster.brokers[0].unregistered == [
                {"clientID": producer.client_id, "producerGroup": "pg"}]

    run(main())


def test_producer_must_be_started_and_cannot_restart_after_close(run):
    async def main():
        producer = Producer("pg", "127.0.0.1:1")
        with pytest.raises(ClientStateError, match="start"):
            await producer.send(Message("T", b"x"))
        await producer.close()
        with pytest.raises(ClientStateError):
            await producer.start()

    run(main())


def test_bad_group_or_name_server_address_is_refused():
    with pytest.raises(ValueError, match="group"):
        Producer("bad group", "127.0.0.1:9876")
    with pytest.raises(ValueError, match="host:port"):
        Producer("pg", "localhost")
