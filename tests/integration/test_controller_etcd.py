"""The controller's records and election loop against a real etcd on loopback.

One etcd for the module (each test uses its own key prefix); brokers are played by
``ControllerStore`` calls here, so these tests show the etcd side alone: the cluster marker,
leases as liveness, compare-and-set elections and the election history.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from etcd_server import EtcdServer
from tidemq.cli.admin_command import admin
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
        # A dead endpoint first, then the live one: the request moves on. The dead one
        # refuses at once; the bound is for the live one, whose first request (a new gRPC
        # channel) may take over a second on a busy machine.
        async with ControllerStore(parse_endpoints(f"{nobody};{etcd.endpoint}"), "/t-two",
                                   request_timeout_s=10.0) as store:
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
            master_alive = asyncio.Event()
            master_alive.set()

            # Every lease is renewed from the start, the master's until its process is gone
            # (granted and left alone, 2 s leases ran out on a busy machine before the test
            # got to its checks), and replicas 2-4 keep reporting.
            async def keep_reporting() -> None:
                while True:
                    if master_alive.is_set():
                        with contextlib.suppress(ControllerUnavailable):
                            await store.keep_alive(leases[1])
                    for broker_id in (2, 3, 4):
                        await store.keep_alive(leases[broker_id])
                        await store.put_report("g", _report(broker_id, offsets[broker_id]),
                                               leases[broker_id])
                    await asyncio.sleep(0.2)

            reporter = asyncio.get_running_loop().create_task(keep_reporting())
            await store.put_report("g", _report(1, offsets[1]), leases[1])
            state = GroupState("g", 1, 1, "127.0.0.1:1001", "127.0.0.1:2001", leases[1],
                               frozenset({1, 2, 3}))
            assert await store.put_state(state, 0)
            service = ControllerService(store, ControllerSettings(scan_interval_s=0.05,
                                                                  report_wait_s=5.0))
            service.start()
            try:
                async with asyncio.timeout(30):  # every replica reported under its lease
                    while len((await store.read_group("g")).replicas) < 4:
                        await asyncio.sleep(0.05)
                await asyncio.sleep(0.5)
                assert (await store.read_group("g")).state.master_epoch == 1  # alive: no vote
                master_alive.clear()
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


@dataclass
class _Ran:
    returncode: int
    stdout: str
    stderr: str


def _admin(*args: str) -> _Ran:
    """``tidemq admin`` in-process (a process start costs seconds on a busy machine)."""
    result = CliRunner().invoke(admin, list(args))
    assert "Traceback" not in result.output
    return _Ran(result.exit_code, result.stdout, result.stderr)


def test_admin_verbs_show_the_group_and_elect_by_the_rules(etcd: EtcdServer) -> None:
    prefix = "/t-admin"
    where = ["-a", etcd.endpoint, "--controllerEtcdPrefix", prefix]

    async def setup() -> dict[int, int]:
        async with _store(etcd, prefix) as store:
            await store.claim_cluster("AdminCluster")
            # Long leases: the "brokers" here are this test, which does not renew them.
            leases = {b: await store.grant_lease(60) for b in (1, 2, 3)}
            for broker_id, offset in ((1, 700), (2, 650), (3, 10)):
                await store.put_report("broker-x", _report(broker_id, offset), leases[broker_id])
            assert await store.put_state(GroupState(
                "broker-x", 1, 1, "127.0.0.1:1001", "127.0.0.1:2001", leases[1],
                frozenset({1, 2})), 0)
            return leases

    asyncio.run(setup())
    meta = json.loads(_admin("getControllerMetaData", *where, "--json").stdout)
    assert meta["cluster"] == "AdminCluster" and meta["groups"] == ["broker-x"]
    assert meta["prefix"] == prefix and len(meta["etcdMembers"]) == 1
    table = _admin("getSyncStateSet", *where, "-b", "broker-x")
    assert table.returncode == 0, table.stderr
    assert "masterEpoch" in table.stdout and "127.0.0.1:1003" in table.stdout
    sync = json.loads(_admin("getSyncStateSet", *where, "-b", "broker-x", "--json").stdout)
    assert sync["state"]["syncStateSet"] == [1, 2] and sync["masterAlive"] is True
    assert [r["confirmedOffset"] for r in sync["replicas"]] == [700, 650, 10]
    unknown = _admin("getSyncStateSet", *where, "-b", "broker-y")
    assert unknown.returncode == 1 and "known: broker-x" in unknown.stderr

    refused = _admin("electMaster", *where, "-b", "broker-x", "-i", "3")
    assert refused.returncode == 1
    assert "not in the sync-state set {1, 2}" in refused.stderr and "--force" in refused.stderr
    elected = json.loads(_admin("electMaster", *where, "-b", "broker-x", "-i", "2",
                                "--json").stdout)
    assert (elected["epoch"], elected["masterBrokerId"]) == (2, 2)
    forced = _admin("electMaster", *where, "-b", "broker-x", "-i", "3", "--force")
    assert forced.returncode == 0 and "epoch 3" in forced.stdout, forced.stderr
    epochs = json.loads(_admin("getBrokerEpoch", *where, "-b", "broker-x", "--json").stdout)
    assert [(e["epoch"], e["masterBrokerId"], e["reason"]) for e in epochs] == [
        (2, 2, "electMaster"), (3, 3, "electMaster --force")]
    assert "electMaster --force" in _admin("getBrokerEpoch", *where, "-b", "broker-x").stdout
    nobody = _admin("getSyncStateSet", "-a", "127.0.0.1:1", "-b", "broker-x")
    assert nobody.returncode == 1 and "controllerAddr=127.0.0.1:1" in nobody.stderr


def test_an_async_group_election_shows_its_loss_window(etcd: EtcdServer) -> None:
    prefix = "/t-async"
    where = ["-a", etcd.endpoint, "--controllerEtcdPrefix", prefix]

    async def setup() -> None:
        async with _store(etcd, prefix) as store:
            await store.claim_cluster("AsyncCluster")
            gone = await store.grant_lease(LEASE_TTL_S)
            alive = await store.grant_lease(60)
            await store.put_report("broker-z", _report(2, 9000), alive)
            assert await store.put_state(GroupState(
                "broker-z", 1, 1, "127.0.0.1:1001", "127.0.0.1:2001", gone,
                frozenset({1, 2}), master_flavour="ASYNC_MASTER"), 0)
            await store.put_master_offset("broker-z", 1, 12000)  # the old master's last word
            await store.revoke(gone)

    asyncio.run(setup())
    elected = json.loads(_admin("electMaster", *where, "-b", "broker-z", "--json").stdout)
    assert (elected["lossFromOffset"], elected["lossToOffset"]) == (9000, 12000)
    assert elected["possibleLossBytes"] == 3000 and elected["flavour"] == "ASYNC_MASTER"
    table = _admin("getBrokerEpoch", *where, "-b", "broker-z")
    assert "9000..12000 (3000 bytes)" in table.stdout, table.stdout


def test_the_controller_command_claims_the_prefix_and_elects(etcd: EtcdServer,
                                                             tmp_path: Path) -> None:
    prefix = "/t-command"

    async def setup() -> int:
        async with _store(etcd, prefix) as store:
            await store.claim_cluster("CmdCluster")
            master = await store.grant_lease(LEASE_TTL_S)
            survivor = await store.grant_lease(60)
            await store.put_report("g", _report(1, 100), master)
            await store.put_report("g", _report(2, 90), survivor)
            assert await store.put_state(GroupState(
                "g", 7, 1, "127.0.0.1:1001", "127.0.0.1:2001", master, frozenset({1, 2})), 0)
            return survivor

    asyncio.run(setup())
    wrong = subprocess.run(
        [sys.executable, "-m", "tidemq", "controller", "--controllerAddr", etcd.endpoint,
         "--controllerEtcdPrefix", prefix, "--clusterName", "OtherCluster"],
        capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 1 and "holds the failover data of cluster 'CmdCluster'" in \
        wrong.stderr
    log_path = tmp_path / "controller.out"
    with open(log_path, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "tidemq", "controller", "--controllerAddr", etcd.endpoint,
             "--controllerEtcdPrefix", prefix, "--clusterName", "CmdCluster",
             "--scanIntervalMs", "50", "--electionReportWaitMs", "0"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def epoch() -> int:
            async def read() -> int:
                async with _store(etcd, prefix) as store:
                    return (await store.read_group("g")).state.master_epoch
            return asyncio.run(read())

        deadline = time.monotonic() + 60
        while epoch() == 7:  # the master's 2 s lease runs out; broker 2 takes over
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        assert epoch() == 8
        meta = json.loads(_admin("getControllerMetaData", "-a", etcd.endpoint,
                                 "--controllerEtcdPrefix", prefix, "--json").stdout)
        assert len(meta["controllers"]) == 1
    finally:
        process.terminate()
        process.wait(20)
    text = log_path.read_text()
    assert "Ctrl-C to stop" in text and "elected brokerId 2" in text, text
