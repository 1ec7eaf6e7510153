"""A consumer reads a queue from its master, from a slave when the master fails or suggests
one, and back from the master once it answers again (client/read_routing.py)."""

from __future__ import annotations

import asyncio

import pytest

from tidemq.client.errors import NoRouteError
from tidemq.client.message import MessageQueue
from tidemq.client.read_routing import DOWN_BACKOFF_S, ReadRouting, route_read_addresses
from tidemq.client.route import parse_topic_route
from tidemq.remoting.errors import RemotingError

QUEUE = MessageQueue("Orders", "broker-a", 0)
MASTER, SLAVE = "127.0.0.1:10911", "127.0.0.1:10921"


class FakeInstance:
    def __init__(self, addresses: dict[int, str]) -> None:
        self.broker_addresses = {"broker-a": dict(addresses)}
        self.route_fetches = 0

    async def fetch_route(self, topic: str) -> None:
        self.route_fetches += 1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def reader(down: set[str]):
    """An action that fails in transport on the addresses in ``down``; records calls."""
    calls: list[str] = []

    async def read(broker_id: int, address: str) -> str:
        calls.append(address)
        if address in down:
            raise RemotingError(f"cannot connect to {address}")
        return address

    return read, calls


def test_master_first_then_the_slave_when_the_master_fails_then_back():
    clock = Clock()
    routing = ReadRouting(FakeInstance({0: MASTER, 1: SLAVE}), clock)
    down = {MASTER}
    read, calls = reader(down)
    assert asyncio.run(routing.call(QUEUE, read)) == SLAVE
    assert calls == [MASTER, SLAVE]
    # The master failed a moment ago: the slave is tried first for a while...
    calls.clear()
    assert asyncio.run(routing.call(QUEUE, read)) == SLAVE
    assert calls == [SLAVE]
    # ...then the master again, and it answers now.
    clock.now += DOWN_BACKOFF_S + 0.1
    down.clear()
    calls.clear()
    assert asyncio.run(routing.call(QUEUE, read)) == MASTER
    assert calls == [MASTER]


def test_suggested_broker_is_read_first_until_it_suggests_the_master():
    routing = ReadRouting(FakeInstance({0: MASTER, 1: SLAVE}), Clock())
    routing.suggest(QUEUE, 1)
    assert routing.candidates(QUEUE) == [(1, SLAVE), (0, MASTER)]
    routing.suggest(QUEUE, 0)
    assert routing.candidates(QUEUE) == [(0, MASTER), (1, SLAVE)]
    # A suggestion of a broker the route does not list falls back to the master first.
    routing.suggest(QUEUE, 2)
    assert routing.candidates(QUEUE) == [(0, MASTER), (1, SLAVE)]


def test_a_group_without_master_is_read_from_its_slave():
    routing = ReadRouting(FakeInstance({1: SLAVE}), Clock())
    read, _ = reader(set())
    assert asyncio.run(routing.call(QUEUE, read)) == SLAVE


def test_a_lone_master_is_tried_again_at_once_after_failing_and_whatever_is_suggested():
    # The one-address shortcut of ``candidates`` (every pull asks it) keeps the rules: the
    # only address is tried even inside its back-off, and a suggestion changes nothing.
    clock = Clock()
    routing = ReadRouting(FakeInstance({0: MASTER}), clock)
    down = {MASTER}
    read, calls = reader(down)
    with pytest.raises(RemotingError, match="10911"):
        asyncio.run(routing.call(QUEUE, read))
    down.clear()
    routing.suggest(QUEUE, 1)
    assert routing.candidates(QUEUE) == [(0, MASTER)]
    assert asyncio.run(routing.call(QUEUE, read)) == MASTER
    assert calls == [MASTER, MASTER]


def test_every_address_failing_raises_the_last_error_and_no_route_is_named():
    routing = ReadRouting(FakeInstance({0: MASTER, 1: SLAVE}), Clock())
    read, _ = reader({MASTER, SLAVE})
    with pytest.raises(RemotingError, match="10921"):
        asyncio.run(routing.call(QUEUE, read))
    empty = FakeInstance({})
    with pytest.raises(NoRouteError, match="broker-a"):
        asyncio.run(ReadRouting(empty, Clock()).call(QUEUE, read))
    assert empty.route_fetches == 1


def test_route_read_addresses_lists_each_group_master_first():
    route = parse_topic_route(
        b'{"brokerDatas":[{"brokerAddrs":{"1":"b:2","0":"b:1"},"brokerName":"b","cluster":"c"},'
        b'{"brokerAddrs":{"2":"a:3"},"brokerName":"a","cluster":"c"}],"queueDatas":[]}')
    assert route_read_addresses(route) == ["a:3", "b:1", "b:2"]
