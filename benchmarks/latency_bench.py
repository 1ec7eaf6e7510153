"""End-to-end latency at a fixed offered rate, with its distribution over time:

    .venv/bin/python benchmarks/latency_bench.py [--rate 2000] [--seconds 20]
        [--consumer pull|push] [--flush ASYNC_FLUSH|SYNC_FLUSH] [--concurrency 16]
        [--queues 8] [--runs 3] [--timeline] [--threads] [--gc] [--slice-us US]
        [--pacing sleep|schedule] [--src NAME=TREE ...] [--namesrv HOST:PORT] [--json]

Starts its own ``tidemq dev`` (fresh store, free loopback ports, ``--flush`` as its
flushDiskType) unless ``--namesrv`` names a running cluster. Then, each in its own process,
as users run them:

- a consumer (``--consumer pull``: a PullConsumer assigned every queue, waiting at their
  end and polling with a 100 ms timeout; ``push``: a PushConsumer of a fresh group with a
  listener that records and returns) that says when it waits at the end of the topic;
- a producer offering ``--rate`` single messages a second from ``--concurrency`` coroutines
  on a fixed schedule (a slow reply does not lower the offered load), each body starting with
  the wall-clock nanoseconds at the ``send`` call. The coroutines take the due times from
  one timer for all of them (``--pacing schedule``, the default: ``pacing.Schedule``, ~3 µs
  less of the producer's CPU per message at 20,000 msg/s in process than a sleep each), or
  each sleeps until its next message is due (``--pacing sleep``, how the figures before
  2026-11-27 16:50 UTC were taken, and still ``measure``'s default, so ``figures.py``'s).
  How late the send calls were against their due times is reported either way.

Latency is the consumer's wall clock when the message reaches its code (``poll`` returns it,
or the listener is called) minus the stamp in the body: nanosecond stamps, not the
millisecond born timestamp, so a 2 ms target can be judged. It prints p50/p99/p999/max
per run and the median over runs (and the start apart: the first message's latency, which
includes the producer's route lookup and connection, and p99/p999 of the messages sent after
the first second), the producer's send-acknowledgement p99, how many of the
messages over 2 ms were already over 2 ms at the store (the send side), each process's CPU
per message and how long its main thread waited for a core (ms per s: the machine's share
of the tail, not the code's), per message sent each process's main-thread wake-ups and its
read and write system calls (``/proc``: the fixed costs that dominate at low rates), the
host's load average, how many 100 ms windows held a message over 5 ms and in how many of
them a process waited 2 ms or more for a core within one 10 ms sample (its main thread's
/proc schedstat, sampled by the driver: the machine's share of the tail), and with
``--timeline`` a text plot of every run: the worst latency of each 100 ms window, one row
per second, so a periodic stall shows as a column of spikes. With ``--threads`` it lists
every thread of the three processes (the broker's only when it started the broker): its
share of a core over the run and its wake-ups (voluntary context switches) and preemptions
per second. With ``--gc`` the three processes load ``process_probe/`` (a sitecustomize on
their PYTHONPATH) and it prints each one's garbage collections over the run (count and
longest pause per generation, ms per s) and how many windows with a message over 5 ms held
a collection of 1 ms or more, or a broker event-loop lag of 2 ms or more (the broker's loop
is probed like the two clients': a 5 ms sleep, so an idle broker wakes up to 200 times a
second more; the timeline gains "broker lag" and "gc" columns). Every run also says which
process waited for a core in those windows. ``--slice-us`` asks the kernel (EEVDF, Linux
6.6+) for a shorter time slice for all three processes: how much of the tail is a woken
process waiting for the running one's slice to end. With
``--src before=/tmp/before --src now=.`` (trees whose ``src/`` holds tidemq, e.g. from
``git archive <commit> src``) each run measures every tree in turn, order rotated, a fresh
``tidemq dev`` each: an A/B alternated within one run, medians per tree.

Standalone roles (``--role producer|consumer``) are how the driver runs the two processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from itertools import repeat
from operator import attrgetter, itemgetter, sub

STAMP = struct.Struct("<q")
WINDOW_MS = 100  # timeline resolution: the worst latency of each window this long
READY_LINE = "ready"


async def _probe_loop_lag(lags: array, period_s: float = 0.005) -> None:
    """Record (wall ns, lateness ns) whenever a ``period_s`` sleep wakes more than 2 ms late:
    the process's event loop was busy, or the process had no CPU."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + period_s
        await asyncio.sleep(period_s)
        late = loop.time() - due
        if late > 0.002:
            lags.append(time.time_ns())
            lags.append(int(late * 1e9))


# -- the two roles -------------------------------------------------------------------------------


