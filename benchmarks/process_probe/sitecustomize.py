"""A benchmark's probe of a process it starts: garbage-collector pauses and event-loop lag.

``latency_bench.py --gc`` puts this folder on the PYTHONPATH of the processes it starts
(``tidemq dev``, the consumer, the producer), so Python imports this module as each one
starts. With ``TIDEMQ_BENCH_PROBE_DIR`` set it appends one record per event to
``<dir>/<pid>.bin`` at once (a process stopped by a signal loses none):

- every garbage collection: its wall-clock start, its duration and its generation (0-2);
- with ``TIDEMQ_BENCH_LOOP_PROBE`` set too, every time a 5 ms sleep on the process's first
  uvloop loop woke more than 2 ms late (kind ``LOOP_LAG``): the loop was busy, or the
  process had no core. The driver sets it for the broker only; its two clients have their
  own probe.

Cheap: two clock reads per collection and one small write per collection or late wake-up.
Without the variable the module does nothing.
"""

from __future__ import annotations

import gc
import os
import struct
import time

RECORD = struct.Struct("<qqq")  # wall ns at the start, duration ns, kind
LOOP_LAG = 9  # the kind of a late loop wake-up (0-2: a collection of that generation)


def _install(directory: str) -> None:
    fd = os.open(os.path.join(directory, f"{os.getpid()}.bin"),
                 os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    started = [0, 0]  # wall ns, perf ns of the collection under way

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.time_ns()
            started[1] = time.perf_counter_ns()
        else:
            os.write(fd, RECORD.pack(started[0], time.perf_counter_ns() - started[1],
                                     info["generation"]))

    gc.callbacks.append(on_gc)
    if os.environ.get("TIDEMQ_BENCH_LOOP_PROBE"):
        _probe_first_loop(fd)


def _probe_first_loop(fd: int) -> None:
    try:
        import uvloop
    except ImportError:
        return
    import asyncio

    factory = uvloop.new_event_loop

    async def probe(period_s: float = 0.005) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + period_s
            await asyncio.sleep(period_s)
            late = loop.time() - due
            if late > 0.002:
                os.write(fd, RECORD.pack(time.time_ns(), int(late * 1e9), LOOP_LAG))

    def new_event_loop() -> asyncio.AbstractEventLoop:
        uvloop.new_event_loop = factory  # the first loop only: the server's
        loop = factory()
        loop.call_soon(lambda: loop.create_task(probe()))
        return loop

    uvloop.new_event_loop = new_event_loop


if os.environ.get("TIDEMQ_BENCH_PROBE_DIR"):
    _install(os.environ["TIDEMQ_BENCH_PROBE_DIR"])
