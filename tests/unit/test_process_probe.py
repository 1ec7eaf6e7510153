"""benchmarks/process_probe (``latency_bench.py --gc``) records what it promises: each garbage
collection of a process started with it, and a late wake-up of that process's first uvloop
loop when asked; the driver turns the records into per-window figures."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

from benchmark_runs import BENCHMARKS, RUN_TIMEOUT_S


def _latency_bench():
    spec = importlib.util.spec_from_file_location("latency_bench_under_test",
                                                  BENCHMARKS / "latency_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Two forced collections, then a loop that is blocked for 50 ms by a synchronous sleep.
PROBED = """
import asyncio, gc, time, uvloop
gc.collect(0)
gc.collect(2)
async def main():
    await asyncio.sleep(0.02)
    time.sleep(0.05)
    await asyncio.sleep(0.02)
loop = uvloop.new_event_loop()
loop.run_until_complete(main())
loop.close()
"""


def _run_probed(tmp_path, **variables: str) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("TIDEMQ_BENCH_")}
    env.update(PYTHONPATH=str(BENCHMARKS / "process_probe"), **variables)
    return subprocess.run([sys.executable, "-c", PROBED], env=env, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S, check=True)


def test_probe_records_collections_and_the_loops_lag(tmp_path):
    bench = _latency_bench()
    done = _run_probed(tmp_path, TIDEMQ_BENCH_PROBE_DIR=str(tmp_path),
                       TIDEMQ_BENCH_LOOP_PROBE="1")
    (record_file,) = tmp_path.iterdir()
    records = bench.read_probe(str(record_file))
    kinds = [kind for _, _, kind in records]
    assert 0 in kinds and 2 in kinds, (records, done.stderr)
    assert all(duration >= 0 for _, duration, _ in records)
    lags = [duration for _, duration, kind in records if kind == bench.PROBE_LOOP_LAG]
    # The 5 ms probe sleep was due inside the 50 ms block: it woke at least 40 ms late.
    assert lags and max(lags) >= 40_000_000, records


def test_probe_without_its_variable_does_nothing(tmp_path):
    _run_probed(tmp_path)  # TIDEMQ_BENCH_PROBE_DIR unset
    assert not any(tmp_path.iterdir())


def test_loop_probe_only_when_asked(tmp_path):
    bench = _latency_bench()
    _run_probed(tmp_path, TIDEMQ_BENCH_PROBE_DIR=str(tmp_path))
    (record_file,) = tmp_path.iterdir()
    kinds = {kind for _, _, kind in bench.read_probe(str(record_file))}
    assert kinds and bench.PROBE_LOOP_LAG not in kinds


def test_probe_figures_place_pauses_in_their_windows(tmp_path):
    bench = _latency_bench()
    first = 1_000_000_000_000
    window_ns = bench.WINDOW_MS * 1_000_000
    rows = {  # pid -> (offset ns from the first arrival, duration ns, kind)
        11: [(window_ns + 5, 3_000_000, 0), (3 * window_ns, 500_000, 1),
             (9 * window_ns, 7_000_000, 2)],  # the last one after the run: not counted
        22: [(2 * window_ns + 1, 2_500_000, bench.PROBE_LOOP_LAG), (window_ns, 200_000, 0)],
    }
    for pid, events in rows.items():
        with open(tmp_path / f"{pid}.bin", "wb") as out:
            for offset, duration, kind in events:
                out.write(bench.PROBE_RECORD.pack(first + offset, duration, kind))
    windows = [1.0, 6.0, 1.0, 9.0]  # windows 1 and 3 held a message over 5 ms
    figures = bench.probe_figures(str(tmp_path), {"producer": 11, "broker": 22,
                                                  "consumer": 33}, first, windows)
    assert figures["gc"]["producer"]["count"] == [1, 1, 0]
    assert figures["gc"]["producer"]["longest_ms"] == [3.0, 0.5, 0.0]
    assert figures["gc"]["broker"]["count"] == [1, 0, 0]
    assert figures["gc"]["consumer"]["count"] == [0, 0, 0]  # no file: nothing recorded
    assert not figures["gc"]["consumer"]["probed"] and figures["gc"]["broker"]["probed"]
    assert figures["gc_windows_ms"]["producer"] == [0.0, 3.0, 0.0, 0.5]
    assert figures["broker_lag_windows_ms"] == [0.0, 0.0, 2.5, 0.0]
    # Window 1 held the producer's 3 ms collection; window 3 had the broker's lag before it.
    assert figures["windows_over_5ms_gc"] == {"producer": 1, "broker": 0, "consumer": 0}
    assert figures["windows_over_5ms_broker_lag"] == 1