async def _produce(args: argparse.Namespace) -> dict:
    from idle import main_thread_sched_s, process_counts, thread_table
    from pacing import Schedule, due_offsets
    from tidemq import Message, Producer

    pad = os.urandom(max(0, args.size - STAMP.size))
    acks_ms: list[float] = []
    late_ms: list[float] = []  # each send call's time minus its due time
    sent = [0]
    errors = [0]
    lags = array("q")
    probe = asyncio.ensure_future(_probe_loop_lag(lags))
    async with Producer(f"LAT_P_{os.getpid()}", args.namesrv) as producer:
        await producer.send(Message(args.topic, STAMP.pack(time.time_ns()) + pad))
        cpu_started = time.process_time()
        waited_before_s = main_thread_sched_s(os.getpid())[1]
        threads_before = thread_table(os.getpid())
        counts_before = process_counts(os.getpid())
        if args.pacing == "sleep":
            offsets = due_offsets(args.rate, args.seconds)  # shared: each due time once
            started = time.perf_counter()

            async def worker() -> None:
                # An asyncio.sleep per message (pacing.py says what that costs).
                while True:
                    offset = next(offsets, None)
                    if offset is None:
                        return
                    slot = started + offset
                    delay = slot - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    begun = time.perf_counter()
                    late_ms.append((begun - slot) * 1000)
                    try:
                        await producer.send(Message(args.topic, STAMP.pack(time.time_ns()) + pad))
                    except Exception:  # counted; the run goes on at the offered rate
                        errors[0] += 1
                        continue
                    acks_ms.append((time.perf_counter() - begun) * 1000)
                    sent[0] += 1
        else:
            schedule = Schedule(args.rate, args.seconds)

            async def worker() -> None:
                # The same due times, one timer for all the workers (pacing.py).
                while True:
                    slot = schedule.take()
                    if slot is None:
                        if schedule.finished:
                            return
                        slot = await schedule.wait()
                        if slot is None:
                            return
                    begun = time.perf_counter()
                    late_ms.append((begun - slot) * 1000)
                    try:
                        await producer.send(Message(args.topic, STAMP.pack(time.time_ns()) + pad))
                    except Exception:  # counted; the run goes on at the offered rate
                        errors[0] += 1
                        continue
                    acks_ms.append((time.perf_counter() - begun) * 1000)
                    sent[0] += 1

            started = schedule.start()  # its first due times wait in take() for the workers
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        seconds = time.perf_counter() - started
        cpu_s = time.process_time() - cpu_started
        waited_s = main_thread_sched_s(os.getpid())[1] - waited_before_s
        threads_after = thread_table(os.getpid())
        counts = [b - a for a, b in zip(counts_before, process_counts(os.getpid()), strict=True)]
    probe.cancel()
    acks_ms.sort()
    late_ms.sort()
    return {"sent": sent[0] + 1, "errors": errors[0], "seconds": seconds,
            "ack_ms_p50": _pick(acks_ms, 0.5), "ack_ms_p99": _pick(acks_ms, 0.99),
            "pacing": args.pacing, "send_late_ms_p50": _pick(late_ms, 0.5),
            "send_late_ms_p99": _pick(late_ms, 0.99),
            "cpu_us_per_msg": cpu_s / max(1, sent[0]) * 1e6,
            "run_queue_wait_ms_per_s": waited_s * 1000 / seconds, "loop_lags": lags.tolist(),
            "threads": [threads_before, threads_after], "counts": counts}


async def _consume(args: argparse.Namespace) -> None:
    """Record (arrival ns, latency ns) per message until the driver writes the number of
    messages sent on stdin, then until that many arrived (or 10 s more)."""
    from tidemq import ConsumeResult, PullConsumer, PushConsumer

    # While the run lasts only what is needed later is kept: each message's stamp and store
    # timestamp, and each batch's arrival time and size; the per-message columns are made
    # after the consumer's CPU is read. Its CPU is the consumer's share of the two cores the
    # three processes contend for: a Python loop per message here was ~1.8 us of it (in
    # process, RESULTS.md), added to tidemq's own for every tree measured.
    stamps = array("q")
    stored_ms = array("q")  # store timestamps (ms): the send side's part, with the stamps
    batches = array("q")  # (arrival ns, messages) per batch handed over
    received = [0]
    lags = array("q")
    probe = asyncio.ensure_future(_probe_loop_lag(lags))
    loop = asyncio.get_running_loop()
    expected: asyncio.Future[int] = loop.create_future()

    def read_expected() -> None:
        line = sys.stdin.readline()
        loop.call_soon_threadsafe(expected.set_result, int(line.strip() or 0))

    unpack_stamp = STAMP.unpack_from
    first = itemgetter(0)
    body_of = attrgetter("body")
    store_timestamp_of = attrgetter("store_timestamp")

    def record(messages: list) -> None:
        batches.append(time.time_ns())
        batches.append(len(messages))
        stamps.extend(map(first, map(unpack_stamp, map(body_of, messages))))
        stored_ms.extend(map(store_timestamp_of, messages))
        received[0] += len(messages)

    cpu = [0.0, 0.0]

    async def until_done() -> None:
        cpu[0] = time.process_time()
        count = await expected
        deadline = time.monotonic() + 10
        while received[0] < count and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        cpu[1] = time.process_time()

    group = f"LAT_C_{os.getpid()}"
    if args.consumer == "pull":
        async with PullConsumer(group, args.namesrv, consume_from="LAST", auto_commit=False,
                                pull_batch_size=args.pull_batch) as consumer:
            consumer.assign(await consumer.queues(args.topic))
            await consumer.seek_to_end()
            print(READY_LINE, flush=True)
            threading.Thread(target=read_expected, daemon=True).start()
            done = asyncio.ensure_future(until_done())
            while not done.done():
                messages = await consumer.poll(100)
                if messages:
                    record(messages)
    else:
        consumer = PushConsumer(group, args.namesrv, consume_from="LAST",
                                pull_batch_size=args.pull_batch)
        consumer.subscribe(args.topic, "*")

        @consumer.listener
        def on_messages(messages: list) -> ConsumeResult:
            record(messages)
            return ConsumeResult.SUCCESS

        async with consumer:
            # Ready once every queue of the topic is owned and its first pull is parked.
            route = await consumer.instance.route(args.topic)
            queue_count = len(route.subscribe_queues(args.topic)) if route else 0
            bound = time.monotonic() + 30
            while (len([q for q in consumer.assignment() if q.topic == args.topic])
                   < queue_count and time.monotonic() < bound):
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # first pulls answered and parked at the end
            print(READY_LINE, flush=True)
            threading.Thread(target=read_expected, daemon=True).start()
            await until_done()
    arrivals = array("q")
    for index in range(0, len(batches), 2):
        arrivals.extend(repeat(batches[index], batches[index + 1]))
    latencies = array("q", map(sub, arrivals, stamps))
    to_store = array("q", [ms * 1_000_000 - stamp for ms, stamp in zip(stored_ms, stamps,
                                                                          strict=True)])
    with open(args.out, "wb") as out:
        out.write(STAMP.pack(len(latencies)))
        arrivals.tofile(out)
        latencies.tofile(out)
        to_store.tofile(out)
        out.write(STAMP.pack(int((cpu[1] - cpu[0]) * 1e9)))
        out.write(STAMP.pack(len(lags)))
        lags.tofile(out)
    probe.cancel()


