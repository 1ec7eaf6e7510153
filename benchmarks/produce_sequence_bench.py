"""figures.py's batch-produce sequence alone, split round by round (issue 18, ``produce_batch``):

    .venv/bin/python benchmarks/produce_sequence_bench.py [--runs 3] [--messages 200000]
        [--case figures] [--case nosync] [--case warm] [--case warm-nosync]
        [--src NAME=TREE ...] [--profile ROUND] [--json]

figures.py's ``produce_batch`` row is the mean of two rounds of ``tidemq bench produce -s
1024 -b 64 -c 16`` against a fresh ASYNC_FLUSH ``tidemq dev``: round 0 on topic FigBatch0
right after the broker started, round 1 on FigBatch1, each preceded by a 256-message
calibration run on the same topic (broker_bench.produce_with_cpu), alternating with the same
on a SYNC_FLUSH broker that is alive beside it. This harness runs that sequence and variants
of it, so the gap between figures.py and the same command against one warm broker can be
split:

- ``figures``: as figures.py (ASYNC, SYNC; then SYNC, ASYNC), the SYNC broker alive;
- ``nosync``: the ASYNC broker's two rounds alone (no SYNC broker started);
- ``warm``: as ``figures``, after ``--warmup`` messages to another topic of the ASYNC broker
  (its first commit-log segments, index and queue files touched before round 0);
- ``warm-nosync``: both;
- ``figures-settled``: as ``figures``, but before each ASYNC round every dirty page on the
  machine is written (``sync``) and the harness waits ``SETTLE_S`` more: whether what the SYNC
  broker's round leaves behind (its writes, the journal) costs the ASYNC round.

Per ASYNC round it prints msg/s and, per message of the timed run, the broker's CPU (all
threads), its event loop's (main thread) CPU (and the system part of it) and minor page
faults, the other threads' CPU,
the broker's major faults (whole run), the SYNC broker's CPU beside it (µs per ASYNC message),
the whole machine's busy CPU (every process and kernel thread: client, writeback, neighbours),
the machine's dirty page cache at the round's start and what it wrote to disk during it (MB),
and as shares of the run the event loop's time waiting for a core (``runq``) and with nothing
to do (``idle``, it waited for the producer). With ``--src NAME=TREE`` (a tree whose
``src/`` holds tidemq, e.g. ``git archive <commit> src | tar -x -C /tmp/x``, or ``.``; what
follows each comma goes to the ASYNC broker's ``tidemq dev``, as in
``warm=.,--warmMapedFileEnable,true``) every case runs for every tree, order rotated per
run: an A/B alternated in one run. ``--profile ROUND`` records the ASYNC broker with py-spy
(``--py-spy``) during that round of the first case of the first run, into ``--dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from broker_bench import CALIBRATION_MESSAGES, DevServer, bench
from idle import wait_process_idle
from latency_bench import load_average
from produce_ab_bench import _PythonPath
from store_bench import machine_description

CASES = ("figures", "nosync", "warm", "warm-nosync", "figures-settled")
SETTLE_S = 3.0  # figures-settled: the pause after the disk's sync before each ASYNC round
ROUNDS = 2


def _stat(path: str) -> tuple[float, int, int]:
    """(CPU seconds, minor faults, major faults) from a /proc stat file."""
    with open(path) as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, int(fields[7]), int(fields[9])


def _schedstat(pid: int) -> tuple[float, float]:
    with open(f"/proc/{pid}/task/{pid}/schedstat") as stat:
        on_core_ns, waiting_ns, _ = stat.read().split()
    return int(on_core_ns) / 1e9, int(waiting_ns) / 1e9


def _threads_on_core(pid: int) -> float:
    """Seconds on a core of every thread of ``pid`` alive now (schedstat: nanoseconds, where
    /proc/<pid>/stat counts 10 ms ticks); a thread that ended meanwhile is not counted."""
    total = 0.0
    for thread in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{thread}/schedstat") as stat:
                total += int(stat.read().split()[0]) / 1e9
        except OSError:
            continue  # ended meanwhile
    return total


def _system_busy_s() -> float:
    """Seconds the machine's cores spent busy (not idle or waiting for I/O) so far."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _main_system_s(pid: int) -> float:
    """System CPU seconds of ``pid``'s main thread so far (10 ms ticks)."""
    with open(f"/proc/{pid}/task/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[12]) / os.sysconf("SC_CLK_TCK")


def _machine_io() -> tuple[float, float]:
    """(MB dirty in the page cache now, MB the machine has written to disk so far)."""
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    dirty_mb = int(fields["Dirty"].split()[0]) / 1024
    with open("/proc/vmstat") as vmstat:
        written = next(int(line.split()[1]) for line in vmstat if line.startswith("nr_written "))
    return dirty_mb, written * os.sysconf("SC_PAGE_SIZE") / 1e6


def _snapshot(pid: int, sync_pid: int | None) -> dict[str, float]:
    _, minor, major = _stat(f"/proc/{pid}/stat")
    _, main_minor, _ = _stat(f"/proc/{pid}/task/{pid}/stat")
    on_core, waiting = _schedstat(pid)
    dirty_mb, written_mb = _machine_io()
    return {"dirty_mb": dirty_mb, "written_mb": written_mb,
            "cpu": _threads_on_core(pid), "minor": minor, "major": major,
            "main_cpu": on_core, "main_minor": main_minor, "on_core": on_core,
            "waiting": waiting, "system": _system_busy_s(), "main_sys": _main_system_s(pid),
            "sync_cpu": _threads_on_core(sync_pid) if sync_pid else 0.0}


def _produce(server: DevServer, topic: str, count: int) -> dict:
    args = ("-s", "1024", "-b", "64", "-c", "16")
    bench(server.namesrv, "produce", "-t", topic, *args, "--count", str(CALIBRATION_MESSAGES))
    return bench(server.namesrv, "produce", "-t", topic, *args, "--count", str(count))


def async_round(server: DevServer, sync: DevServer | None, topic: str, count: int,
                profile_to: str | None, py_spy: str, settle: bool = False) -> dict[str, float]:
    """One figures.py round on the ASYNC broker: idle wait, calibration, timed run."""
    pid = server.process.pid
    sync_pid = sync.process.pid if sync else None
    if settle:
        os.sync()
        time.sleep(SETTLE_S)
    wait_process_idle(pid)
    bench(server.namesrv, "produce", "-t", topic, "-s", "1024", "-b", "64", "-c", "16",
          "--count", str(CALIBRATION_MESSAGES))
    profiler = None
    if profile_to:
        profiler = subprocess.Popen([py_spy, "record", "-r", "97", "-p", str(pid), "-o",
                                     profile_to, "-f", "raw", "--nonblocking"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # py-spy attaches
    before = _snapshot(pid, sync_pid)
    summary = bench(server.namesrv, "produce", "-t", topic, "-s", "1024", "-b", "64",
                    "-c", "16", "--count", str(count))
    after = _snapshot(pid, sync_pid)
    if profiler is not None:
        profiler.send_signal(2)
        profiler.wait(60)
    n = summary["messages"]
    delta = {key: after[key] - before[key] for key in after}
    span = summary["seconds"]
    return {
        "msgs_per_s": summary["msgs_per_s"],
        "broker_us": delta["cpu"] / n * 1e6,
        "main_us": delta["main_cpu"] / n * 1e6,
        "others_us": (delta["cpu"] - delta["main_cpu"]) / n * 1e6,
        "main_sys_us": delta["main_sys"] / n * 1e6,
        "dirty_mb": before["dirty_mb"],
        "written_mb": delta["written_mb"],
        "main_faults": delta["main_minor"] / n,
        "faults": delta["minor"] / n,
        "major": delta["major"],
        "sync_us": delta["sync_cpu"] / n * 1e6,
        "system_us": delta["system"] / n * 1e6,
        "runq_pct": delta["waiting"] / span * 100,
        "idle_pct": max(0.0, 100 - (delta["on_core"] + delta["waiting"]) / span * 100),
        "client_us": (summary.get("cpu_s") or 0.0) / n * 1e6,
    }


def one_case(case: str, src: str | None, work_dir: str, messages: int, warmup: int,
             profile_round: int | None, profile_dir: str, py_spy: str,
             dev_args: list[str] | None = None) -> list[dict]:
    with_sync = "nosync" not in case
    servers: list[DevServer] = []
    try:
        os.makedirs(os.path.join(work_dir, "async"))
        with _PythonPath(src):
            async_server = DevServer(os.path.join(work_dir, "async"), extra_args=dev_args)
            servers.append(async_server)
            sync_server = None
            if with_sync:
                os.makedirs(os.path.join(work_dir, "sync"))
                sync_server = DevServer(os.path.join(work_dir, "sync"),
                                        extra_args=["--flushDiskType", "SYNC_FLUSH"])
                servers.append(sync_server)
        if case.startswith("warm"):
            wait_process_idle(async_server.process.pid)
            bench(async_server.namesrv, "produce", "-t", "SeqWarmup", "-s", "1024", "-b", "64",
                  "-c", "16", "--count", str(warmup))
        rounds = []
        for index in range(ROUNDS):
            topic = f"FigBatch{index}"
            profile_to = (os.path.join(profile_dir, f"profile-{case}-round{index}.txt")
                          if profile_round == index else None)
            if sync_server is not None and index % 2 == 1:
                wait_process_idle(sync_server.process.pid)
                _produce(sync_server, topic, messages)
            rounds.append(async_round(async_server, sync_server, topic, messages, profile_to,
                                      py_spy, settle=case == "figures-settled"))
            if sync_server is not None and index % 2 == 0:
                wait_process_idle(sync_server.process.pid)
                _produce(sync_server, topic, messages)
        return rounds
    finally:
        for server in servers:
            server.stop()


COLUMNS = (("msgs_per_s", "msg/s", "{:,.0f}"), ("broker_us", "broker", "{:.2f}"),
           ("main_us", "main", "{:.2f}"), ("main_sys_us", "of it sys", "{:.2f}"),
           ("others_us", "others", "{:.2f}"),
           ("main_faults", "main flt", "{:.3f}"), ("faults", "flt", "{:.3f}"),
           ("major", "majflt", "{:.0f}"), ("sync_us", "sync beside", "{:.2f}"),
           ("system_us", "machine", "{:.2f}"), ("dirty_mb", "dirty MB", "{:.0f}"),
           ("written_mb", "disk MB", "{:.0f}"),
           ("client_us", "client", "{:.2f}"), ("runq_pct", "runq %", "{:.1f}"),
           ("idle_pct", "idle %", "{:.1f}"))


def describe(figures: dict) -> str:
    return " | ".join(f"{label} {fmt.format(figures[key])}" for key, label, fmt in COLUMNS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--warmup", type=int, default=200_000,
                        help="messages to another topic before round 0 (cases warm*)")
    parser.add_argument("--case", action="append", choices=CASES, default=[])
    parser.add_argument("--src", action="append", default=[],
                        help="NAME=TREE[,--key,value...]: a tree whose src/ holds tidemq (. = "
                             "this checkout) and tidemq dev arguments for the ASYNC broker")
    parser.add_argument("--profile", type=int, default=None, metavar="ROUND")
    parser.add_argument("--py-spy", default="py-spy",
                        help="the py-spy command (default: py-spy on PATH)")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cases = args.case or ["figures"]
    trees: list[tuple[str, str | None, list[str]]] = []
    for text in args.src or ["now=."]:
        name, _, rest = text.partition("=")
        tree, *dev_args = rest.split(",")
        trees.append((name, None if tree in ("", ".") else os.path.join(
            os.path.abspath(tree), "src") if os.path.isdir(os.path.join(tree, "src"))
            else os.path.abspath(tree), dev_args))
    os.makedirs(args.dir, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = load_average()
    combos = [(case, name, src, dev_args) for case in cases for name, src, dev_args in trees]
    results: dict[str, list[list[dict]]] = {f"{case}/{name}": [] for case, name, _, _ in combos}
    for run in range(args.runs):
        shift = run % len(combos)
        for case, name, src, dev_args in combos[shift:] + combos[:shift]:
            work_dir = tempfile.mkdtemp(prefix="produce-seq-", dir=args.dir)
            profile = args.profile if run == 0 and (case, name) == combos[0][:2] else None
            try:
                rounds = one_case(case, src, work_dir, args.messages, args.warmup, profile,
                                  args.dir, args.py_spy, dev_args)
            finally:
                shutil.rmtree(work_dir, ignore_errors=True)
            results[f"{case}/{name}"].append(rounds)
            if not args.json:
                for index, figures in enumerate(rounds):
                    print(f"run {run + 1} {case}/{name} round {index}: {describe(figures)}",
                          flush=True)
                mean = statistics.fmean(r["msgs_per_s"] for r in rounds)
                print(f"run {run + 1} {case}/{name} figures.py's produce_batch: {mean:,.0f}",
                      flush=True)
    load_after = load_average()
    if args.json:
        print(json.dumps({"started": started, "machine": machine_description(),
                          "load_average": [load_before, load_after], "results": results}))
        return 0
    print(f"\n{started}, {machine_description()}; load average {load_before} -> {load_after}")
    print(f"{args.messages} x 1 KiB, batches of 64, 16 in flight; CPU in us per message; "
          f"medians of {args.runs} runs")
    for key, runs in results.items():
        for index in range(ROUNDS):
            medians = {column: statistics.median(r[index][column] for r in runs)
                       for column, _, _ in COLUMNS}
            print(f"{key:22s} round {index}: {describe(medians)}")
        means = [statistics.fmean(r["msgs_per_s"] for r in rounds) for rounds in runs]
        print(f"{key:22s} produce_batch (mean of rounds): median {statistics.median(means):,.0f}"
              f" ({'; '.join(f'{m:,.0f}' for m in means)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
