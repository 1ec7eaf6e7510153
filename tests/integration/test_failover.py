"""Automatic failover end to end (issue 12): real etcd, name server, `tidemq controller` and
three brokers of one group in controller mode, SYNC_MASTER + SYNC_FLUSH, with producers and a
consumer running; the master is SIGKILLed.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from failover_group import FailoverGroup, Workload, logged_at_ms, read_log
from server_processes import ServerProcess, wait_until

pytestmark = pytest.mark.integration

# Writes must resume on a new master after the old one is SIGKILLed, and bounded; the issue's
# 10 s (and the median of 5 s) is a speed figure, measured over rounds by
# benchmarks/failover_bench.py and recorded in RESULTS.md: at the test timings (2 s leases)
# this test's time is ~3 s on a quiet machine, but a load of 20 on 2 cores stretches every
# step of it (lease expiry, the controller's scan, the switch, the producer's route refresh).
# The time taken is printed, and named in any failure.
WRITES_RESUME_BOUND_S = 60.0


def test_sigkill_of_the_sync_master_elects_a_new_one_that_loses_nothing(
        tmp_path: Path, tidemq_processes: list[ServerProcess]) -> None:
    group = FailoverGroup.start(tmp_path, tidemq_processes)
    try:
        old = group.state()
        assert old is not None and old.master_broker_id == 1 and old.master_epoch == 1
        workload = Workload(group.cluster.namesrv_addr).start()
        try:
            wait_until(lambda: len(workload.acked) >= 100, 120, 0.05, "100 SEND_OK")
            killed_at = time.monotonic() * 1000
            group.brokers[1].kill(signal.SIGKILL)
            new = group.wait_master(other_than=1)
            new_address = group.brokers[new.master_broker_id].addr

            def acked_by_new_master() -> list[float]:
                return [at for at, host, _ in list(workload.acked.values())
                        if host == new_address and at > killed_at]

            wait_until(lambda: bool(acked_by_new_master()), WRITES_RESUME_BOUND_S, 0.05,
                       f"a SEND_OK from the new master {new_address} (brokerId "
                       f"{new.master_broker_id}) after the SIGKILL of brokerId 1")
            took_ms = min(acked_by_new_master()) - killed_at
            print(f"\nSIGKILL of the master -> first SEND_OK on the new master "
                  f"(brokerId {new.master_broker_id}, epoch {new.master_epoch}): "
                  f"{took_ms:.0f} ms")
            wait_until(lambda: len(acked_by_new_master()) >= 100, 120, 0.05,
                       f"100 SEND_OK from the new master (the first came {took_ms:.0f} ms "
                       "after the SIGKILL)")
            wait_until(lambda: set(workload.acked) <= set(workload.received), 120, 0.1,
                       "the consumer to receive every SEND_OK message")
        finally:
            workload.stop()
        assert new.master_epoch == 2
        assert took_ms < WRITES_RESUME_BOUND_S * 1000, (
            f"the new master took {took_ms:.0f} ms to take writes")
        bodies = read_log(group.cluster.namesrv_addr)
        counts: dict[str, int] = {}
        for body in bodies:
            counts[body] = counts.get(body, 0) + 1
        missing = [b for b in workload.acked if b not in counts]
        assert not missing, f"{len(missing)} SEND_OK messages lost: {missing[:10]}"
        twice = [b for b, n in counts.items() if n > 1]
        assert not twice, f"stored twice: {twice[:10]}"
        history = group.history()
        assert [(r.epoch, r.previous_master_broker_id) for r in history] == [(2, 1)]
        assert history[0].reason == "master lease expired"
    except BaseException:
        print(group.log_tails())
        raise
    finally:
        group.stop_outside()


def test_etcd_away_keeps_the_master_serving_and_elections_resume_after(
        tmp_path: Path, tidemq_processes: list[ServerProcess]) -> None:
    # etcd's new leader extends every lease by its TTL (+ 0.5 s here) when it returns; the
    # master's first renewal after that took up to 3.5 s at a load of 15-20 (a request caught
    # in etcd's start-up, or refused, before a new connection got through), so a 2 s lease
    # was sometimes lost and brokerId 2 elected. 5 s leases outlast that; see docs/failover.md.
    group = FailoverGroup.start(tmp_path, tidemq_processes, count=2,
                                overrides={"controllerHeartBeatTimeoutMills": "5000"})
    try:
        master, slave = group.brokers[1], group.brokers[2]
        workload = Workload(group.cluster.namesrv_addr, consume=False).start()
        try:
            wait_until(lambda: len(workload.acked) >= 50, 120, 0.05, "50 SEND_OK")
            group.etcd.stop()
            # Past the fence window with etcd gone: still acknowledging, nobody switched.
            wait_until(lambda: "keeps acknowledging" in master.log_tail(200), 60, 0.1,
                       "the master to keep serving without etcd")
            during = len(workload.acked)
            wait_until(lambda: len(workload.acked) >= during + 200, 120, 0.05,
                       "200 more SEND_OK while etcd is away")
            assert "no election can happen while etcd is away" in master.log_tail(200)
            assert "no election can happen while etcd is away" in slave.log_tail(200)
            group.etcd.start()
            wait_until(lambda: "etcd answers again" in master.log_tail(200), 60, 0.1,
                       "the master to see etcd again")
            state = group.state()
            assert (state.master_broker_id, state.master_epoch) == (1, 1)
            for server in (master, slave):
                assert "fenced in epoch 1" not in server.log_tail(400)
                assert "becomes SYNC_MASTER of epoch 2" not in server.log_tail(400)
            # Elections resume.
            master.kill(signal.SIGKILL)
            assert group.wait_master(other_than=1).master_epoch == 2
        finally:
            workload.stop()
    except BaseException:
        print(group.log_tails())
        raise
    finally:
        group.stop_outside()


def test_a_broker_with_a_wrong_controller_addr_or_another_clusters_etcd_refuses_to_start(
        tmp_path: Path, tidemq_processes: list[ServerProcess], free_port) -> None:
    from etcd_server import EtcdServer
    from failover_group import CONTROLLER_MODE_SETTINGS
    from server_processes import TEST_BROKER_SETTINGS, option_args

    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    try:
        def start(**keys: str) -> subprocess.CompletedProcess[str]:
            settings = {**TEST_BROKER_SETTINGS, **CONTROLLER_MODE_SETTINGS,
                        "brokerId": "1", "brokerRole": "SYNC_MASTER", "listenPort": "0",
                        "storePathRootDir": str(tmp_path / f"store-{len(keys)}"), **keys}
            return subprocess.run([sys.executable, "-m", "tidemq", "broker",
                                   *option_args(settings)], capture_output=True, text=True,
                                  timeout=120, stdin=subprocess.DEVNULL)

        nobody = f"127.0.0.1:{free_port()}"
        wrong = start(controllerAddr=nobody)
        assert wrong.returncode == 2, wrong.stderr
        assert "controller mode cannot start: etcd did not answer" in wrong.stderr
        assert f"controllerAddr={nobody}" in wrong.stderr
        # Another cluster claimed this prefix first.
        first = subprocess.Popen(
            [sys.executable, "-m", "tidemq", "controller", "--controllerAddr", etcd.endpoint,
             "--controllerEtcdPrefix", CONTROLLER_MODE_SETTINGS["controllerEtcdPrefix"],
             "--clusterName", "ClusterA"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        try:
            assert "Ctrl-C to stop" in first.stdout.readline()
        finally:
            first.terminate()
            first.wait(20)
            first.stdout.close()
        other = start(controllerAddr=etcd.endpoint, brokerClusterName="ClusterB")
        assert other.returncode == 2, other.stderr
        assert "holds the failover data of cluster 'ClusterA'" in other.stderr
        # brokerRole=SLAVE, brokerId 0 and bad timings are refused when the config loads:
        # tests/unit/controller/test_controller_config.py.
    finally:
        etcd.stop()



def test_a_sync_send_waits_for_every_member_until_etcd_drops_a_stopped_one(
        tmp_path: Path, tidemq_processes: list[ServerProcess]) -> None:
    """The sync-state rule itself: with members 2 and 3, broker 2 alone acknowledging is not
    enough (the static rule's "one in-sync slave" would answer SEND_OK at once)."""
    group = FailoverGroup.start(tmp_path, tidemq_processes, overrides={
        "syncFlushTimeout": "1000"})
    try:
        stopped = group.brokers[3]
        workload = Workload(group.cluster.namesrv_addr, consume=False).start()
        try:
            wait_until(lambda: len(workload.acked) >= 50, 120, 0.05, "50 SEND_OK")
            stopped.kill(signal.SIGSTOP)
            stopped_at = time.monotonic() * 1000
            try:
                state = group.wait(lambda s: s is not None and 3 not in s.sync_state_set,
                                   "broker 3 to leave the sync-state set")
                shrunk_seen = time.monotonic() * 1000
                assert state.sync_state_set == {1, 2} and state.master_epoch == 1
                wait_until(lambda: any(at > shrunk_seen for at, _, _ in
                                       list(workload.acked.values())), 60, 0.05,
                           "SEND_OK again once the set shrank")
            finally:
                stopped.kill(signal.SIGCONT)
            group.wait(lambda s: s is not None and s.sync_state_set == {1, 2, 3},
                       "broker 3 to rejoin once caught up")
        finally:
            workload.stop()
        # While broker 3 was a member and stopped, nothing sent after the stop was
        # acknowledged: no SEND_OK came before the master logged the smaller set (written to
        # etcd just before, applied just after). Not timed from when the test saw the change:
        # on a busy machine its polling of etcd saw it late, SEND_OKs in between were right.
        left_at = logged_at_ms(group.brokers[1], "brokerId 3 left the sync-state set")
        assert left_at is not None and left_at > stopped_at
        window = [body for body, (at, _, _) in list(workload.acked.items())
                  if workload.sent_at[body] > stopped_at and at < left_at]
        assert not window, f"{len(window)} SEND_OK while a member could not have the message"
        assert "FLUSH_SLAVE_TIMEOUT" in workload.failed.values()
        assert "brokerId 3 left the sync-state set" in group.brokers[1].log_tail(400)
        assert "brokerId 3 joined the sync-state set" in group.brokers[1].log_tail(400)
    except BaseException:
        print(group.log_tails())
        raise
    finally:
        group.stop_outside()