def _pick(sorted_values: list, fraction: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, round(fraction * len(sorted_values)) - 1))
    return sorted_values[index]


# -- the driver ----------------------------------------------------------------------------------


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} {five:.1f} {fifteen:.1f}"


def _read_samples(path: str) -> tuple[tuple[array, array, array], array, float]:
    """The consumer's columns, its loop lags and its CPU seconds over the run."""
    with open(path, "rb") as source:
        (count,) = STAMP.unpack(source.read(STAMP.size))
        columns = array("q"), array("q"), array("q")
        for column in columns:
            column.fromfile(source, count)
        (cpu_ns,) = STAMP.unpack(source.read(STAMP.size))
        (lag_count,) = STAMP.unpack(source.read(STAMP.size))
        lags = array("q")
        lags.fromfile(source, lag_count)
    return columns, lags, cpu_ns / 1e9


def summarize(arrivals: array, latencies: array, to_store: array) -> dict:
    """Percentiles (ms) and the worst latency per WINDOW_MS window, in arrival order; the
    same for the part up to the broker's store timestamp (millisecond resolution)."""
    ordered = sorted(latencies)
    ms = [x / 1e6 for x in ordered]
    windows: list[float] = []
    store_windows: list[float] = []
    if arrivals:
        first = min(arrivals)
        for arrived, latency, stored in zip(arrivals, latencies, to_store, strict=True):
            index = (arrived - first) // (WINDOW_MS * 1_000_000)
            while len(windows) <= index:
                windows.append(0.0)
                store_windows.append(0.0)
            windows[index] = max(windows[index], latency / 1e6)
            store_windows[index] = max(store_windows[index], stored / 1e6)
    # Where the slow ones lost their time: of the messages over 2 ms end to end, how many
    # were already over 2 ms at the store (the send side: producer, its connection, the
    # broker's send path) rather than after it (long-poll wake, pull answer, consumer).
    slow = [stored for latency, stored in zip(latencies, to_store, strict=True)
            if latency > 2_000_000]
    # The start apart from the steady state: the first message sent (the producer's first
    # send: its route lookup and connection, the topic's first put) and the percentiles of
    # the messages sent after the run's first second.
    first_latency_ms = None
    steady: list[float] = []
    if arrivals:
        sent_at = [arrived - latency for arrived, latency in zip(arrivals, latencies, strict=True)]
        first_sent = min(range(len(sent_at)), key=sent_at.__getitem__)
        first_latency_ms = latencies[first_sent] / 1e6
        steady_from = sent_at[first_sent] + 1_000_000_000
        steady = sorted(latency / 1e6 for at, latency in zip(sent_at, latencies, strict=True)
                        if at >= steady_from)
    return {
        "received": len(ms),
        "over_2ms": len(slow),
        "over_2ms_late_at_store": sum(1 for stored in slow if stored > 2_000_000),
        "latency_ms_p50": _pick(ms, 0.5), "latency_ms_p99": _pick(ms, 0.99),
        "latency_ms_p999": _pick(ms, 0.999), "latency_ms_max": ms[-1] if ms else None,
        "first_latency_ms": first_latency_ms,
        "after_1s_latency_ms_p99": _pick(steady, 0.99),
        "after_1s_latency_ms_p999": _pick(steady, 0.999),
        "windows_over_10ms": sum(1 for w in windows if w > 10),
        "window_max_ms": windows,
        "window_to_store_max_ms": store_windows,
    }


def _lag_windows(flat: list[int], first_ns: int, windows: int) -> list[float]:
    """The worst event-loop lateness (ms) per timeline window from (ns, lateness ns) pairs."""
    worst = [0.0] * windows
    for at, late in zip(flat[::2], flat[1::2], strict=True):
        index = (at - first_ns) // (WINDOW_MS * 1_000_000)
        if 0 <= index < windows:
            worst[index] = max(worst[index], late / 1e6)
    return worst


def timeline_text(run: dict) -> str:
    """One row per second: the worst latency of each 100 ms window as a cell (``.`` < 2 ms,
    ``-`` < 5, ``+`` < 10, ``#`` < 20, ``@`` >= 20) and the second's worst, end to end and
    up to the store timestamp (the send side's part, +-1 ms); then the worst event-loop
    lateness of the consumer and of the producer process in the same windows, and ("no
    core") the longest any of the three processes' main threads waited for a core within one
    10 ms sample in each window (``CoreWaitSampler``: the machine's part)."""
    windows, store_windows = run["window_max_ms"], run["window_to_store_max_ms"]
    consumer_lags, producer_lags = run["consumer_lag_windows_ms"], run["producer_lag_windows_ms"]
    waited = run.get("core_wait_windows_ms") or {}
    no_core = [max((column[index] for column in waited.values()), default=0.0)
               for index in range(len(windows))]
    # --gc: the broker's loop lag and the longest collection of any process per window.
    broker_lags = run.get("broker_lag_windows_ms")
    collected = run.get("gc_windows_ms") or {}
    gc_worst = [max((column[index] for column in collected.values()), default=0.0)
                for index in range(len(windows))]
    per_row = 1000 // WINDOW_MS

    def cells(row: list[float]) -> str:
        return "".join("." if w < 2 else "-" if w < 5 else "+" if w < 10 else "#" if w < 20
                       else "@" for w in row)

    lines = ["  second  end to end  worst ms   to store    worst ms   consumer lag  producer lag"
             "  no core" + ("       broker lag    gc" if collected else "")]
    for start in range(0, len(windows), per_row):
        part = slice(start, start + per_row)
        row, store_row = windows[part], store_windows[part]
        lines.append(f"  {start // per_row:4d}    {cells(row):<{per_row}}  {max(row):7.1f}   "
                     f"{cells(store_row):<{per_row}}  {max(store_row):7.1f}   "
                     f"{cells(consumer_lags[part]):<{per_row}}    "
                     f"{cells(producer_lags[part]):<{per_row}}    "
                     f"{cells(no_core[part]):<{per_row}}"
                     + (f"    {cells((broker_lags or [0.0] * len(windows))[part]):<{per_row}}"
                        f"    {cells(gc_worst[part]):<{per_row}}" if collected else ""))
    return "\n".join(lines)


