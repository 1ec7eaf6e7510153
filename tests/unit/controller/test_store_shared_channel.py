"""ControllerStore requests share one etcd channel: when another request's failure closes it
under a request in flight (grpc reports a local cancel), that request is asked again on a new
channel instead of cancelling its caller's task; a request whose own task is cancelled still
ends as a cancel. Seen under load: a controller test's read failed with CancelledError while
the controller service's scan, on the same store, timed out."""

from __future__ import annotations

import asyncio

import pytest

from tidemq.controller.etcd import ControllerStore


class ClosedUnderUs:
    """A client whose first ``get`` is cancelled by a channel close; later ones answer."""

    def __init__(self) -> None:
        self.calls = 0

    async def get(self, key: bytes) -> str:
        self.calls += 1
        if self.calls == 1:
            raise asyncio.CancelledError  # what grpc raises for a locally closed channel
        return f"value of {key.decode()}"

    async def close(self) -> None:
        pass


class Hangs:
    """A client whose requests never answer."""

    async def get(self, key: bytes) -> str:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def close(self) -> None:
        pass


def test_a_request_whose_channel_is_closed_under_it_is_asked_again() -> None:
    store = ControllerStore([("127.0.0.1", 1)], "/t")
    client = ClosedUnderUs()
    store._client = client
    # the retry gets a new channel from the factory: hand it the same fake
    store._connected_client = lambda: client  # type: ignore[method-assign]

    async def main() -> str:
        return await store._call("the key", "get", b"k")

    assert asyncio.run(main()) == "value of k"
    assert client.calls == 2


def test_a_cancelled_request_still_cancels() -> None:
    store = ControllerStore([("127.0.0.1", 1)], "/t", request_timeout_s=30.0)
    store._client = Hangs()

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(store._call("the key", "get", b"k"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
