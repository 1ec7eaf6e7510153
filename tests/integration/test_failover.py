"""Automatic failover end to end (issue 12): real etcd, name server, `tidemq controller` and
three brokers of one group in controller mode, SYNC_MASTER + SYNC_FLUSH, with producers and a
consumer running; the master is SIGKILLed.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from failover_group import FailoverGroup, Workload, read_log
from server_processes import ServerProcess, wait_until

pytestmark = pytest.mark.integration


def test_sigkill_of_the_sync_master_elects_a_new_one_that_loses_nothing(
        tmp_path: Path, tidemq_processes: list[ServerProcess]) -> None:
    group = FailoverGroup.start(tmp_path, tidemq_processes)
    try:
        old = group.state()
        assert old is not None and old.master_broker_id == 1 and old.master_epoch == 1
        workload = Workload(group.cluster.namesrv_addr).start()
        try:
            wait_until(lambda: len(workload.acked) >= 200, 120, 0.05, "200 SEND_OK")
            killed_at = time.monotonic() * 1000
            group.brokers[1].kill(signal.SIGKILL)
            new = group.wait_master(other_than=1)
            new_address = group.brokers[new.master_broker_id].addr

            def acked_by_new_master() -> list[float]:
                return [at for at, host, _ in list(workload.acked.values())
                        if host == new_address and at > killed_at]

            wait_until(lambda: len(acked_by_new_master()) >= 200, 120, 0.05,
                       "200 SEND_OK from the new master")
            took_ms = min(acked_by_new_master()) - killed_at
            print(f"\nSIGKILL of the master -> first SEND_OK on the new master "
                  f"(brokerId {new.master_broker_id}, epoch {new.master_epoch}): "
                  f"{took_ms:.0f} ms")
            wait_until(lambda: set(workload.acked) <= set(workload.received), 120, 0.1,
                       "the consumer to receive every SEND_OK message")
        finally:
            workload.stop()
        assert new.master_epoch == 2
        assert took_ms < 10_000, f"the new master took {took_ms:.0f} ms to take writes"
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
