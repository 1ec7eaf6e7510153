"""ControllerAgent (broker/controller_agent.py) against a real etcd, with a recording role.

The role and HA connections are stand-ins here (what the agent decides, not how a broker
switches: tests/integration/test_failover.py runs real brokers), so every rule of the agent
is seen directly: the first broker becomes master, others follow, a lost lease fences, the
sync-state set grows and shrinks through etcd, and an etcd outage changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from etcd_server import EtcdServer
from tidemq.broker.config import BrokerConfig, BrokerRole
from tidemq.broker.controller_agent import ControllerAgent
from tidemq.controller.etcd import ControllerStore, parse_endpoints
from tidemq.controller.service import ControllerService, ControllerSettings
from tidemq.errors import ConfigError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd-agent"))
    server.start()
    yield server
    server.stop()


@dataclass
class FakeConnection:
    peer: str
    acked_offset: int = -1
    last_read_monotonic: float = field(default_factory=time.monotonic)


class FakeWaits:
    def __init__(self) -> None:
        self.acked_offset = 0

    def reset_acked(self, offset: int) -> None:
        self.acked_offset = min(self.acked_offset, offset)

    def acknowledge(self, offset: int) -> None:
        self.acked_offset = max(self.acked_offset, offset)


class FakeService:
    host, port = "127.0.0.1", 0

    def __init__(self) -> None:
        self.connections: list[FakeConnection] = []
        self.waits = FakeWaits()


class FakeClient:
    def __init__(self, local_address: str) -> None:
        self.local_address = local_address


class FakeReplication:
    def __init__(self, local_address: str) -> None:
        self.service: FakeService | None = FakeService()
        self.client: FakeClient | None = None
        self._local = local_address


class FakeRole:
    """Records the switches the agent asks for."""

    def __init__(self, local_address: str) -> None:
        self.epoch = 0
        self.fenced_reason: str | None = None
        self.master_address: str | None = None
        self.is_master = True
        self.replication = FakeReplication(local_address)
        self.calls: list[tuple] = []

    def fence(self, reason: str) -> None:
        self.fenced_reason = reason
        self.calls.append(("fence", reason))

    async def become_master(self, epoch: int, master_role: BrokerRole | None = None) -> None:
        self.is_master, self.epoch, self.fenced_reason = True, epoch, None
        self.replication.client = None
        self.replication.service = self.replication.service or FakeService()
        self.calls.append(("master", epoch))

    async def become_slave(self, epoch: int, master_addr: str, master_ha_addr: str,
                           broker_id: int) -> None:
        self.is_master, self.epoch, self.fenced_reason = False, epoch, None
        self.master_address = master_addr
        self.replication.service = None
        self.replication.client = FakeClient(self.replication._local)
        self.calls.append(("slave", epoch, master_addr, broker_id))


class FakeStore:
    def __init__(self) -> None:
        self.offset = 0

    def commit_log_max_offset(self) -> int:
        return self.offset


@dataclass
class FakeIdentity:
    address: str
    ha_server_address: str


@dataclass
class Broker:
    agent: ControllerAgent
    role: FakeRole
    store: FakeStore


def _broker(etcd: EtcdServer, prefix: str, broker_id: int, **keys: object) -> Broker:
    keys = {"broker_role": BrokerRole.SYNC_MASTER, **keys}
    config = BrokerConfig(
        broker_name="g", broker_id=broker_id,
        enable_controller_mode=True, controller_addr=etcd.endpoint,
        controller_etcd_prefix=prefix, controller_heart_beat_timeout_ms=2000,
        broker_heartbeat_interval_ms=100, controller_fence_margin_ms=500,
        ha_max_time_slave_not_catchup_ms=300, **keys)
    role = FakeRole(f"127.0.0.1:{40000 + broker_id}")
    store = FakeStore()
    identity = FakeIdentity(f"127.0.0.1:{10000 + broker_id}", f"127.0.0.1:{20000 + broker_id}")
    return Broker(ControllerAgent(config, role, store, identity, 1000), role, store)


async def _until(condition, what: str, timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.02)
    del what


def test_first_broker_is_master_others_follow_and_the_set_grows_and_shrinks(
        etcd: EtcdServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    prefix = "/a-grow"

    async def main() -> None:
        one, two = _broker(etcd, prefix, 1), _broker(etcd, prefix, 2)
        await one.agent.start()
        assert one.role.calls[0][0] == "fence"  # nothing acknowledged before the decision
        assert one.role.calls[-1] == ("master", 1)
        await two.agent.start()
        assert two.role.calls[-1] == ("slave", 1, "127.0.0.1:10001", 2)
        try:
            # Broker 2 connects to the master's HA port and catches up: it joins the set.
            one.store.offset = 500
            one.role.replication.service.waits.acked_offset = 400
            connection = FakeConnection("127.0.0.1:40002", acked_offset=500)
            one.role.replication.service.connections.append(connection)
            await _until(lambda: one.agent.policy.members == {2}, "broker 2 joins")
            async with ControllerStore(parse_endpoints(etcd.endpoint), prefix) as store:
                state = (await store.read_group("g")).state
            assert state.sync_state_set == {1, 2} and state.sync_state_set_epoch == 2
            assert one.agent.policy.ack_offset(one.role.replication.service.connections) == 500
            # It stops acknowledging (falls too far behind) for longer than the limit: out.
            one.store.offset = 5000
            await _until(lambda: one.agent.policy.members == frozenset(), "broker 2 leaves")
        finally:
            await two.agent.stop()
            await one.agent.stop()

    asyncio.run(main())
    assert "brokerId 2 joined the sync-state set of g at offset 500" in caplog.text
    assert "brokerId 2 left the sync-state set of g: not caught up" in caplog.text


def test_a_master_that_cannot_renew_fences_before_its_lease_ends_and_a_slave_takes_over(
        etcd: EtcdServer) -> None:
    prefix = "/a-fence"

    async def main() -> None:
        one, two = _broker(etcd, prefix, 1), _broker(etcd, prefix, 2)
        await one.agent.start()
        await two.agent.start()
        store = ControllerStore(parse_endpoints(etcd.endpoint), prefix)
        service = ControllerService(store, ControllerSettings(scan_interval_s=0.05,
                                                              report_wait_s=1.0))
        service.start()
        try:
            # Both join: broker 2 is a member, so it may be elected.
            one.role.replication.service.connections.append(
                FakeConnection("127.0.0.1:40002", acked_offset=0))
            await _until(lambda: one.agent.policy.members == {2}, "broker 2 joins")
            # The master's heartbeat stops (as if cut off from etcd); its slave stops copying.
            for task in one.agent._tasks[:1]:
                task.cancel()
            one.role.replication.service.connections.clear()
            lease_gone_at = None

            def fenced() -> bool:
                return one.role.fenced_reason is not None

            await _until(fenced, "the master fences itself")
            fenced_at = time.monotonic()
            async with ControllerStore(parse_endpoints(etcd.endpoint), prefix) as reader:
                view = await reader.read_group("g")
                assert view.master_alive(), "fenced only once its lease was gone"
                await _until(lambda: two.role.is_master, "broker 2 is elected")
                lease_gone_at = time.monotonic()
                state = (await reader.read_group("g")).state
            assert (state.master_broker_id, state.master_epoch) == (2, 2)
            assert two.role.calls[-1] == ("master", 2)
            assert lease_gone_at > fenced_at
            assert "could not renew its etcd lease" in one.role.fenced_reason
        finally:
            await service.stop()
            await store.close()
            await two.agent.stop()
            await one.agent.stop()

    asyncio.run(main())


def test_etcd_away_changes_nothing_and_members_keep_a_master_serving(
        etcd: EtcdServer, tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    own = EtcdServer(tmp_path / "etcd-outage")
    own.start()
    prefix = "/a-outage"

    async def main() -> None:
        one, two = _broker(own, prefix, 1), _broker(own, prefix, 2)
        await one.agent.start()
        await two.agent.start()
        connection = FakeConnection("127.0.0.1:40002", acked_offset=0)
        one.role.replication.service.connections.append(connection)
        try:
            await _until(lambda: one.agent.policy.members == {2}, "broker 2 joins")
            calls = (len(one.role.calls), len(two.role.calls))
            own.stop()
            # Past the fence window with etcd away, the slave still copying: no fence.
            deadline = time.monotonic() + 2 * one.agent.fence_after_s
            while time.monotonic() < deadline:
                connection.last_read_monotonic = time.monotonic()
                await asyncio.sleep(0.05)
            assert one.role.fenced_reason is None and two.role.is_master is False
            assert (len(one.role.calls), len(two.role.calls)) == calls
            own.start()
            await _until(lambda: one.agent._etcd_down_since is None, "etcd back", 60)
            assert one.role.fenced_reason is None and one.role.epoch == 1
            # Now the slave stops copying and etcd is gone again: the master fences.
            own.stop()
            await _until(lambda: one.role.fenced_reason is not None, "fenced without members")
        finally:
            await two.agent.stop()
            await one.agent.stop()

    try:
        asyncio.run(main())
    finally:
        own.stop()
    assert "keeps acknowledging" in caplog.text
    assert "no election can happen while etcd is away" in caplog.text
    assert "etcd answers again" in caplog.text


def test_a_wrong_controller_addr_or_another_cluster_refuses_the_start(
        etcd: EtcdServer, free_port) -> None:
    async def main() -> None:
        nobody = _broker(etcd, "/a-bad", 1)
        nobody.agent.store.endpoints = parse_endpoints(f"127.0.0.1:{free_port()}")
        with pytest.raises(ConfigError, match="controller mode cannot start: etcd did not"):
            await nobody.agent.start()
        first = _broker(etcd, "/a-bad", 1)
        await first.agent.start()
        await first.agent.stop()
        other = _broker(etcd, "/a-bad", 1, broker_cluster_name="OtherCluster")
        with pytest.raises(ConfigError, match="holds the failover data of cluster"):
            await other.agent.start()

    asyncio.run(main())


def test_an_async_master_elected_with_a_gap_logs_the_loss_window(
        etcd: EtcdServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    prefix = "/a-async"

    async def main() -> None:
        one = _broker(etcd, prefix, 1, broker_role=BrokerRole.ASYNC_MASTER)
        two = _broker(etcd, prefix, 2, broker_role=BrokerRole.ASYNC_MASTER)
        await one.agent.start()
        await two.agent.start()
        connection = FakeConnection("127.0.0.1:40002", acked_offset=0)
        one.role.replication.service.connections.append(connection)
        await _until(lambda: one.agent.policy.members == {2}, "broker 2 joins")
        # The master acknowledged up to 12,000 (ASYNC: without waiting); its slave, still in
        # sync (within haMaxGapNotInSync), has 11,500.
        one.store.offset, two.store.offset = 12_000, 11_500
        connection.acked_offset = 11_500
        store = ControllerStore(parse_endpoints(etcd.endpoint), prefix)
        # Both offsets reported (a fixed 0.5 s here was too short for the heartbeats under load).
        async with asyncio.timeout(30):
            while True:
                view = await store.read_group("g")
                if (view.master_offset == (1, 12_000) and 2 in view.replicas
                        and view.replicas[2].confirmed_offset == 11_500):
                    break
                await asyncio.sleep(0.05)
        service = ControllerService(store, ControllerSettings(scan_interval_s=0.05))
        service.start()
        try:
            for task in one.agent._tasks:  # the master process dies: no renewal, no revoke
                task.cancel()
            await _until(lambda: two.role.is_master, "broker 2 is elected", 60)
            await _until(lambda: "may be lost" in caplog.text, "the loss window is logged")
        finally:
            await service.stop()
            await store.close()
            await two.agent.stop()
            one.agent.lease = 0
            await one.agent.stop()

    asyncio.run(main())
    line = next(t for t in caplog.text.splitlines() if "may be lost" in t)
    assert "reported offset 12000" in line and "starts at 11500" in line
    assert "up to 500 bytes" in line
