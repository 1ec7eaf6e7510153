"""The controller's records and election loop against a real etcd on loopback.

One etcd for the module (each test uses its own key prefix); brokers are played by
``ControllerStore`` calls here, so these tests show the etcd side alone: the cluster marker,
leases as liveness, compare-and-set elections and the election history.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from etcd_server import EtcdServer
from tidemq.controller.etcd import (
    ClusterMismatch,
    ControllerStore,
    ControllerUnavailable,
    parse_endpoints,
)
from tidemq.controller.records import GroupState, ReplicaReport
from tidemq.controller.service import ControllerService, ControllerSettings
from tidemq.errors import ConfigError

pytestmark = pytest.mark.integration

LEASE_TTL_S = 2  # etcd's minimum here; the test waits on conditions, never on this


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    server.start()
    yield server
    server.stop()


def _store(etcd: EtcdServer, prefix: str) -> ControllerStore:
    return ControllerStore(parse_endpoints(etcd.endpoint), prefix)


def _report(broker_id: int, offset: int) -> ReplicaReport:
    return ReplicaReport(broker_id, f"127.0.0.1:{1000 + broker_id}",
                         f"127.0.0.1:{2000 + broker_id}", offset, 1, "SLAVE")


def test_the_cluster_marker_refuses_another_cluster(etcd: EtcdServer) -> None:
    async def main() -> None:
        async with _store(etcd, "/t-marker") as store:
            await store.claim_cluster("ClusterA")
            await store.claim_cluster("ClusterA")  # again: fine
            assert await store.cluster_name() == "ClusterA"
            with pytest.raises(ClusterMismatch) as refused:
                await store.claim_cluster("ClusterB")
            message = str(refused.value)
            assert "cluster 'ClusterA'" in message and "'ClusterB'" in message
            assert "/t-marker" in message and "controllerEtcdPrefix" in message
        async with _store(etcd, "/t-marker-b") as other:
            await other.claim_cluster("ClusterB")  # its own prefix: fine

    asyncio.run(main())


def test_an_address_where_no_etcd_answers_is_named(etcd: EtcdServer, free_port) -> None:
    nobody = f"127.0.0.1:{free_port()}"

    async def main() -> None:
        async with ControllerStore(parse_endpoints(nobody), "/t-none",
                                   request_timeout_s=1.0) as store:
            with pytest.raises(ControllerUnavailable) as refused:
                await store.claim_cluster("C")
            assert f"controllerAddr={nobody}" in str(refused.value)
        # A dead endpoint first, then the live one: the request moves on.
        async with ControllerStore(parse_endpoints(f"{nobody};{etcd.endpoint}"), "/t-two",
                                   request_timeout_s=1.0) as store:
            await store.claim_cluster("C")
            assert store.endpoint == etcd.endpoint

    asyncio.run(main())
    with pytest.raises(ConfigError, match="controllerAddr="):
        parse_endpoints("127.0.0.1")


def test_compare_and_set_lets_one_of_two_deciders_win(etcd: EtcdServer) -> None:
    async def main() -> None:
        async with _store(etcd, "/t-cas") as store:
            lease = await store.grant_lease(LEASE_TTL_S)
            state = GroupState("g", 1, 1, "a:1", "a:2", lease, frozenset({1}))
            assert await store.put_state(state, 0)
            assert not await store.put_state(state, 0)  # create only once
            view = await store.read_group("g")
            assert view.state == state
            bumped = GroupState("g", 2, 1, "a:1", "a:2", lease, frozenset({1}))
            assert await store.put_state(bumped, view.state_revision)
            assert not await store.put_state(bumped, view.state_revision)  # stale revision
            assert (await store.read_group("g")).state.master_epoch == 2

    asyncio.run(main())


def test_the_controller_elects_the_freshest_member_when_the_master_lease_ends(
        etcd: EtcdServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "tidemq.controller")

    async def main() -> None:
        async with _store(etcd, "/t-elect") as store:
            await store.claim_cluster("C")
            leases = {b: await store.grant_lease(LEASE_TTL_S) for b in (1, 2, 3, 4)}
            offsets = {1: 5000, 2: 4000, 3: 4500, 4: 9000}  # 4 is outside the set
            for broker_id, offset in offsets.items():
                await store.put_report("g", _report(broker_id, offset), leases[broker_id])
            state = GroupState("g", 1, 1, "127.0.0.1:1001", "127.0.0.1:2001", leases[1],
                               frozenset({1, 2, 3}))
            assert await store.put_state(state, 0)
            service = ControllerService(store, ControllerSettings(scan_interval_s=0.05,
                                                                  report_wait_s=5.0))
            service.start()
            try:
                # Replicas 2-4 keep their leases and keep reporting; the master stops.
                async def keep_reporting() -> None:
                    while True:
                        for broker_id in (2, 3, 4):
                            await store.keep_alive(leases[broker_id])
                            await store.put_report("g", _report(broker_id, offsets[broker_id]),
                                                   leases[broker_id])
                        await asyncio.sleep(0.2)

                reporter = asyncio.get_running_loop().create_task(keep_reporting())
                await asyncio.sleep(0.5)
                assert (await store.read_group("g")).state.master_epoch == 1  # alive: no vote
                await store.revoke(leases[1])  # the master's process is gone
                async with asyncio.timeout(30):
                    while (await store.read_group("g")).state.master_epoch == 1:
                        await asyncio.sleep(0.05)
                reporter.cancel()
            finally:
                await service.stop()
            view = await store.read_group("g")
            assert view.state.master_epoch == 2 and view.state.master_broker_id == 3
            assert view.state.master_lease == leases[3]
            assert view.state.sync_state_set == {2, 3}
            history = await store.history("g")
            assert [r.epoch for r in history] == [2]
            assert history[0].candidate_offsets == {2: 4000, 3: 4500, 4: 9000}
            assert history[0].previous_master_broker_id == 1

    asyncio.run(main())
    assert "elected brokerId 3" in caplog.text
