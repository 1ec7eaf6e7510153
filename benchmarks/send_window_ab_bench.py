"""The producer's CPU per single send, another tree's client modules against this tree's in ONE
process, in short alternated slices:

    .venv/bin/python benchmarks/send_window_ab_bench.py --base <other tree>/src
        [--modules producer,connection] [--slices 20] [--sends 4000] [--window 64]

On a shared, loaded host the CPU time of a process moves by 30-80 % from minute to minute, so
two processes measured one after the other (send_cost_bench.py's variants) often cannot resolve
a change of a few percent. Here both versions live in one process and take turns: the base
tree's ``tidemq/client/producer.py`` and/or ``tidemq/remoting/connection.py`` and
``client.py`` are loaded from ``--base`` as modules of their own (everything they import comes
from this tree), a producer of each version is started against one ``tidemq dev`` and its
broker connection's socket is replaced by send_cost_bench's answering transport (every write
of a loop iteration answered in the next iteration by one read of SEND answers; the fake
broker's own time left out). Then ``--slices`` times, in alternating order, each version makes
``--sends`` single sends of 1 KiB from ``--window`` coroutines through its real connection
(cork, frame decode, futures, task wake-ups) and its thread CPU time per send is taken.
Printed: each version's median and least µs per send, and the per-pair ratio (this tree over
the base) with how many pairs this tree was lower in.

Valid only while the rest of the two trees agree: the loaded modules must work with this
tree's other modules (the base tree of a session's start against its end, say).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import sys
import time
from typing import Any

from broker_bench import DevServer
from send_cost_bench import BODY, TOPIC, WARM_UP_SENDS, _AnsweringTransport

MODULES = {"producer": ("tidemq/client/producer.py",),
           "connection": ("tidemq/remoting/connection.py", "tidemq/remoting/client.py")}


def _load(base: str, path: str) -> Any:
    """The module at ``base/path`` under a name of its own (``<module>_base``)."""
    name = path[:-3].replace("/", ".") + "_base"
    spec = importlib.util.spec_from_file_location(name, os.path.join(base, path))
    if spec is None or spec.loader is None:
        raise SystemExit(f"send_window_ab_bench: cannot load {path} from --base {base}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


async def _started(producer_class: type, group: str, namesrv: str,
                   connection_class: type | None, client_class: type | None) -> tuple:
    """A started producer of ``producer_class`` whose broker connection (of
    ``connection_class`` when given) answers through an ``_AnsweringTransport``."""
    from tidemq import Message

    producer = producer_class(group, namesrv)
    await producer.start()
    await producer.send(Message(TOPIC, BODY))
    queue = (await producer.queues(TOPIC))[0]
    remoting = producer._instance.remoting
    connection = remoting.connections[producer._instance.master_address(queue.broker_name)]
    if connection_class is not None:  # the same attributes: only the methods change
        connection.__class__ = connection_class
        remoting.__class__ = client_class
    transport = _AnsweringTransport(connection)
    socket, connection._transport = connection._transport, transport
    return producer, transport, connection, socket


async def _sends(producer: Any, count: int, window: int) -> None:
    from tidemq import Message

    left = [count]

    async def sender() -> None:
        while left[0] > 0:
            left[0] -= 1
            await producer.send(Message(TOPIC, BODY))

    await asyncio.gather(*(sender() for _ in range(window)))


async def _compare(args: argparse.Namespace, namesrv: str) -> dict[str, list[float]]:
    from tidemq.client import producer as producer_now
    from tidemq.remoting import client as client_now
    from tidemq.remoting import connection as connection_now

    modules = set(args.modules.split(","))
    producer_base = (_load(args.base, MODULES["producer"][0]) if "producer" in modules
                     else producer_now)
    if "connection" in modules:
        connection_base = _load(args.base, MODULES["connection"][0]).Connection
        client_base = _load(args.base, MODULES["connection"][1]).RemotingClient
    else:
        connection_base, client_base = connection_now.Connection, client_now.RemotingClient
    versions = {
        "base": await _started(producer_base.Producer, "AB_BASE", namesrv, connection_base,
                               client_base),
        "now": await _started(producer_now.Producer, "AB_NOW", namesrv,
                              connection_now.Connection, client_now.RemotingClient),
    }
    costs: dict[str, list[float]] = {"base": [], "now": []}
    try:
        for producer, _, _, _ in versions.values():
            await _sends(producer, WARM_UP_SENDS, args.window)
        for index in range(args.slices):
            for name in (("base", "now") if index % 2 == 0 else ("now", "base")):
                producer, transport, _, _ = versions[name]
                transport.spent_s = 0.0
                started = time.thread_time()
                await _sends(producer, args.sends, args.window)
                spent = time.thread_time() - started - transport.spent_s
                costs[name].append(spent / args.sends * 1e6)
    finally:
        for producer, _, connection, socket in versions.values():
            connection._transport = socket
            await producer.close()
    return costs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the other tree's src/ folder")
    parser.add_argument("--modules", default="producer,connection",
                        help="which of the base tree's modules to load: producer, connection "
                        "(with remoting/client.py) or both, comma-separated")
    parser.add_argument("--slices", type=int, default=20)
    parser.add_argument("--sends", type=int, default=4000, help="sends per slice")
    parser.add_argument("--window", type=int, default=64, help="sends in flight")
    args = parser.parse_args()
    if not set(args.modules.split(",")) <= set(MODULES):
        raise SystemExit(f"--modules {args.modules!r}: expected producer, connection or both")
    from tidemq.remoting.loop import run

    server = DevServer()  # in a temporary folder, removed by stop()
    try:
        costs = run(_compare(args, server.namesrv))
    finally:
        server.stop()
    ratios = [now / base for base, now in zip(costs["base"], costs["now"], strict=True)]
    load = " ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"producer CPU per send, {args.slices} slices x {args.sends} sends alternated, window "
          f"{args.window}, base modules: {args.modules} (load average {load}):")
    for name, values in costs.items():
        print(f"{name:<5} median {statistics.median(values):.2f} least {min(values):.2f} us")
    print(f"now / base per pair: median {statistics.median(ratios):.3f}; now lower in "
          f"{sum(ratio < 1 for ratio in ratios)} of {len(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
