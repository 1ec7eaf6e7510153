"""The batches of one loop iteration appended together, and under SYNC_FLUSH a chunk at a
time with the loop turning between chunks (broker/batch_appender.py)."""

from __future__ import annotations

import asyncio
import socket

from tidemq.broker.batch_appender import BatchAppender
from tidemq.remoting.loop import run as run_on_uvloop
from tidemq.store.interface import MessageBatch, PutResult, PutStatus

WAIT_BOUND_S = 10.0


class RecordingStore:
    """``put_batches`` answers each batch with its own result and records each call."""

    def __init__(self, events: list[str] | None = None) -> None:
        self.calls: list[list[str]] = []
        self.events = events if events is not None else []

    def put_batches(self, batches: list[MessageBatch]) -> list[PutResult]:
        self.calls.append([batch.topic for batch in batches])
        self.events.append(f"append {len(batches)}")
        return [PutResult(PutStatus.PUT_OK, batch.topic, message_count=len(batch.bodies))
                for batch in batches]


class NoStats:
    def record_put_latency(self, seconds: float) -> None:
        pass

    def record_put_result(self, *args: object) -> None:
        pass


def batch(name: str, messages: int = 64) -> MessageBatch:
    # The topic carries the batch's name, so a result and a call show which batch it was.
    return MessageBatch(name, 0, [b"x"] * messages, [b""] * messages, [0] * messages, None,
                        [()] * messages)


def queue_in_one_iteration(appender: BatchAppender, names: list[str]
                           ) -> list[asyncio.Future[PutResult]]:
    loop = asyncio.get_running_loop()
    return [appender.put(batch(name), loop) for name in names]


def test_without_chunks_an_iterations_batches_are_one_append():
    store = RecordingStore()
    appender = BatchAppender(store, NoStats())

    async def scenario() -> list[PutResult]:
        futures = queue_in_one_iteration(appender, [f"b{n}" for n in range(6)])
        return await asyncio.wait_for(asyncio.gather(*futures), WAIT_BOUND_S)

    results = asyncio.run(scenario())
    assert store.calls == [[f"b{n}" for n in range(6)]]
    assert [r.remark for r in results] == [f"b{n}" for n in range(6)]


def test_sync_flush_appends_an_iterations_batches_a_chunk_at_a_time_in_order():
    store = RecordingStore()
    appender = BatchAppender(store, NoStats(), chunk_messages=256)

    async def scenario() -> list[PutResult]:
        futures = queue_in_one_iteration(appender, [f"b{n}" for n in range(6)])
        return await asyncio.wait_for(asyncio.gather(*futures), WAIT_BOUND_S)

    results = asyncio.run(scenario())
    # 256 messages a chunk: four batches of 64, then the other two.
    assert store.calls == [["b0", "b1", "b2", "b3"], ["b4", "b5"]]
    assert [r.remark for r in results] == [f"b{n}" for n in range(6)]  # each its own


def test_a_batch_larger_than_a_chunk_is_appended_whole():
    store = RecordingStore()
    appender = BatchAppender(store, NoStats(), chunk_messages=256)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        futures = [appender.put(batch("big", 1000), loop), appender.put(batch("next"), loop)]
        await asyncio.wait_for(asyncio.gather(*futures), WAIT_BOUND_S)

    asyncio.run(scenario())
    assert store.calls == [["big"], ["next"]]


def test_the_loop_reads_between_two_chunks():
    # The point of the chunks: the sync worker's answer for the first chunk is read (and
    # its sends answered) before the loop appends the next. On uvloop, the broker's loop.
    events: list[str] = []
    store = RecordingStore(events)
    reader, writer = socket.socketpair()

    def appended() -> None:
        if len(store.calls) == 1:
            writer.send(b"!")  # an answer arrives while the first chunk is appended

    appender = BatchAppender(store, NoStats(), appended=appended, chunk_messages=128)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()

        def read() -> None:
            reader.recv(1)
            events.append("read")
            loop.remove_reader(reader.fileno())

        loop.add_reader(reader.fileno(), read)
        futures = queue_in_one_iteration(appender, ["b0", "b1", "b2", "b3"])
        await asyncio.wait_for(asyncio.gather(*futures), WAIT_BOUND_S)

    try:
        run_on_uvloop(scenario())
    finally:
        reader.close()
        writer.close()
    assert events == ["append 2", "read", "append 2"]


def test_a_direct_flush_appends_every_queued_chunk_at_once():
    # A direct store write for a send first appends what was served before it, all of it.
    store = RecordingStore()
    appender = BatchAppender(store, NoStats(), chunk_messages=64)

    async def scenario() -> None:
        futures = queue_in_one_iteration(appender, ["b0", "b1", "b2"])
        appender.flush()
        assert all(future.done() for future in futures)

    asyncio.run(scenario())
    assert store.calls == [["b0", "b1", "b2"]]
