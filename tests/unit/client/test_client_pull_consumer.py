"""PullConsumer behaviour against the in-process fake brokers (real sockets, real records)."""

from __future__ import annotations

import asyncio
import logging
import zlib

import pytest
from client_fakes import FakeBroker, FakeCluster

from tidemq.client.errors import ClientStateError, InvalidSubscription
from tidemq.client.message import MessageQueue, PullStatus
from tidemq.client.pull_consumer import ConsumeFrom, PullConsumer
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.message import encode_properties


def fill(broker: FakeBroker, topic: str, queue_id: int, count: int, *, start: int = 0,
         tags: str | None = None, store_timestamp: int | None = None) -> None:
    for i in range(start, start + count):
        properties = {"UNIQ_KEY": f"K{queue_id}-{i}"}
        if tags:
            properties["TAGS"] = tags
        broker.store(topic, queue_id, f"{queue_id}:{i}".encode(), encode_properties(properties),
                     store_timestamp=store_timestamp)


def queues_of(cluster: FakeCluster, topic: str, count: int) -> list[MessageQueue]:
    return [MessageQueue(topic, b.name, i) for b in cluster.brokers for i in range(count)]


async def poll_until(consumer: PullConsumer, count: int, rounds: int = 50) -> list:
    got: list = []
    for _ in range(rounds):
        got.extend(await consumer.poll(200))
        if len(got) >= count:
            break
    return got


def consumer_for(cluster: FakeCluster, group: str = "cg", **options) -> PullConsumer:
    options.setdefault("auto_commit_interval_ms", 60_000)
    return PullConsumer(group, cluster.namesrv.address, **options)


def test_poll_returns_every_message_in_queue_order_with_its_queue(run):
    async def main():
        async with FakeCluster(2) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=2)
            for broker in cluster.brokers:
                for queue_id in range(2):
                    fill(broker, "T", queue_id, 70)
            async with consumer_for(cluster, consume_from="FIRST") as consumer:
                consumer.assign(queues_of(cluster, "T", 2))
                got = await poll_until(consumer, 280)
            assert len(got) == 280
            per_queue: dict[tuple[str, int], list[int]] = {}
            for message in got:
                per_queue.setdefault((message.broker_name, message.queue_id), []).append(
                    message.queue_offset)
                assert message.body == f"{message.queue_id}:{message.queue_offset}".encode()
            assert per_queue == {(b, q): list(range(70)) for b in ("broker-a", "broker-b")
                                 for q in range(2)}

    run(main())


