"""SYNC_FLUSH over the network: a send is answered only after the sync covering its bytes
returned, however its response is written (broker/ha/flush_waits.py, LaterResponse)."""

from __future__ import annotations

import asyncio
import threading

from test_send_group import batch_request
from test_send_processor import send_request, with_topic

from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.msgid import decode_offset_msg_id

WAIT_BOUND_S = 10.0  # any wait for something the test expects (never a timing assertion)


class GatedSync:
    """The group commit's sync, held until the test opens the gate; records how far each
    sync that returned reached."""

    def __init__(self, store) -> None:
        self._service = store._group_commit
        self._sync = self._service._flush
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.synced_to: list[int] = []
        self._service._flush = self._gated

    def _gated(self) -> int:
        self.entered.set()
        if not self.gate.wait(WAIT_BOUND_S * 3):
            raise AssertionError("the test never opened the sync's gate")
        flushed = self._sync()
        self.synced_to.append(flushed)
        return flushed


async def wait_until(condition) -> None:
    async with asyncio.timeout(WAIT_BOUND_S):
        while not condition():
            await asyncio.sleep(0.005)


def answered_after_sync(sync: GatedSync, response: RemotingCommand) -> bool:
    """Whether a sync that had returned when ``response`` arrived covers its first record."""
    physical_offset = decode_offset_msg_id(response.ext_fields["msgId"].split(",")[0])[1]
    return any(reached > physical_offset for reached in sync.synced_to)


def test_sends_are_answered_only_after_the_sync_covering_them_returned(make_broker, serve):
    broker = make_broker(store_kind="file", store_overrides={"flush_disk_type": "SYNC_FLUSH"})
    with_topic(broker, "Orders")
    sync = GatedSync(broker.store)

    async def sends(link) -> list[tuple[RemotingCommand, bool]]:
        arrived: list[tuple[RemotingCommand, bool]] = []

        def send(request: RemotingCommand) -> asyncio.Task:
            task = asyncio.create_task(link.invoke(request, timeout_ms=60_000))
            # Judged as the response arrives, before the test opens the gate further.
            task.add_done_callback(lambda done: arrived.append(
                (done.result(), answered_after_sync(sync, done.result()))))
            return task

        # A lone send (the plain handler), then a read's worth: singles and a batch (the
        # group handler), all waiting behind the held sync.
        tasks = [send(send_request("Orders", b"lone"))]
        await asyncio.to_thread(sync.entered.wait, WAIT_BOUND_S)
        tasks += [send(send_request("Orders", f"m{n}".encode(), queue_id=n)) for n in range(3)]
        tasks.append(send(batch_request("Orders", [b"b1", b"b2"], queue_id=1)))
        await wait_until(lambda: broker.store.max_offset("Orders", 1) == 3)
        # Anything the broker wrote on this connection before it answered this request has
        # arrived once its answer has: no send may have been answered by now.
        probe = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
        assert (await link.invoke(probe)).code == ResponseCode.SUCCESS
        assert arrived == []
        sync.gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks), WAIT_BOUND_S)
        return arrived

    async def scenario():
        async with serve(broker) as link:
            try:
                return await sends(link)
            finally:
                sync.gate.set()  # a failed check must not leave the sync held

    arrived = asyncio.run(scenario())
    assert len(arrived) == 5
    assert [response.code for response, _ in arrived] == [ResponseCode.SUCCESS] * 5
    assert all(after for _, after in arrived), arrived


def test_a_sync_later_than_sync_flush_timeout_is_answered_flush_disk_timeout(make_broker,
                                                                              serve):
    broker = make_broker(store_kind="file", store_overrides={
        "flush_disk_type": "SYNC_FLUSH", "sync_flush_timeout_ms": 50})
    with_topic(broker, "Orders")
    sync = GatedSync(broker.store)

    async def scenario():
        async with serve(broker) as link:
            try:
                return await asyncio.gather(
                    link.invoke(send_request("Orders", b"late"), timeout_ms=60_000),
                    link.invoke(batch_request("Orders", [b"b1", b"b2"], queue_id=2),
                                timeout_ms=60_000))
            finally:
                sync.gate.set()

    responses = asyncio.run(scenario())
    assert [r.code for r in responses] == [ResponseCode.FLUSH_DISK_TIMEOUT] * 2
    assert all("syncFlushTimeout=50 ms" in r.remark for r in responses)
    assert all(r.ext_fields["msgId"] for r in responses)  # stored, and said so