# Creating the run's topic is retried this long: on a loaded machine a fresh ``tidemq dev``
# listens before its broker has registered with the name server, and the admin's 3 s
# request timeout can pass; one failed create ended the whole benchmark.
TOPIC_CREATE_BOUND_S = 60.0


def _create_topic(tidemq: str, namesrv: str, topic: str, queues: int) -> None:
    """``tidemq admin updateTopic`` until it succeeds or TOPIC_CREATE_BOUND_S passes.

    Raises:
        RuntimeError: it never succeeded; carries the admin's last output.
    """
    deadline = time.monotonic() + TOPIC_CREATE_BOUND_S
    while True:
        done = subprocess.run([tidemq, "admin", "updateTopic", "-n", namesrv, "-c",
                               "DefaultCluster", "-t", topic, "-r", str(queues), "-w",
                               str(queues)], capture_output=True, text=True, timeout=60)
        if done.returncode == 0:
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(f"could not create topic {topic} at {namesrv} within "
                               f"{TOPIC_CREATE_BOUND_S:g} s; the admin said: "
                               f"{(done.stderr or done.stdout).strip()[-500:]}")
        time.sleep(0.5)


class CoreWaitSampler:
    """How long each watched process's main thread waited for a core, sampled every
    ``period_s`` by a thread of the driver from /proc/<pid>/schedstat (a thread that is ready
    to run but finds both cores taken): per timeline window, the machine's part of a spike
    rather than the code's. About 100 reads of three small files a second."""

    def __init__(self, period_s: float = 0.01) -> None:
        self.period_s = period_s
        self._files: dict[str, int] = {}
        self.samples: dict[str, array] = {}  # name -> (wall ns, waited ns so far) pairs
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="core-wait-sampler",
                                        daemon=True)

    def watch(self, name: str, pid: int) -> None:
        """Sample ``pid``'s main thread from now on (silently nothing when /proc lacks it)."""
        try:
            self._files[name] = os.open(f"/proc/{pid}/task/{pid}/schedstat", os.O_RDONLY)
        except OSError:
            return
        self.samples[name] = array("q")
        self._sample(name)

    def _sample(self, name: str) -> None:
        try:
            waited = int(os.pread(self._files[name], 128, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return  # the process ended
        self.samples[name].extend((time.time_ns(), waited))

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            for name in list(self._files):
                self._sample(name)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()

    def windows(self, first_ns: int, count: int) -> dict[str, list[float]]:
        """Per process and timeline window, the most its main thread waited for a core within
        one sampling period (ms): a spike needs one long wait, while many short ones (a
        busy machine's usual) add up in a window without delaying any message much."""
        result = {}
        for name, flat in self.samples.items():
            waited = [0.0] * count
            for index in range(2, len(flat), 2):
                window = (flat[index] - first_ns) // (WINDOW_MS * 1_000_000)
                if 0 <= window < count:
                    waited[window] = max(waited[window],
                                         (flat[index + 1] - flat[index - 1]) / 1e6)
            result[name] = waited
        return result


def machine_share(windows: list[float], waited: dict[str, list[float]],
                  over_ms: float = 5.0, waited_ms: float = 2.0) -> tuple[int, int]:
    """(windows whose worst latency is over ``over_ms``, how many of them had a process
    waiting ``waited_ms`` or more for a core within one sample, in that window or the one
    before)."""
    slow = [index for index, worst in enumerate(windows) if worst > over_ms]
    starved = sum(1 for index in slow
                  if any(max(column[max(0, index - 1):index + 1], default=0.0) >= waited_ms
                         for column in waited.values()))
    return len(slow), starved


PROBE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "process_probe")
PROBE_RECORD = struct.Struct("<qqq")  # process_probe/sitecustomize.py's: wall ns, ns, kind
PROBE_LOOP_LAG = 9  # its kind of a late loop wake-up; 0-2 are collections of that generation


def read_probe(path: str) -> list[tuple[int, int, int]]:
    """The (wall ns, duration ns, kind) records a process's probe wrote (none: no file)."""
    try:
        with open(path, "rb") as source:
            data = source.read()
    except OSError:
        return []
    usable = len(data) - len(data) % PROBE_RECORD.size
    return list(PROBE_RECORD.iter_unpack(data[:usable]))


def probe_figures(probe_dir: str, pids: dict[str, int], first_ns: int,
                  windows: list[float], over_ms: float = 5.0,
                  pause_ms: float = 1.0) -> dict:
    """Each process's garbage collections over the run's windows (count and longest pause
    per generation, ms per s in all, the longest pause per window) and the broker's loop
    lag per window; and of the windows with a message over ``over_ms``, how many had a
    collection of ``pause_ms`` or more, or a broker loop lag of 2 ms or more, in that
    window or the one before."""
    count = len(windows)
    end_ns = first_ns + count * WINDOW_MS * 1_000_000
    span_s = max(1e-9, count * WINDOW_MS / 1000)
    collections: dict[str, dict] = {}
    gc_windows: dict[str, list[float]] = {}
    broker_lag = [0.0] * count
    for name, pid in pids.items():
        per_generation = {generation: [0, 0.0] for generation in (0, 1, 2)}
        column = [0.0] * count
        total_ms = 0.0
        path = os.path.join(probe_dir, f"{pid}.bin")
        for at, duration, kind in read_probe(path):
            if not first_ns <= at < end_ns:
                continue
            index = (at - first_ns) // (WINDOW_MS * 1_000_000)
            ms = duration / 1e6
            if kind == PROBE_LOOP_LAG:
                if name == "broker":
                    broker_lag[index] = max(broker_lag[index], ms)
                continue
            per_generation[kind][0] += 1
            per_generation[kind][1] = max(per_generation[kind][1], ms)
            column[index] = max(column[index], ms)
            total_ms += ms
        collections[name] = {"count": [per_generation[g][0] for g in (0, 1, 2)],
                             "longest_ms": [per_generation[g][1] for g in (0, 1, 2)],
                             "ms_per_s": total_ms / span_s,
                             "probed": os.path.exists(path)}  # False: the probe never loaded
        gc_windows[name] = column
    slow = [index for index, worst in enumerate(windows) if worst > over_ms]

    def held(column: list[float], index: int, at_least: float) -> bool:
        return max(column[max(0, index - 1):index + 1], default=0.0) >= at_least

    return {"gc": collections, "gc_windows_ms": gc_windows,
            "broker_lag_windows_ms": broker_lag if "broker" in pids else None,
            "windows_over_5ms_gc": {name: sum(1 for i in slow if held(column, i, pause_ms))
                                    for name, column in gc_windows.items()},
            "windows_over_5ms_broker_lag": (sum(1 for i in slow if held(broker_lag, i, 2.0))
                                            if "broker" in pids else None)}


def probe_environment(probe_dir: str) -> dict[str, str]:
    """The variables that make a process started with them load process_probe (``--gc``):
    PYTHONPATH with the probe first (then what it held), the folder its records go to."""
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": PROBE_DIR + (os.pathsep + path if path else ""),
            "TIDEMQ_BENCH_PROBE_DIR": probe_dir}