def test_compressed_bodies_come_back_decompressed(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            original = b"compress me " * 500
            cluster.brokers[0].store("T", 0, zlib.compress(original, 5), "", sysflag=0x301)
            async with consumer_for(cluster, consume_from="FIRST") as consumer:
                consumer.assign([MessageQueue("T", "broker-a", 0)])
                (message,) = await poll_until(consumer, 1)
            assert message.body == original
            assert message.uncompressed_body() == original

    run(main())


def test_tag_expression_filters_and_position_moves_past_filtered(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            broker = cluster.brokers[0]
            fill(broker, "T", 0, 5, tags="TagA")
            fill(broker, "T", 0, 5, start=5, tags="TagB")
            fill(broker, "T", 0, 5, start=10, tags="TagC")
            queue = MessageQueue("T", "broker-a", 0)
            async with consumer_for(cluster, consume_from="FIRST") as consumer:
                consumer.assign([queue], "TagA || TagC")
                got = await poll_until(consumer, 10)
                for _ in range(5):
                    if consumer.position(queue) == 15:
                        break
                    await consumer.poll(50)
                assert consumer.position(queue) == 15
            assert [m.queue_offset for m in got] == [*range(5), *range(10, 15)]
            assert {m.tags for m in got} == {"TagA", "TagC"}

    run(main())


def test_start_position_committed_offset_else_consume_from(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            broker = cluster.brokers[0]
            fill(broker, "T", 0, 10)
            queue = MessageQueue("T", "broker-a", 0)
            async with consumer_for(cluster, "last", consume_from=ConsumeFrom.LAST) as last:
                last.assign([queue])
                assert await last.poll(300) == []
                # LAST is resolved by the first fetch, which on a busy machine can come after
                # that poll: a message sent before it would not be new to this consumer.
                for _ in range(400):
                    if last.position(queue) is not None:
                        break
                    await asyncio.sleep(0.05)
                assert last.position(queue) == 10
                fill(broker, "T", 0, 1, start=10)
                assert [m.queue_offset for m in await poll_until(last, 1)] == [10]
            broker.offsets[("committed", "T", 0)] = 7
            async with consumer_for(cluster, "committed", consume_from="FIRST") as committed:
                committed.assign([queue])
                got = await poll_until(committed, 4)
            assert [m.queue_offset for m in got] == [7, 8, 9, 10]

    run(main())


def test_commit_sync_stores_positions_and_close_commits_with_auto_commit(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            broker = cluster.brokers[0]
            fill(broker, "T", 0, 40)
            queue = MessageQueue("T", "broker-a", 0)
            consumer = consumer_for(cluster, consume_from="FIRST", max_poll_records=25)
            await consumer.start()
            consumer.assign([queue])
            first = await poll_until(consumer, 25)
            assert len(first) == 25
            await consumer.commit_sync()
            assert broker.offsets[("cg", "T", 0)] == 25
            assert await consumer.committed(queue) == 25
            await consumer.commit_sync({queue: 3})
            assert broker.offsets[("cg", "T", 0)] == 3
            await poll_until(consumer, 15)
            await consumer.close()
            assert broker.offsets[("cg", "T", 0)] == 40

    run(main())


def test_without_auto_commit_only_staged_offsets_are_committed_at_close(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            broker = cluster.brokers[0]
            fill(broker, "T", 0, 10)
            queue = MessageQueue("T", "broker-a", 0)
            async with consumer_for(cluster, consume_from="FIRST",
                                    auto_commit=False) as consumer:
                consumer.assign([queue])
                await poll_until(consumer, 10)
                assert ("cg", "T", 0) not in broker.offsets
                consumer.commit({queue: 6})
            assert broker.offsets[("cg", "T", 0)] == 6

    run(main())


def test_seek_replays_and_seek_to_end_and_timestamp_move_positions(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            broker = cluster.brokers[0]
            fill(broker, "T", 0, 10, store_timestamp=1_000)
            fill(broker, "T", 0, 10, start=10, store_timestamp=2_000)
            queue = MessageQueue("T", "broker-a", 0)
            async with consumer_for(cluster, consume_from="FIRST") as consumer:
                consumer.assign([queue])
                assert len(await poll_until(consumer, 20)) == 20
                await consumer.seek(queue, 5)
                assert consumer.position(queue) == 5
                replay = await poll_until(consumer, 15)
                assert [m.queue_offset for m in replay] == list(range(5, 20))
                await consumer.seek_to_timestamp(queue, 2_000)
                assert [m.queue_offset for m in await poll_until(consumer, 10)] == list(
                    range(10, 20))
                await consumer.seek_to_beginning()
                assert len(await poll_until(consumer, 20)) == 20
                await consumer.seek_to_end(queue)
                assert consumer.position(queue) == 20
                assert await consumer.poll(200) == []

    run(main())


def test_offset_outside_the_queue_jumps_to_the_next_valid_offset(run, caplog):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            broker = cluster.brokers[0]
            fill(broker, "T", 0, 10)
            stored = broker.queues[("T", 0)]
            stored.records = stored.records[4:]  # retention removed offsets 0..3
            stored.store_times = stored.store_times[4:]
            stored.min_offset = 4
            broker.offsets[("cg", "T", 0)] = 1
            queue = MessageQueue("T", "broker-a", 0)
            async with consumer_for(cluster) as consumer:
                consumer.assign([queue])
                got = await poll_until(consumer, 6)
            assert [m.queue_offset for m in got] == list(range(4, 10))

    with caplog.at_level(logging.WARNING, logger="tidemq.client"):
        run(main())
    assert any("outside [4, 10]; moving to 4" in r.getMessage() for r in caplog.records)


def test_poll_waits_for_a_message_that_arrives_later(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            broker = cluster.brokers[0]
            async with consumer_for(cluster, consume_from="LAST") as consumer:
                queue = MessageQueue("T", "broker-a", 0)
                consumer.assign([queue])
                waiting = asyncio.ensure_future(consumer.poll(5_000))
                # LAST is resolved by the poll's first fetch: a message sent before that (a
                # fixed 0.3 s here, on a busy machine) would not be new to this consumer.
                for _ in range(400):
                    if consumer.position(queue) is not None:
                        break
                    await asyncio.sleep(0.05)
                assert consumer.position(queue) == 0
                assert not waiting.done()
                fill(broker, "T", 0, 1)
                got = await waiting
            assert [m.body for m in got] == [b"0:0"]

    run(main())


def test_each_poll_times_out_on_its_own_deadline(run):
    # The polls of a consumer share one timer, due at the earliest deadline: a short poll
    # after a long one must not wait for the long one's, and a poll whose deadline falls
    # after an answered poll's still times out (the timer moves on to it).
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            broker = cluster.brokers[0]
            async with consumer_for(cluster, consume_from="LAST") as consumer:
                queue = MessageQueue("T", "broker-a", 0)
                consumer.assign([queue])
                long_poll = asyncio.ensure_future(consumer.poll(30_000))
                for _ in range(400):
                    if consumer.position(queue) is not None:
                        break
                    await asyncio.sleep(0.05)
                assert await asyncio.wait_for(consumer.poll(100), 20) == []
                assert not long_poll.done()
                fill(broker, "T", 0, 1)
                assert [m.body for m in await asyncio.wait_for(long_poll, 20)] == [b"0:0"]

                answered = asyncio.ensure_future(consumer.poll(300))
                later = asyncio.ensure_future(consumer.poll(600))
                await asyncio.sleep(0)  # both wait now, the timer due at the first's deadline
                fill(broker, "T", 0, 1, start=1)
                got = await asyncio.wait_for(asyncio.gather(answered, later), 20)
                assert sorted(len(messages) for messages in got) == [0, 1]
                # A cancelled poll leaves nothing behind for the timer to wake.
                cancelled = asyncio.ensure_future(consumer.poll(30_000))
                await asyncio.sleep(0)
                cancelled.cancel()
                assert await asyncio.wait_for(consumer.poll(50), 20) == []

    run(main())


def test_group_members_share_the_queues_without_overlap(run):
    async def main():
        async with FakeCluster(2) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=3)
            first = consumer_for(cluster, instance_name="one")
            second = consumer_for(cluster, instance_name="two")
            first.subscribe("T")
            await first.start()
            assert first.assignment() == sorted(queues_of(cluster, "T", 3))
            second.subscribe("T")
            await second.start()
            await first.rebalance()
            one, two = set(first.assignment()), set(second.assignment())
            assert one and two and not one & two
            assert one | two == set(queues_of(cluster, "T", 3))
            beat = cluster.brokers[0].heartbeats[-1]
            (consumer_data,) = beat["consumerDataSet"]
            assert consumer_data["consumeType"] == "CONSUME_ACTIVELY"
            assert consumer_data["subscriptionDataSet"][0]["topic"] == "T"
            await second.close()
            await first.rebalance()
            assert first.assignment() == sorted(queues_of(cluster, "T", 3))
            await first.close()

    run(main())


def test_low_level_pull_reports_status_and_bounds(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            fill(cluster.brokers[0], "T", 0, 40)
            queue = MessageQueue("T", "broker-a", 0)
            async with consumer_for(cluster) as consumer:
                found = await consumer.pull(queue, 0, 32)
                at_end = await consumer.pull(queue, 40)
                beyond = await consumer.pull(queue, 99)
            assert found.status is PullStatus.FOUND
            assert [m.queue_offset for m in found.messages] == list(range(32))
            assert (found.next_begin_offset, found.min_offset, found.max_offset) == (32, 0, 40)
            assert at_end.status is PullStatus.NO_NEW_MSG and at_end.messages == []
            assert beyond.status is PullStatus.OFFSET_ILLEGAL
            assert beyond.next_begin_offset == 40

    run(main())


def test_misuse_raises_clear_errors(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            consumer = consumer_for(cluster)
            with pytest.raises(ClientStateError):
                await consumer.poll(10)
            await consumer.start()
            with pytest.raises(InvalidSubscription, match="subscribe"):
                await consumer.poll(10)
            consumer.assign([MessageQueue("T", "broker-a", 0)])
            with pytest.raises(InvalidSubscription, match="cannot be mixed"):
                consumer.subscribe("T")
            with pytest.raises(InvalidSubscription, match="not assigned"):
                await consumer.seek(MessageQueue("T", "broker-a", 5), 0)
            await consumer.close()

    run(main())


def test_bad_consume_from_is_refused():
    with pytest.raises(ValueError, match="LAST, FIRST, TIMESTAMP"):
        PullConsumer("cg", "127.0.0.1:9876", consume_from="NEWEST")


def pulled_offsets(broker: FakeBroker) -> list[int]:
    return [int((r.ext_fields or {})["queueOffset"]) for r in broker.requests
            if r.code == RequestCode.PULL_MESSAGE]


def test_a_backlog_is_pulled_with_several_pulls_in_flight_each_message_once(run):
    async def main():
        async with FakeCluster(1) as cluster:
            broker = cluster.brokers[0]
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            fill(broker, "T", 0, 300)
            broker.pull_delay_s = 0.02  # a round trip long enough to see pulls overlap
            async with consumer_for(cluster, consume_from="FIRST",
                                    pulls_in_flight_per_queue=3) as consumer:
                consumer.assign(queues_of(cluster, "T", 1))
                got = await poll_until(consumer, 300)
                assert [m.queue_offset for m in got] == list(range(300))
                assert [m.body for m in got] == [f"0:{i}".encode() for i in range(300)]
                assert consumer.position(MessageQueue("T", "broker-a", 0)) == 300
            assert broker.pulls_max == 3
            # Pulls ahead go only where the last answer said messages are (below max offset
            # 300); at most a long poll at 300 follows.
            offsets = pulled_offsets(broker)
            assert max(offsets) <= 300
            assert set(range(0, 300, 32)) <= set(offsets)

    run(main())


def test_a_wrongly_predicted_pull_is_dropped_and_nothing_is_skipped_or_repeated(run):
    async def main():
        async with FakeCluster(1) as cluster:
            broker = cluster.brokers[0]
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            fill(broker, "T", 0, 200)
            broker.pull_delay_s = 0.02
            broker.short_reads = {64: 5, 101: 1}  # reads there end early: 64..68, then 101
            async with consumer_for(cluster, consume_from="FIRST",
                                    pulls_in_flight_per_queue=3) as consumer:
                consumer.assign(queues_of(cluster, "T", 1))
                got = await poll_until(consumer, 200)
                assert [m.queue_offset for m in got] == list(range(200))
            offsets = pulled_offsets(broker)
            # Pulls went out at the predicted 96 and 128 before 64's short answer came back;
            # their answers were dropped and pulling went on at 69.
            assert {96, 69, 101, 102} <= set(offsets)

    run(main())


def test_one_pull_in_flight_when_pipelining_is_off_or_the_subscription_filters(run):
    async def main():
        async with FakeCluster(1) as cluster:
            broker = cluster.brokers[0]
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            fill(broker, "T", 0, 100, tags="a")
            broker.pull_delay_s = 0.02
            async with consumer_for(cluster, consume_from="FIRST",
                                    pulls_in_flight_per_queue=1) as consumer:
                consumer.assign(queues_of(cluster, "T", 1))
                assert len(await poll_until(consumer, 100)) == 100
            assert broker.pulls_max == 1
            # The first consumer's last long poll may still be in the broker's delay: count
            # the second consumer's pulls alone.
            for _ in range(1000):
                if not broker.pulls_now:
                    break
                await asyncio.sleep(0.01)
            broker.pulls_max = 0
            async with consumer_for(cluster, "cg2", consume_from="FIRST") as consumer:
                consumer.assign(queues_of(cluster, "T", 1), "a || b")
                assert len(await poll_until(consumer, 100)) == 100
            assert broker.pulls_max == 1

    run(main())


def test_pulling_pauses_while_a_queue_buffers_its_byte_threshold(run):
    async def main():
        async with FakeCluster(1) as cluster:
            broker = cluster.brokers[0]
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            big = b"x" * (64 * 1024)
            for _ in range(100):
                broker.store("T", 0, big)
            async with consumer_for(cluster, consume_from="FIRST",
                                    pull_threshold_size_for_queue_mib=1) as consumer:
                consumer.assign(queues_of(cluster, "T", 1))
                first = await consumer.poll(5000)  # one pull of 32 x 64 KiB: 2 MiB > 1 MiB
                assert len(first) == 32
                assert len(pulled_offsets(broker)) <= 2  # no more than one pulled ahead
                rest = await poll_until(consumer, 68)
                assert [m.queue_offset for m in first + rest] == list(range(100))

    run(main())


def test_a_seek_while_pulls_are_in_flight_drops_their_answers(run):
    async def main():
        async with FakeCluster(1) as cluster:
            broker = cluster.brokers[0]
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            fill(broker, "T", 0, 400)
            broker.pull_delay_s = 0.02
            queue = MessageQueue("T", "broker-a", 0)
            async with consumer_for(cluster, consume_from="FIRST", max_poll_records=40,
                                    pulls_in_flight_per_queue=3) as consumer:
                consumer.assign([queue])
                first = await poll_until(consumer, 40)
                for _ in range(400):  # until pulls ahead are out
                    if broker.pulls_now >= 2:
                        break
                    await asyncio.sleep(0.005)
                await consumer.seek(queue, 5)
                again = await poll_until(consumer, 395)
            assert [m.queue_offset for m in first] == list(range(len(first)))
            assert [m.queue_offset for m in again] == list(range(5, 400))

    run(main())


def fetch_tasks() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("tidemq-fetch-")]


def test_a_drained_queue_is_pulled_from_the_read_callback_without_a_fetch_task(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            broker = cluster.brokers[0]
            async with consumer_for(cluster, consume_from="LAST") as consumer:
                consumer.assign([MessageQueue("T", "broker-a", 0)])
                got = []
                for i in range(3):
                    # Each message arrives while the queue's pull is parked at the broker and
                    # no fetch task waits for it: the answer is taken as it is read.
                    await wait_for(lambda: broker.requests and not fetch_tasks())
                    parked = len(broker.requests)
                    fill(broker, "T", 0, 1, start=i)
                    got += await poll_until(consumer, 1)
                    await wait_for(lambda n=parked: len(broker.requests) > n)
            offsets = [int(r.ext_fields["queueOffset"]) for r in broker.requests]
            return got, offsets

    got, offsets = run(main())
    assert [m.body for m in got] == [b"0:0", b"0:1", b"0:2"]
    # The fake holds a pull 0.3 s at most: a re-parked pull asks for the same offset again.
    assert offsets == sorted(offsets) and {0, 1, 2, 3} <= set(offsets)


def test_a_parked_pull_whose_connection_closes_goes_on_after_a_back_off(run, monkeypatch):
    monkeypatch.setattr("tidemq.client.pull_consumer.PULL_DELAY_AFTER_TRANSPORT_ERROR_S", 0.05)

    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            broker = cluster.brokers[0]
            async with consumer_for(cluster, consume_from="LAST") as consumer:
                consumer.assign([MessageQueue("T", "broker-a", 0)])
                await wait_for(lambda: broker.requests and not fetch_tasks())
                consumer._instance.remoting.close_connection(broker.address)
                fill(broker, "T", 0, 2)
                return await poll_until(consumer, 2)

    got = run(main())
    assert [m.body for m in got] == [b"0:0", b"0:1"]


def test_a_seek_while_a_pull_is_parked_drops_its_answer(run):
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            broker = cluster.brokers[0]
            fill(broker, "T", 0, 3)
            queue = MessageQueue("T", "broker-a", 0)
            async with consumer_for(cluster, consume_from="FIRST") as consumer:
                consumer.assign([queue])
                first = await poll_until(consumer, 3)
                await wait_for(lambda: not fetch_tasks())  # parked at offset 3
                await consumer.seek(queue, 1)
                again = await poll_until(consumer, 2)
                await wait_for(lambda: not fetch_tasks())  # parked at 3 again, twice
                fill(broker, "T", 0, 1, start=3)  # answers both parked pulls
                again += await poll_until(consumer, 1)
                again += await consumer.poll(300)  # nothing more: the first answer dropped
            return first, again

    first, again = run(main())
    assert [m.queue_offset for m in first] == [0, 1, 2]
    assert [m.queue_offset for m in again] == [1, 2, 3]


async def wait_for(condition, bound_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + bound_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_a_parked_answers_next_pull_leaves_before_poll_hands_its_messages_over(run):
    # The next pull is written (the connection's cork flushed to the socket) before the poll
    # waiting for the answer returns, so its round trip overlaps the application's work on
    # the messages instead of starting after it.
    async def main():
        async with FakeCluster(1) as cluster:
            cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=1)
            broker = cluster.brokers[0]
            queue = MessageQueue("T", "broker-a", 0)
            async with consumer_for(cluster, consume_from="FIRST") as consumer:
                consumer.assign([queue])
                await wait_for(lambda: consumer._states[queue].parked is not None)  # at 0
                connection = consumer._instance.remoting.open_connection(broker.address)
                fill(broker, "T", 0, 1)  # answers the parked pull
                got = await consumer.poll(5000)
                assert [m.queue_offset for m in got] == [0]
                # The next pull is parked and nothing of it waits in the cork any more.
                assert consumer._states[queue].parked is not None
                assert connection._corked is None

    run(main())
