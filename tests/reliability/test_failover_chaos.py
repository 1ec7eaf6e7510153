"""Seeded chaos against a controller-mode group under a running workload (issue 12).

Each round does one seeded fault to three SYNC_MASTER + SYNC_FLUSH brokers of one group
while producers and a consumer run: SIGKILL the master, SIGKILL a slave, SIGSTOP the master
until another is elected (then SIGCONT: it must fence and follow), or stop the master
cleanly; the broker is started again and the round ends when all three are back in the
sync-state set. At the end, the history check:

- no acknowledged (SEND_OK) message lost: each one is on the final master at the physical
  offset it was acknowledged at, and a fresh consumer reads it;
- none twice in the log;
- epochs strictly increasing (the election history, and the final master's epoch file);
- never two masters acknowledging in one epoch: every SEND_OK's offset falls in one epoch
  of the final master's epoch file, and all of an epoch's acknowledgements came from one
  broker, the one the election history names for that epoch.

The seed is printed (TIDEMQ_CHAOS_SEED replays one). The default suite runs
``DEFAULT_ROUNDS`` rounds to stay lean; TIDEMQ_FAILOVER_CHAOS_ROUNDS=30 runs the issue's 30.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from failover_group import FailoverGroup, Workload, read_log
from server_processes import ServerProcess, remoting_call, wait_until
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand

pytestmark = pytest.mark.reliability

DEFAULT_ROUNDS = 3
FAULTS = ("kill_master", "kill_slave", "stop_master", "clean_stop_master")


def _epoch_cache(addr: str) -> list[tuple[int, int, int]]:
    response = remoting_call(addr, RemotingCommand.request(RequestCode.GET_BROKER_EPOCH_CACHE))
    assert response.code == ResponseCode.SUCCESS, response.remark
    body = jsonx.loads(response.body)
    return [(int(e["epoch"]), int(e["startOffset"]), int(e["endOffset"]))
            for e in body["epochList"]]


def _view(addr: str, physical_offset: int) -> bytes | None:
    request = RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID,
                                      {"offset": str(physical_offset)})
    response = remoting_call(addr, request)
    return response.body if response.code == ResponseCode.SUCCESS else None


def _round(group: FailoverGroup, rng: random.Random, number: int,
           workload: Workload) -> str:
    state = group.state()
    assert state is not None
    master_id = state.master_broker_id
    fault = rng.choice(FAULTS)
    acked_before = len(workload.acked)
    if fault == "kill_slave":
        victim = group.brokers[rng.choice(sorted(set(group.brokers) - {master_id}))]
        victim.kill(signal.SIGKILL)
        victim.start()
    elif fault == "kill_master":
        group.brokers[master_id].kill(signal.SIGKILL)
        group.wait_master(other_than=master_id)
        group.brokers[master_id].start()
    elif fault == "clean_stop_master":
        assert group.brokers[master_id].stop() == 0
        group.wait_master(other_than=master_id)
        group.brokers[master_id].start()
    else:  # stop_master: SIGSTOP isolates it until another is elected, then it wakes
        process = group.brokers[master_id]
        process.kill(signal.SIGSTOP)
        try:
            group.wait_master(other_than=master_id)
        finally:
            process.kill(signal.SIGCONT)
    group.wait(lambda s: s is not None and len(s.sync_state_set) == len(group.brokers),
               f"round {number} ({fault}): every broker back in the sync-state set", 120)
    wait_until(lambda: len(workload.acked) > acked_before, 120, 0.05,
               f"round {number} ({fault}): sends acknowledged again")
    return fault


def test_seeded_chaos_keeps_every_acknowledged_message_once(
        tmp_path: Path, tidemq_processes: list[ServerProcess]) -> None:
    seed = int(os.environ.get("TIDEMQ_CHAOS_SEED", random.randrange(1 << 32)))
    rounds = int(os.environ.get("TIDEMQ_FAILOVER_CHAOS_ROUNDS", DEFAULT_ROUNDS))
    print(f"\nfailover chaos: seed {seed} (TIDEMQ_CHAOS_SEED={seed} replays it), "
          f"{rounds} rounds")
    rng = random.Random(seed)
    group = FailoverGroup.start(tmp_path, tidemq_processes)
    started = time.monotonic()
    faults: list[str] = []
    try:
        workload = Workload(group.cluster.namesrv_addr).start()
        try:
            wait_until(lambda: len(workload.acked) >= 50, 120, 0.05, "50 SEND_OK")
            for number in range(1, rounds + 1):
                faults.append(_round(group, rng, number, workload))
        finally:
            workload.stop()
        print(f"{rounds} rounds ({', '.join(faults)}) in {time.monotonic() - started:.0f} s; "
              f"{len(workload.acked)} SEND_OK, {len(workload.failed)} not acknowledged")
        _check_history(group, workload)
    except BaseException:
        print(f"seed {seed}\n" + group.log_tails())
        raise
    finally:
        group.stop_outside()


def _check_history(group: FailoverGroup, workload: Workload) -> None:
    master = group.master()
    history = group.history()
    epochs = [record.epoch for record in history]
    assert epochs == sorted(set(epochs)) and epochs == list(range(2, 2 + len(epochs))), epochs
    masters = {1: group.brokers[1].addr, **{r.epoch: r.master_address for r in history}}
    cache = _epoch_cache(master.addr)
    cached = [epoch for epoch, _, _ in cache]
    assert cached == sorted(set(cached)), f"epoch file not strictly increasing: {cache}"

    def epoch_of(offset: int) -> int:
        found = [epoch for epoch, start, _ in cache if start <= offset]
        assert found, f"offset {offset} before the first epoch {cache}"
        return found[-1]

    ackers: dict[int, set[str]] = {}
    lost = []
    # Each SEND_OK's offset msg id names the broker that acknowledged it and where.
    for body, (_, host, offset) in list(workload.acked.items()):
        ackers.setdefault(epoch_of(offset), set()).add(host)
        record = _view(master.addr, offset)
        if record is None or body.encode() not in record:
            lost.append((body, host, offset))
    assert not lost, f"{len(lost)} SEND_OK messages not at their offset: {lost[:5]}"
    for epoch, hosts in ackers.items():
        assert hosts == {masters[epoch]}, (
            f"epoch {epoch} acknowledged by {sorted(hosts)}; its master is {masters[epoch]} "
            f"(epoch file of the final master {master.addr}: {cache}; masters {masters})")
    bodies = read_log(group.cluster.namesrv_addr)
    counts: dict[str, int] = {}
    for body in bodies:
        counts[body] = counts.get(body, 0) + 1
    assert not [b for b in workload.acked if b not in counts], "a SEND_OK message unreadable"
    twice = [b for b, n in counts.items() if n > 1]
    assert not twice, f"stored twice: {twice[:10]}"