def measure(namesrv: str, work_dir: str, *, rate: float = 2000, seconds: float = 20,
            consumer_kind: str = "pull", concurrency: int = 16, queues: int = 8,
            size: int = 1024, pull_batch: int = 32, broker_pid: int | None = None,
            probe_dir: str | None = None, pacing: str = "schedule") -> dict:
    """One run against a running cluster: a fresh topic of ``queues`` queues, a consumer
    process waiting at its end, a producer process offering ``rate`` msg/s for ``seconds``.

    Returns the consumer's figures (``summarize``), the producer's (``producer_*``), CPU
    per message of each process (the broker's when ``broker_pid`` is given), with
    ``probe_dir`` (``--gc``) each process's garbage collections and the broker's loop lag,
    and the load average at the end. ``pacing``: as ``--pacing`` (the same default, so
    figures.py and queue_ratio_bench.py measure what the command line does).
    """
    from idle import (
        main_thread_sched_s,
        process_counts,
        process_cpu_s,
        thread_costs,
        thread_table,
    )
    topic = f"Latency_{os.getpid()}_{time.monotonic_ns()}"
    tidemq = os.path.join(os.path.dirname(sys.executable), "tidemq")
    _create_topic(tidemq, namesrv, topic, queues)
    me = [sys.executable, os.path.abspath(__file__), "--namesrv", namesrv, "--topic", topic,
          "--size", str(size), "--pull-batch", str(pull_batch)]
    out = os.path.join(work_dir, f"samples_{topic}.bin")
    consumer = subprocess.Popen(
        [*me, "--role", "consumer", "--consumer", consumer_kind, "--out", out],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    watched = {"consumer": consumer.pid}
    if broker_pid is not None:
        watched["broker"] = broker_pid
    sampler = CoreWaitSampler()
    try:
        assert consumer.stdout is not None and consumer.stdin is not None
        line = consumer.stdout.readline().strip()
        if line != READY_LINE:
            raise RuntimeError(f"consumer did not get ready (said {line!r})")
        broker_cpu_s = process_cpu_s(broker_pid) if broker_pid is not None else 0.0
        waits_before = {name: main_thread_sched_s(pid)[1] for name, pid in watched.items()}
        threads_before = {name: thread_table(pid) for name, pid in watched.items()}
        counts_before = {name: process_counts(pid) for name, pid in watched.items()}
        producer_started = time.monotonic()
        summary_path = os.path.join(work_dir, f"producer_{topic}.json")
        for name, pid in watched.items():
            sampler.watch(name, pid)
        sampler.start()
        producer = subprocess.Popen(
            [*me, "--role", "producer", "--rate", str(rate), "--seconds", str(seconds),
             "--concurrency", str(concurrency), "--pacing", pacing, "--out", summary_path],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sampler.watch("producer", producer.pid)
        try:
            output, errors = producer.communicate(timeout=seconds + 120)
        except subprocess.TimeoutExpired:
            producer.kill()
            producer.wait()
            raise
        finally:
            sampler.stop()
        if producer.returncode != 0:
            raise subprocess.CalledProcessError(producer.returncode, producer.args, output,
                                                errors)
        with open(summary_path) as summary:
            sent = json.load(summary)
        producer_s = time.monotonic() - producer_started
        thread_rows = {name: thread_costs(threads_before[name], thread_table(pid), producer_s)
                       for name, pid in watched.items()}
        counts = {name: [b - a for a, b in zip(counts_before[name], process_counts(pid),
                                               strict=True)]
                  for name, pid in watched.items()}
        counts["producer"] = sent.pop("counts")
        thread_rows["producer"] = thread_costs(
            *({int(k): tuple(v) for k, v in table.items()} for table in sent.pop("threads")),
            sent["seconds"])
        run_queue_waits = {
            f"{name}_run_queue_wait_ms_per_s":
                (main_thread_sched_s(pid)[1] - waits_before[name]) * 1000 / producer_s
            for name, pid in watched.items()}
        consumer.stdin.write(f"{sent['sent']}\n")
        consumer.stdin.flush()
        consumer.wait(timeout=60)
        if consumer.returncode != 0:
            raise RuntimeError(f"consumer failed with exit code {consumer.returncode}")
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()
    columns, consumer_lags, consumer_cpu_s = _read_samples(out)
    result = summarize(*columns)
    result["consumer_cpu_us_per_msg"] = consumer_cpu_s / max(1, len(columns[0])) * 1e6
    if broker_pid is not None:
        result["broker_cpu_us_per_msg"] = ((process_cpu_s(broker_pid) - broker_cpu_s)
                                           / max(1, len(columns[0])) * 1e6)
    os.unlink(out)
    first = min(columns[0]) if columns[0] else 0
    result["consumer_lag_windows_ms"] = _lag_windows(consumer_lags.tolist(), first,
                                                     len(result["window_max_ms"]))
    result["producer_lag_windows_ms"] = _lag_windows(sent.pop("loop_lags"), first,
                                                     len(result["window_max_ms"]))
    waited = sampler.windows(first, len(result["window_max_ms"]))
    result["core_wait_windows_ms"] = waited
    result["windows_over_5ms"], result["windows_over_5ms_core_wait"] = machine_share(
        result["window_max_ms"], waited)
    result["windows_over_5ms_core_wait_by"] = {
        name: machine_share(result["window_max_ms"], {name: column})[1]
        for name, column in waited.items()}
    if probe_dir is not None:
        pids = {"consumer": consumer.pid, "producer": producer.pid}
        if broker_pid is not None:
            pids["broker"] = broker_pid
        result.update(probe_figures(probe_dir, pids, first, result["window_max_ms"]))
    result.update({f"producer_{k}": v for k, v in sent.items()})
    result.update(run_queue_waits)
    # Per message sent: how often each process's main thread slept and woke, and its read
    # and write system calls (the fixed costs that dominate at low rates).
    per = max(1, sent["sent"])
    for name, (wake_ups, reads, writes) in counts.items():
        result[f"{name}_wake_ups_per_msg"] = wake_ups / per
        result[f"{name}_reads_per_msg"] = reads / per
        result[f"{name}_writes_per_msg"] = writes / per
    result["threads"] = thread_rows
    result["load_average"] = load_average()
    return result


# sched_setattr(2) on x86-64 and struct sched_attr's first version (48 bytes: size, policy,
# flags, nice, priority, runtime, deadline, period).
_SYS_SCHED_SETATTR_X86_64 = 314
_SCHED_ATTR = struct.Struct("=IIQiIQQQ")


def request_slice(slice_us: float) -> None:
    """Ask the kernel for a ``slice_us`` time slice for this process and what it starts
    (EEVDF, Linux 6.6+: ``sched_runtime`` of a SCHED_OTHER task is its requested slice; no
    privilege needed, children inherit it). A shorter slice than the default (3 ms here)
    lets a woken task run sooner instead of waiting for the running one's slice to end;
    the CPU shares stay fair.

    Raises:
        OSError: the kernel refused (older kernel, another architecture).
    """
    import ctypes
    import platform

    if platform.machine() != "x86_64":
        raise OSError(f"--slice-us knows sched_setattr only on x86_64, not "
                      f"{platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    attr = ctypes.create_string_buffer(_SCHED_ATTR.pack(
        _SCHED_ATTR.size, os.SCHED_OTHER, 0, os.getpriority(os.PRIO_PROCESS, 0), 0,
        int(slice_us * 1000), 0, 0))
    if libc.syscall(_SYS_SCHED_SETATTR_X86_64, 0, attr, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"sched_setattr(slice {slice_us:g} us): {os.strerror(errno)} "
                      "(needs Linux 6.6+ with EEVDF)")


PROBE_VARIABLES = ("PYTHONPATH", "TIDEMQ_BENCH_PROBE_DIR", "TIDEMQ_BENCH_LOOP_PROBE")


def _start_probe(work_dir: str) -> str:
    """``--gc``: a folder for the probe's records, and the variables that make every
    process started from now on (broker, consumer, producer) load the probe."""
    probe_dir = os.path.join(work_dir, "probe")
    os.makedirs(probe_dir, exist_ok=True)
    os.environ.update(probe_environment(probe_dir))
    return probe_dir


def _stop_probe(original: dict[str, str | None]) -> None:
    """The variables ``_start_probe`` (and ``--src``) changed, as they were."""
    for name, value in original.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _dev_server(work_dir: str, flush: str, probe_loop: bool):
    """A fresh ``tidemq dev``; with ``probe_loop`` its probe also times its loop's lag."""
    from broker_bench import DevServer

    if probe_loop:
        os.environ["TIDEMQ_BENCH_LOOP_PROBE"] = "1"
    try:
        return DevServer(work_dir, extra_args=["--flushDiskType", flush])
    finally:
        os.environ.pop("TIDEMQ_BENCH_LOOP_PROBE", None)


def run_all(args: argparse.Namespace) -> dict:
    """Every run of one configuration, against ``args.namesrv`` or a fresh ``tidemq dev``."""
    if args.slice_us:
        request_slice(args.slice_us)  # before starting anything: the processes inherit it
    work_dir = tempfile.mkdtemp(prefix="latency-bench-", dir=args.dir)
    server = None
    original = {name: os.environ.get(name) for name in PROBE_VARIABLES}
    try:
        probe_dir = _start_probe(work_dir) if args.gc else None
        namesrv = args.namesrv
        if namesrv is None:
            server = _dev_server(work_dir, args.flush, probe_dir is not None)
            namesrv = server.namesrv
        runs = [measure(namesrv, work_dir, rate=args.rate, seconds=args.seconds,
                        consumer_kind=args.consumer, concurrency=args.concurrency,
                        queues=args.queues, size=args.size, pull_batch=args.pull_batch,
                        broker_pid=server.process.pid if server else None,
                        probe_dir=probe_dir, pacing=args.pacing)
                for _ in range(args.runs)]
    finally:
        if server is not None:
            server.stop()
        _stop_probe(original)
        shutil.rmtree(work_dir, ignore_errors=True)
    figures = medians_of(runs)
    return {"rate": args.rate, "seconds": args.seconds, "consumer": args.consumer,
            "flush": args.flush, "concurrency": args.concurrency, "queues": args.queues,
            "size": args.size, "slice_us": args.slice_us,
            "pacing": args.pacing, "median": figures, "runs": runs}


def medians_of(runs: list[dict]) -> dict[str, float | None]:
    """Medians over runs: p50, p99, p999 and max (ms), and the start apart (``first``: the
    first message; ``after_1s_p99``/``_p999``: the messages sent after the first second;
    None when no run had any)."""
    figures: dict[str, float | None] = {
        q: statistics.median(r[f"latency_ms_{q}"] for r in runs)
        for q in ("p50", "p99", "p999", "max")}
    for name, key in (("first", "first_latency_ms"), ("after_1s_p99", "after_1s_latency_ms_p99"),
                      ("after_1s_p999", "after_1s_latency_ms_p999")):
        values = [r[key] for r in runs if r.get(key) is not None]
        figures[name] = statistics.median(values) if values else None
    return figures


def parse_src(text: str) -> tuple[str, str]:
    """``NAME=TREE`` -> (NAME, TREE/src as an absolute path).

    Raises:
        SystemExit: not NAME=TREE, or TREE has no src/tidemq.
    """
    name, _, tree = text.partition("=")
    if not name or not tree:
        raise SystemExit(f"--src {text!r}: expected NAME=TREE (a tree whose src/ holds tidemq)")
    src = os.path.join(os.path.abspath(tree), "src")
    if not os.path.isdir(os.path.join(src, "tidemq")):
        raise SystemExit(f"--src {text!r}: {src} has no tidemq package (git archive <commit> src "
                         "| tar -x -C <dir> makes one)")
    return name, src


def run_variants(args: argparse.Namespace) -> dict:
    """``--src`` given: each run measures every source tree in turn (a fresh ``tidemq dev``
    each, the order rotated from run to run), the processes importing tidemq from that tree
    (PYTHONPATH), so the trees are compared within one run of the machine's weather."""
    if args.namesrv is not None:
        raise SystemExit("--src starts a tidemq dev per tree; it cannot be used with --namesrv")
    variants = [parse_src(text) for text in args.src]
    if args.slice_us:
        request_slice(args.slice_us)
    work_dir = tempfile.mkdtemp(prefix="latency-bench-", dir=args.dir)
    original = {name: os.environ.get(name) for name in PROBE_VARIABLES}
    runs: list[dict] = []
    try:
        for number in range(args.runs):
            shift = number % len(variants)
            for name, src in variants[shift:] + variants[:shift]:
                os.environ["PYTHONPATH"] = src  # the server, consumer and producer inherit it
                server_dir = os.path.join(work_dir, f"{name}-{number}")
                os.makedirs(server_dir)
                probe_dir = _start_probe(server_dir) if args.gc else None
                server = _dev_server(server_dir, args.flush, probe_dir is not None)
                try:
                    run = measure(server.namesrv, server_dir, rate=args.rate,
                                  seconds=args.seconds, consumer_kind=args.consumer,
                                  concurrency=args.concurrency, queues=args.queues,
                                  size=args.size, pull_batch=args.pull_batch,
                                  broker_pid=server.process.pid, probe_dir=probe_dir,
                                  pacing=args.pacing)
                finally:
                    server.stop()
                run["variant"] = name
                runs.append(run)
    finally:
        _stop_probe(original)
        shutil.rmtree(work_dir, ignore_errors=True)
    medians = {name: medians_of([r for r in runs if r["variant"] == name])
               for name, _ in variants}
    return {"rate": args.rate, "seconds": args.seconds, "consumer": args.consumer,
            "flush": args.flush, "concurrency": args.concurrency, "queues": args.queues,
            "size": args.size, "slice_us": args.slice_us,
            "pacing": args.pacing, "median": medians[variants[0][0]],
            "medians": medians, "runs": runs}


def threads_text(run: dict) -> str:
    """Every thread of the three processes over the run: its share of a core and how often a
    second it went to sleep (voluntary switches: each one a wake-up) or lost its core."""
    lines = ["  process   thread                     CPU %   wake-ups/s  preempted/s"]
    for process, rows in run["threads"].items():
        for name, share, voluntary, involuntary in rows:
            if share < 0.0005 and voluntary < 0.5:
                continue  # idle all run
            lines.append(f"  {process:<9} {name:<24} {share * 100:6.1f} {voluntary:11.0f} "
                         f"{involuntary:11.0f}")
    return "\n".join(lines)


def print_report(result: dict, timeline: bool, threads: bool = False) -> None:
    print(f"latency bench: {result['rate']:g} msg/s offered for {result['seconds']:g} s, "
          f"{result['size']} B, {result['consumer']} consumer, {result['flush']}, "
          f"{result['queues']} queues, producer concurrency {result['concurrency']}, "
          f"pacing {result.get('pacing', 'sleep')}"
          + (f", time slice {result['slice_us']:g} us" if result.get("slice_us") else ""))
    for number, run in enumerate(result["runs"]):
        variant = f" [{run['variant']}]" if "variant" in run else ""
        print(f"run {number}{variant}: p50 {run['latency_ms_p50']:.2f} "
              f"p99 {run['latency_ms_p99']:.2f} p999 {run['latency_ms_p999']:.2f} "
              f"max {run['latency_ms_max']:.1f} ms; "
              f"{run['received']} received of {run['producer_sent']}; over 2 ms: "
              f"{run['over_2ms']} ({run['over_2ms_late_at_store']} late at the store); "
              f"windows > 10 ms: "
              f"{run['windows_over_10ms']}; send ack p99 {run['producer_ack_ms_p99']:.2f} ms; "
              f"CPU us/msg: broker {run.get('broker_cpu_us_per_msg', float('nan')):.0f}, "
              f"producer {run['producer_cpu_us_per_msg']:.0f}, consumer "
              f"{run['consumer_cpu_us_per_msg']:.0f}; waiting for a core, ms per s: broker "
              f"{run.get('broker_run_queue_wait_ms_per_s', float('nan')):.0f}, producer "
              f"{run['producer_run_queue_wait_ms_per_s']:.0f}, consumer "
              f"{run['consumer_run_queue_wait_ms_per_s']:.0f}; load {run['load_average']}")
        if "windows_over_5ms" in run:
            by = run.get("windows_over_5ms_core_wait_by") or {}
            print(f"  windows with a message over 5 ms: {run['windows_over_5ms']}, of them "
                  f"{run['windows_over_5ms_core_wait']} with a process waiting >= 2 ms at once "
                  "for a core then (the machine's)"
                  + (" (" + ", ".join(f"{name} {n}" for name, n in by.items()) + ")"
                     if by else ""))
        if run.get("gc"):
            print("  garbage collections (gen 0/1/2, longest ms each, ms per s): " + "; ".join(
                f"{name} {'/'.join(str(c) for c in figures['count'])}, "
                f"{'/'.join(f'{m:.1f}' for m in figures['longest_ms'])}, "
                f"{figures['ms_per_s']:.1f}" for name, figures in run["gc"].items()))
            lag = run.get("windows_over_5ms_broker_lag")
            print("  windows with a message over 5 ms holding a collection >= 1 ms: " + ", ".join(
                f"{name} {n}" for name, n in run["windows_over_5ms_gc"].items())
                + (f"; a broker loop lag >= 2 ms: {lag}" if lag is not None else ""))
        if run.get("after_1s_latency_ms_p999") is not None:
            print(f"  first message {run['first_latency_ms']:.1f} ms; after the first second: "
                  f"p99 {run['after_1s_latency_ms_p99']:.2f} "
                  f"p999 {run['after_1s_latency_ms_p999']:.2f} ms")
        if run.get("producer_send_late_ms_p99") is not None:
            print(f"  send calls after their due time: p50 {run['producer_send_late_ms_p50']:.2f} "
                  f"p99 {run['producer_send_late_ms_p99']:.2f} ms")
        print("  per message: " + "; ".join(
            f"{name} {run[f'{name}_wake_ups_per_msg']:.2f} wake-ups, "
            f"{run[f'{name}_reads_per_msg']:.2f} reads, {run[f'{name}_writes_per_msg']:.2f} writes"
            for name in ("broker", "consumer", "producer") if f"{name}_wake_ups_per_msg" in run))
        if timeline:
            print(timeline_text(run))
        if threads:
            print(threads_text(run))
    for name, median in (result.get("medians") or {"": result["median"]}).items():
        count = sum(1 for run in result["runs"] if run.get("variant", "") == name)
        start = (f"; first message {median['first']:.1f} ms, after the first second p99 "
                 f"{median['after_1s_p99']:.2f} p999 {median['after_1s_p999']:.2f} ms"
                 if median.get("after_1s_p999") is not None else "")
        print(f"median of {count}{f' [{name}]' if name else ''}: p50 {median['p50']:.2f} ms, "
              f"p99 {median['p99']:.2f} ms, p999 {median['p999']:.2f} ms, "
              f"max {median['max']:.1f} ms{start}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=2000)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--consumer", choices=("pull", "push"), default="pull")
    parser.add_argument("--flush", choices=("ASYNC_FLUSH", "SYNC_FLUSH"), default="ASYNC_FLUSH")
    parser.add_argument("--concurrency", type=int, default=16)
    # schedule by default: the same due times for less of the producer's CPU, and at 20,000
    # msg/s p99 no worse (RESULTS.md, producer, 2026-11-27: lower in 6 of 9 pairs, the
    # medians level within the loaded host's spread).
    parser.add_argument("--pacing", choices=("sleep", "schedule"), default="schedule",
                        help="how the producer's coroutines wait for a message's due time: "
                             "one timer for all (pacing.Schedule, the default: the same due "
                             "times, less of the producer's CPU) or an asyncio.sleep each "
                             "(as the figures before 2026-11-27 16:50 UTC were taken)")
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--pull-batch", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeline", action="store_true")
    parser.add_argument("--threads", action="store_true",
                        help="print each thread's CPU and wake-ups per second over the run")
    parser.add_argument("--gc", action="store_true",
                        help="record each process's garbage collections and the broker's "
                             "loop lag (benchmarks/process_probe) and say which slow windows "
                             "held one")
    parser.add_argument("--slice-us", type=float, default=0,
                        help="request this EEVDF time slice for the broker (when started here), "
                             "the consumer and the producer (default: the kernel's)")
    parser.add_argument("--src", action="append", default=[], metavar="NAME=TREE",
                        help="compare source trees (repeat): every run measures each tree in "
                             "turn with a fresh tidemq dev, tidemq imported from TREE/src")
    parser.add_argument("--namesrv")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--role", choices=("driver", "producer", "consumer"), default="driver")
    parser.add_argument("--topic")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.role != "driver":
        from tidemq.remoting.loop import run as run_on_loop

        if args.role == "producer":
            summary = json.dumps(run_on_loop(_produce(args)))
            # A file, not stdout: the summary can pass 64 KiB (a loaded run's loop lags), and
            # a pipe's write was seen cut at 65,536 bytes (stdout left non-blocking).
            with open(args.out, "w") as out:
                out.write(summary)
        else:
            run_on_loop(_consume(args))
        return 0
    os.makedirs(args.dir, exist_ok=True)
    result = run_variants(args) if args.src else run_all(args)
    if args.json:
        print(json.dumps(result))
    else:
        print_report(result, args.timeline, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
