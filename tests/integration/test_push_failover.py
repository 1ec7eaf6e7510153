"""A push consumer group survives a member joining and a member killed with SIGKILL.

The members are child processes running this very file (``python test_push_failover.py
child ...``): each consumes with a PushConsumer and appends one line per message it consumed
(body, queue, time) to its own file, with one write per batch before the listener returns, so
the file holds exactly what the member consumed, also when it is killed. Every 0.2 s a
member writes its assignment to a status file. The test starts them, stops them and kills
them by PID only.

What must hold: after the kill the dead member's queues are owned by the others within 30 s;
every message is consumed; and a message consumed twice was in flight at the kill, i.e.
consumed for the first time before the group settled again. The duplicates are counted and
reported.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BROKERS = ("broker-a", "broker-b")
QUEUES_PER_BROKER = 4
TOPIC = "PushFailover"
GROUP = "push_it_failover"
REASSIGN_WAIT_S = 30.0  # the bound for handing a dead member's queues on
START_WAIT_S = 60.0
CONSUME_WAIT_S = 120.0
STATUS_INTERVAL_S = 0.2
STOP_WAIT_S = 20.0


# -- the child ------------------------------------------------------------------------------------


def child_main(namesrv: str, instance: str, out_path: str, status_path: str) -> None:
    """Consume TOPIC as a member of GROUP until SIGTERM (graceful close) or SIGKILL."""
    import logging

    from tidemq.client import PushConsumer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    async def main() -> None:
        # one write(2) per batch, nothing buffered: what the file holds was consumed
        with open(out_path, "ab", buffering=0) as out:
            await consume(out)

    async def consume(out) -> None:
        consumer = PushConsumer(GROUP, namesrv, consume_from="FIRST", instance_name=instance)
        consumer.subscribe(TOPIC, "*")

        @consumer.listener
        def on_messages(messages):
            now = f"{time.time():.3f}"
            out.write(b"".join(
                b"%s %s:%d %s\n" % (m.body, m.broker_name.encode(), m.queue_id, now.encode())
                for m in messages))

        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await consumer.start()
        try:
            while not stop.is_set():
                status = {"clientId": consumer.client_id,
                          "assignment": [f"{q.broker_name}:{q.queue_id}"
                                         for q in consumer.assignment() if q.topic == TOPIC]}
                temporary = status_path + ".tmp"
                with open(temporary, "w") as handle:
                    json.dump(status, handle)
                os.replace(temporary, status_path)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), STATUS_INTERVAL_S)
        finally:
            await consumer.close()

    asyncio.run(main())


# -- the test -------------------------------------------------------------------------------------


class Member:
    """One child consumer process and its files."""

    def __init__(self, folder: Path, namesrv: str, index: int) -> None:
        self.name = f"member-{index}"
        self.out = folder / f"{self.name}.consumed"
        self.status = folder / f"{self.name}.status.json"
        self.log = folder / f"{self.name}.log"
        # The child's PushConsumer gets the test's client timeouts (tests/client_timeouts.py;
        # imported here: the child runs this file without tests/ on its path).
        from client_timeouts import child_pythonpath

        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, __file__, "child", namesrv, self.name, str(self.out),
                 str(self.status)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env={**os.environ, "PYTHONPATH": child_pythonpath()},
            )

    def assignment(self) -> set[str]:
        try:
            return set(json.loads(self.status.read_text())["assignment"])
        except (FileNotFoundError, ValueError, KeyError):
            return set()

    def consumed(self) -> list[tuple[str, str, float]]:
        if not self.out.exists():
            return []
        lines = []
        for line in self.out.read_bytes().decode(errors="replace").splitlines():
            parts = line.split(" ")
            if len(parts) == 3:  # a killed member's last line may be cut short
                lines.append((parts[0], parts[1], float(parts[2])))
        return lines

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(STOP_WAIT_S)

    def tail(self) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- {self.name} ---\n" + "\n".join(text.splitlines()[-30:])


def all_queues() -> set[str]:
    return {f"{b}:{i}" for b in BROKERS for i in range(QUEUES_PER_BROKER)}


def shared_exactly(members: list[Member]) -> bool:
    """The members own every queue of the topic once between them, each at least one."""
    shares = [m.assignment() for m in members]
    owned = [q for share in shares for q in share]
    return len(owned) == len(all_queues()) and set(owned) == all_queues() and all(shares)


def produce(namesrv: str, bodies: list[str], pause_s: float = 0.0,
            progress: threading.Event | None = None) -> None:
    from tidemq.client import Message, Producer

    async def main() -> None:
        async with Producer("push_it_failover_producer", namesrv) as producer:
            for start in range(0, len(bodies), 100):
                await producer.send_batch([Message(TOPIC, body)
                                           for body in bodies[start:start + 100]])
                if progress is not None and start >= len(bodies) // 3:
                    progress.set()
                if pause_s:
                    await asyncio.sleep(pause_s)

    asyncio.run(main())


def create_topic(namesrv: str) -> None:
    from tidemq.client import Admin

    async def main() -> None:
        async with Admin(namesrv) as admin:
            masters = await admin.create_topic(TOPIC, QUEUES_PER_BROKER)
            deadline = time.monotonic() + START_WAIT_S
            while time.monotonic() < deadline:
                try:
                    if len((await admin.topic_route(TOPIC)).queue_datas) == len(masters):
                        return
                except Exception:
                    pass
                await asyncio.sleep(0.1)
            raise AssertionError(f"{TOPIC} was not routed on every broker")

    asyncio.run(main())


def test_killed_member_queues_are_reassigned_and_nothing_is_lost(tidemq_cluster, tmp_path,
                                                                   wait_until):
    cluster = tidemq_cluster(brokers=BROKERS)
    namesrv = cluster.namesrv_addr
    create_topic(namesrv)
    members = [Member(tmp_path, namesrv, i) for i in range(3)]
    try:
        wait_until(lambda: shared_exactly(members), START_WAIT_S, what="3 members to share")
        first = [f"p1-{i}" for i in range(3000)]
        produce(namesrv, first)

        def consumed_bodies() -> collections.Counter[str]:
            return collections.Counter(body for m in members for body, _, _ in m.consumed())

        wait_until(lambda: set(first) <= set(consumed_bodies()), CONSUME_WAIT_S,
                   what="phase 1 to be consumed")
        members.append(Member(tmp_path, namesrv, 3))
        wait_until(lambda: shared_exactly(members), START_WAIT_S,
                   what="4 members to share after one joined")

        second = [f"p2-{i}" for i in range(9000)]
        sent_a_third = threading.Event()
        producer = threading.Thread(target=produce, args=(namesrv, second, 0.03, sent_a_third))
        producer.start()
        assert sent_a_third.wait(CONSUME_WAIT_S)
        victim = max(members, key=lambda m: len(m.assignment()))
        victim_queues = victim.assignment()
        os.kill(victim.process.pid, signal.SIGKILL)
        victim.process.wait(STOP_WAIT_S)
        killed_at = time.time()
        survivors = [m for m in members if m is not victim]
        wait_until(lambda: shared_exactly(survivors), REASSIGN_WAIT_S,
                   what="the killed member's queues to be reassigned")
        settled_at = time.time()
        assert victim_queues <= set().union(*(m.assignment() for m in survivors))
        producer.join(CONSUME_WAIT_S)
        assert not producer.is_alive()
        wait_until(lambda: set(second) <= set(consumed_bodies()), CONSUME_WAIT_S,
                   what="phase 2 to be consumed by the survivors")
        time.sleep(1.0)  # late duplicates would show up by now
        consumed = consumed_bodies()
    except BaseException:
        print("\n".join(m.tail() for m in members))
        raise
    finally:
        for member in members:
            member.stop()

    assert set(consumed) == set(first) | set(second)  # nothing lost
    duplicates = sorted(body for body, count in consumed.items() if count > 1)
    first_seen: dict[str, float] = {}
    for member in members:
        for body, _, at in member.consumed():
            first_seen[body] = min(at, first_seen.get(body, at))
    late = [body for body in duplicates if first_seen[body] > settled_at]
    print(f"\nfailover: {len(duplicates)} duplicate(s) of {len(second)} messages in flight; "
          f"killed {victim.name} owning {sorted(victim_queues)}, queues reassigned after "
          f"{settled_at - killed_at:.1f} s")
    assert not [body for body in duplicates if body.startswith("p1-")]
    # Every duplicate was first consumed before the group settled after the kill: it was in
    # flight (pulled, not committed) then, not consumed twice in steady state.
    assert late == []


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "child":
    child_main(*sys.argv[2:])
