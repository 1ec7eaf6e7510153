"""The harnesses of benchmarks/ that start their own ``tidemq dev`` keep working: the
cheapest few, each run once with its smallest options (tests/unit/test_benchmark_harness.py
covers the in-process ones and every file's ``--help``).

These are the harnesses behind the issue-18 figures of the low-rate path: a producer with its
connection replaced by a canned answer (send_cost_bench), the send + woken pull + parked pull
cycle (request_cost_bench) and end-to-end latency (latency_bench, as figures.py runs it).
"""

from __future__ import annotations

from benchmark_runs import last_json, run_harness


def test_send_cost_bench_producer_side_sends_through_its_canned_answer(tmp_path):
    # The producer's remoting.invoke is replaced by a function that encodes the request and
    # returns a canned SEND answer: it breaks when the client's internals move.
    report = last_json(run_harness("send_cost_bench.py", "--side", "producer", "--sends",
                                   "200", "--runs", "1", "--dir", str(tmp_path),
                                   "--json").stdout)
    assert report["sends"] == 200 and report["median"]["A"] > 0
    assert not any(tmp_path.iterdir())  # its server's store and log are deleted at the end


def test_request_cost_bench_runs_its_cycles(tmp_path):
    report = last_json(run_harness("request_cost_bench.py", "--cycles", "40", "--runs", "1",
                                   "--dir", str(tmp_path), "--json").stdout)
    assert report["cycles"] == 40
    run = report["runs"][0]
    # The main thread's CPU comes in nanoseconds, the client's from its own clock; the
    # process's in clock ticks (10 ms), which 40 cycles may not reach.
    assert run["broker_main_thread_us_per_cycle"] > 0 and run["client_us_per_cycle"] > 0
    assert run["broker_process_us_per_cycle"] >= 0


def test_latency_bench_receives_what_it_offers(tmp_path):
    report = last_json(run_harness("latency_bench.py", "--rate", "200", "--seconds", "1",
                                   "--runs", "1", "--dir", str(tmp_path), "--json").stdout)
    run = report["runs"][0]
    assert run["producer_sent"] > 0 and run["producer_errors"] == 0, run
    assert run["received"] >= run["producer_sent"], run  # every message sent was received
    assert 0 < report["median"]["p50"] <= report["median"]["p99"] <= report["median"]["max"]
    # The first message (the producer's first send) is reported apart, and is one of them.
    assert 0 < run["first_latency_ms"] <= run["latency_ms_max"]
    assert report["median"]["first"] == run["first_latency_ms"]
    # The machine's share: each process's waits for a core, per timeline window.
    assert set(run["core_wait_windows_ms"]) == {"broker", "consumer", "producer"}
    assert all(len(column) == len(run["window_max_ms"])
               for column in run["core_wait_windows_ms"].values())
    assert 0 <= run["windows_over_5ms_core_wait"] <= run["windows_over_5ms"]


def test_latency_bench_gc_probe_reports_every_process(tmp_path):
    # --gc: each process's collections and the broker's loop lag, per timeline window.
    report = last_json(run_harness("latency_bench.py", "--rate", "200", "--seconds", "1",
                                   "--runs", "1", "--gc", "--dir", str(tmp_path),
                                   "--json").stdout)
    run = report["runs"][0]
    assert run["received"] >= run["producer_sent"] > 0, run
    assert set(run["gc"]) == {"broker", "consumer", "producer"}
    for figures in run["gc"].values():
        assert figures["probed"], run["gc"]  # the probe loaded in each of the three
        assert len(figures["count"]) == 3 and all(count >= 0 for count in figures["count"])
    assert all(len(column) == len(run["window_max_ms"])
               for column in run["gc_windows_ms"].values())
    assert len(run["broker_lag_windows_ms"]) == len(run["window_max_ms"])
    assert set(run["windows_over_5ms_gc"]) == {"broker", "consumer", "producer"}
    assert 0 <= run["windows_over_5ms_broker_lag"] <= run["windows_over_5ms"]
    assert not any(tmp_path.iterdir())  # the probe's records went with the run's folder
