"""A broker group in controller mode as real processes: etcd, a name server, a
`tidemq controller` and brokers of one brokerName, for the failover tests and benchmark.

``FailoverGroup.start(workdir, processes, count=3, flavour="SYNC_MASTER")`` starts them in
that order (broker 1 first, so it is the first master) and waits until every broker is in
the sync-state set. ``group.state()`` reads the group's record from etcd, ``group.master()``
is the process etcd names master, ``group.wait_master(other_than=...)`` waits for an election.
Short leases (2 s, etcd's minimum) keep a failover within a few seconds; every wait is a
bounded poll on a condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from etcd_server import EtcdServer
from server_processes import (
    TEST_BROKER_SETTINGS,
    ServerProcess,
    TidemqCluster,
    option_args,
    start_cluster,
    wait_until,
)
from tidemq.controller.etcd import ControllerStore, GroupView, parse_endpoints
from tidemq.controller.records import ElectionRecord, GroupState

BROKER_NAME = "broker-a"
PREFIX = "/tidemq-test"
# Short timings for tests (docs/failover.md explains each); a failover takes ~3-4 s.
CONTROLLER_MODE_SETTINGS: Mapping[str, str] = {
    "enableControllerMode": "true",
    "controllerEtcdPrefix": PREFIX,
    "controllerHeartBeatTimeoutMills": "2000",
    "brokerHeartbeatInterval": "200",
    "controllerFenceMarginMills": "700",
    "haMaxTimeSlaveNotCatchup": "3000",
    "haSendHeartbeatInterval": "200",
    "haHousekeepingInterval": "5000",
}
START_TIMEOUT_S = 60.0


class ControllerProcess:
    """One ``tidemq controller`` process (no port of its own: ready when it says so)."""

    def __init__(self, workdir: Path, controller_addr: str) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.controller_addr = controller_addr
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "controller.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tidemq", "controller", "--controllerAddr",
                 self.controller_addr, "--controllerEtcdPrefix", PREFIX,
                 "--scanIntervalMs", "100", "--electionReportWaitMs", "1000"],
                cwd=self.workdir, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                start_new_session=True)
        wait_until(lambda: "Ctrl-C to stop" in self.log_path.read_bytes()[offset:].decode(
            errors="replace") or not self.running, START_TIMEOUT_S, 0.05, "the controller")
        assert self.running, self.log_tail()

    def stop(self) -> None:
        if self.running:
            assert self.process is not None
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(20)

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "--- controller ---\n" + "\n".join(text.splitlines()[-lines:])


def _broker(workdir: Path, broker_id: int, namesrv: str, controller_addr: str,
            overrides: Mapping[str, str]) -> ServerProcess:
    folder = workdir / f"b{broker_id}"

    def make_args(port: int) -> list[str]:
        settings = {**TEST_BROKER_SETTINGS, **CONTROLLER_MODE_SETTINGS,
                    "brokerName": BROKER_NAME, "brokerId": str(broker_id),
                    "controllerAddr": controller_addr, "listenPort": str(port),
                    "storePathRootDir": str(folder / "store"), **overrides}
        return [*option_args(settings), "-n", namesrv]

    return ServerProcess("broker", f"b{broker_id}", folder, make_args, port_neighbours=(-2, 1))


@dataclass
class FailoverGroup:
    """etcd, name server, controller and the brokers of one group (module docstring)."""

    etcd: EtcdServer
    cluster: TidemqCluster
    controller: ControllerProcess
    brokers: dict[int, ServerProcess] = field(default_factory=dict)

    @classmethod
    def start(cls, workdir: Path, processes: list[ServerProcess], count: int = 3,
              flavour: str = "SYNC_MASTER",
              overrides: Mapping[str, str] | None = None) -> FailoverGroup:
        etcd = EtcdServer(workdir / "etcd")
        etcd.start()
        group = cls(etcd, TidemqCluster([], []), ControllerProcess(workdir / "controller",
                                                                   etcd.endpoint))
        try:
            group.cluster = start_cluster(workdir, processes, brokers=())
            group.controller.start()
            settings = {"brokerRole": flavour, "flushDiskType": "SYNC_FLUSH",
                        **(overrides or {})}
            for broker_id in range(1, count + 1):
                broker = _broker(workdir, broker_id, group.cluster.namesrv_addr,
                                 etcd.endpoint, settings)
                processes.append(broker)
                group.brokers[broker_id] = broker
                broker.start()
            group.wait(lambda s: s is not None and len(s.sync_state_set) == count,
                       "every broker in the sync-state set")
        except BaseException:
            group.stop_outside()
            raise
        return group

    def stop_outside(self) -> None:
        """Stop what ServerProcess fixtures do not: the controller and etcd."""
        self.controller.stop()
        self.etcd.stop()

    # -- reading etcd ---------------------------------------------------------------------------

    def view(self) -> GroupView:
        async def read() -> GroupView:
            async with ControllerStore(parse_endpoints(self.etcd.endpoint), PREFIX) as store:
                return await store.read_group(BROKER_NAME)
        return asyncio.run(read())

    def state(self) -> GroupState | None:
        return self.view().state

    def history(self) -> list[ElectionRecord]:
        async def read() -> list[ElectionRecord]:
            async with ControllerStore(parse_endpoints(self.etcd.endpoint), PREFIX) as store:
                return await store.history(BROKER_NAME)
        return asyncio.run(read())

    def wait(self, condition, what: str, timeout_s: float = 60.0) -> GroupState:
        found: list[GroupState | None] = [None]

        def check() -> bool:
            with contextlib.suppress(Exception):
                found[0] = self.state()
                return bool(condition(found[0]))
            return False

        wait_until(check, timeout_s, 0.05, what)
        assert found[0] is not None
        return found[0]

    def master(self) -> ServerProcess:
        state = self.state()
        assert state is not None
        return self.brokers[state.master_broker_id]

    def wait_master(self, other_than: int, timeout_s: float = 60.0) -> GroupState:
        """The state once a broker other than ``other_than`` is master."""
        return self.wait(lambda s: s is not None and s.master_broker_id != other_than,
                         f"a master other than brokerId {other_than}", timeout_s)

    def log_tails(self) -> str:
        parts = [self.controller.log_tail(), "--- etcd ---\n" + self.etcd.log_tail(10)]
        parts += [b.log_tail(30) for b in self.brokers.values()]
        return "\n".join(parts)


def monotonic_ms() -> float:
    return time.monotonic() * 1000


def logged_at_ms(server: ServerProcess, text: str) -> float | None:
    """When ``server`` first logged a line holding ``text``, on ``monotonic_ms``'s clock.

    Read from its store's logs/broker.log (millisecond timestamps in local time); None when no
    line holds it yet.
    """
    path = server.workdir / "store" / "logs" / "broker.log"
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    for line in lines:
        if text in line:
            logged = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return (logged.timestamp() - time.time() + time.monotonic()) * 1000
    return None


TOPIC = "FailoverOrders"


class Workload:
    """Producers and a consumer running in a thread of their own against the group.

    Every send carries a new body (never a retry of an earlier one), so "no body twice in
    the log" checks the store, not the client. ``acked`` maps each SEND_OK body to
    (monotonic ms of the answer, the store host and physical offset of its offset msg id);
    ``sent_at`` maps every body to the monotonic ms its send began; ``received`` counts
    what the consumer polled.
    """

    def __init__(self, namesrv: str, lanes: int = 2, consume: bool = True) -> None:
        import threading

        self.namesrv = namesrv
        self.lanes = lanes
        self.consume = consume
        self.acked: dict[str, tuple[float, str, int]] = {}
        self.failed: dict[str, str] = {}
        self.sent_at: dict[str, float] = {}
        self.received: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="failover-workload",
                                        daemon=True)
        self.error: BaseException | None = None

    def start(self) -> Workload:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "the workload did not stop"
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        from tidemq.remoting.loop import run

        try:
            run(self._main())
        except BaseException as e:  # reported by stop()
            self.error = e

    async def _main(self) -> None:
        tasks = [asyncio.ensure_future(self._produce(lane)) for lane in range(self.lanes)]
        if self.consume:
            tasks.append(asyncio.ensure_future(self._consume()))
        while not self._stop.is_set():
            await asyncio.sleep(0.05)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _produce(self, lane: int) -> None:
        from tidemq.client import Message, Producer
        from tidemq.client.message import SendStatus
        from tidemq.protocol.msgid import decode_offset_msg_id

        async with Producer(f"failover-p{lane}", self.namesrv, retry_times_when_send_failed=0,
                            send_timeout_ms=3000, poll_name_server_interval_ms=500) as producer:
            index = 0
            while True:
                body = f"l{lane}-{index}"
                index += 1
                self.sent_at[body] = monotonic_ms()
                try:
                    result = await producer.send(Message(TOPIC, body.encode()))
                except Exception as e:  # refused or unreachable: not acknowledged
                    self.failed[body] = type(e).__name__
                    await asyncio.sleep(0.05)
                    continue
                if result.status is SendStatus.SEND_OK:
                    host, offset = decode_offset_msg_id(result.offset_msg_id)
                    self.acked[body] = (monotonic_ms(), host, offset)
                else:
                    self.failed[body] = result.status.value

    async def _consume(self) -> None:
        from tidemq.client import PullConsumer

        consumer = PullConsumer("failover-c", self.namesrv, consume_from="FIRST",
                                poll_name_server_interval_ms=500)
        consumer.subscribe(TOPIC, "*")
        async with consumer:
            while True:
                try:
                    batch = await consumer.poll(timeout_ms=500)
                except Exception:
                    await asyncio.sleep(0.1)
                    continue
                for message in batch:
                    body = message.body.decode()
                    self.received[body] = self.received.get(body, 0) + 1


def read_log(namesrv: str) -> list[str]:
    """Every body in the topic's queues on its current master, read from the first offset by
    a fresh consumer group (so each stored message is read once)."""
    from tidemq.client import PullConsumer
    from tidemq.remoting.loop import run

    async def main() -> list[str]:
        bodies: list[str] = []
        consumer = PullConsumer(f"failover-check-{time.monotonic_ns()}", namesrv,
                                consume_from="FIRST", poll_name_server_interval_ms=500)
        consumer.subscribe(TOPIC, "*")
        async with consumer:
            idle = 0
            while idle < 6:
                batch = await consumer.poll(timeout_ms=500)
                idle = 0 if batch else idle + 1
                bodies += [m.body.decode() for m in batch]
        return bodies

    return run(main())
