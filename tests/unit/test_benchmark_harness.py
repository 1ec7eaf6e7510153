"""The harnesses in benchmarks/ keep working as a user runs them.

Speed is measured "with the harness in benchmarks/ (a command anyone can run)", and a harness
that drives tidemq's code through fakes (a connection stand-in, a replaced ``invoke``) breaks
silently when the real interfaces move on. So every file there must answer ``--help`` (its
imports, its siblings' and tidemq's names it uses are all there), and every harness that runs
in-process (no server started) runs end to end with its smallest options, in its own
interpreter as ``python benchmarks/x.py`` would, and prints a sane figure. The harnesses that
start servers are covered by tests/integration/test_benchmark_harness_servers.py.
"""

from __future__ import annotations

import json
import re

import pytest

from benchmark_runs import BENCHMARKS, last_json, run_harness, run_python

# One interpreter answers every file's --help in turn (one interpreter start instead of
# thirty), as ``python benchmarks/<file> --help`` would: the file run as __main__ with its
# folder first on sys.path. A file without a __main__ guard (a helper such as idle.py) only
# has to import. Prints one JSON object: file name -> [exit status, output].
HELP_RUNNER = r"""
import contextlib, io, json, runpy, sys
folder, names = sys.argv[1], sys.argv[2:]
sys.path.insert(0, folder)
answers = {}
for name in names:
    sys.argv = [f"{folder}/{name}", "--help"]
    out = io.StringIO()
    status = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            runpy.run_path(f"{folder}/{name}", run_name="__main__")
        except SystemExit as exit_:
            status = exit_.code if isinstance(exit_.code, int) else (exit_.code is not None)
        except BaseException as error:  # an import error: report it, go on with the next
            import traceback
            traceback.print_exc(file=out)
            status = repr(error)
    answers[name] = [status, out.getvalue()]
print(json.dumps(answers))
"""


def test_every_benchmark_file_answers_help():
    names = sorted(path.name for path in BENCHMARKS.glob("*.py"))
    assert len(names) >= 20, f"only {names} in {BENCHMARKS}"
    done = run_python("-c", HELP_RUNNER, str(BENCHMARKS), *names)
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    broken = {}
    for name in names:
        status, output = answers[name]
        is_script = 'if __name__ == "__main__":' in (BENCHMARKS / name).read_text()
        if status != 0 or (is_script and "usage:" not in output):
            broken[name] = f"exit {status}: {output[-1500:]}"
    assert not broken, "benchmarks that do not answer --help:\n" + "\n".join(
        f"--- {name}: {text}" for name, text in broken.items())


def test_codec_bench_times_every_case():
    report = last_json(run_harness("codec_bench.py", "--runs", "1", "--min-time-s", "0.005",
                                   "--json").stdout)
    names = [case["name"] for case in report["results"]]
    assert {"send_request_encode", "send_request_decode", "pull_receive_256"} <= set(names)
    assert all(case["us_per_op"] > 0 and case["loops"] > 0 for case in report["results"])


def test_store_bench_gives_all_three_figures(tmp_path):
    report = last_json(run_harness("store_bench.py", "--messages", "300", "--runs", "1",
                                   "--dir", str(tmp_path), "--json").stdout)
    assert report["append_async_msg_per_s"] > 0 and report["append_async_runs"][0][
        "messages"] == 300
    assert report["append_sync_mb_per_s"] > 0 and report["disk_fsync_mb_per_s"] > 0
    assert report["read_queue_msg_per_s"] > 0 and report["read_queue_runs"][0]["messages"] == 300


def test_loop_stall_bench_stores_and_probes(tmp_path):
    report = last_json(run_harness("loop_stall_bench.py", "--rate", "200", "--seconds", "0.3",
                                   "--runs", "1", "--idle-queues", "3", "--dir", str(tmp_path),
                                   "--json").stdout)
    run = report["runs"][0]
    assert run["stored"] > 0 and run["probe_wake_ups"] > 0
    assert report["median"]["late_ms_max"] >= report["median"]["late_ms_p99"] >= 0


@pytest.mark.parametrize("options", [(), ("--dispatcher", "--per-read", "2")],
                         ids=["group-handler", "dispatcher"])
def test_send_cost_bench_broker_side_serves_its_reads(tmp_path, options):
    # The broker side hands the send processor (and the dispatcher) a stand-in connection:
    # the fake that went stale once (it lacked the ``loop`` the send handler reads).
    report = last_json(run_harness("send_cost_bench.py", "--side", "broker", "--sends", "64",
                                   "--runs", "1", "--dir", str(tmp_path), "--json",
                                   *options).stdout)
    assert report["median"]["A"] > 0 and len(report["runs"]["A"]) == 1


def test_store_put_cost_bench_times_and_counts_a_group(tmp_path):
    report = last_json(run_harness("store_put_cost_bench.py", "--group", "3", "--puts", "5",
                                   "--repeats", "1", "--runs", "1", "--dir", str(tmp_path),
                                   "--json").stdout)
    median = report["median"]["A"]
    assert median["us_per_message"] > 0 and median["calls_per_message"] > 10
    assert report["group"] == 3 and len(report["runs"]["A"]) == 1


def test_store_put_cost_bench_hands_a_group_over_as_columns(tmp_path):
    # --columns: the groups go to put_send_columns, which must take them (the child exits
    # with an error when the store leaves them to put_message_group).
    report = last_json(run_harness("store_put_cost_bench.py", "--group", "3", "--puts", "5",
                                   "--repeats", "1", "--runs", "1", "--dir", str(tmp_path),
                                   "--json", "--columns").stdout)
    median = report["median"]["A"]
    assert median["us_per_message"] > 0 and median["calls_per_message"] > 1


def test_put_answer_cost_bench_serves_its_groups_through_the_send_route(tmp_path):
    # The groups reach the send route's group handler with their columns read ahead (the
    # child exits with an error when the store leaves them to the message path).
    report = last_json(run_harness("put_answer_cost_bench.py", "--group", "2", "--groups", "5",
                                   "--repeats", "1", "--runs", "1", "--dir", str(tmp_path),
                                   "--json").stdout)
    median = report["median"]["A"]
    assert median["us_per_message"] > 0 and median["calls_per_message"] > 10
    assert report["group"] == 2 and len(report["runs"]["A"]) == 1


def test_queue_file_bench_measures_both_ways(tmp_path):
    out = run_harness("queue_file_bench.py", "--queues", "17", "--rounds", "1",
                      "--dir", str(tmp_path)).stdout
    for way in ("whole", "chunks"):
        line = re.search(rf"{way}\s+new queue \+ first entry\s+([\d.]+) us wall.*?"
                         r"later entries\s+([\d.]+) us each", out)
        assert line, out
        assert float(line[1]) > 0 and float(line[2]) > 0


def test_queue_file_bench_refuses_too_few_queues(tmp_path):
    done = run_harness("queue_file_bench.py", "--queues", "4", "--dir", str(tmp_path),
                       expect_exit=2)
    assert "--queues 17 or more" in done.stderr


def test_truncate_bench_cuts_the_tail(tmp_path):
    out = run_harness("truncate_bench.py", "--messages", "200", "--tail", "5", "--rounds", "1",
                      "--dir", str(tmp_path)).stdout
    # The harness itself checks each cut removed exactly --tail records (exit 0 says so);
    # the time is printed to the millisecond, which a quiet machine's cut may not reach.
    figure = re.search(r"200 messages .* cut 5 records: .* median ([\d.]+) s", out)
    assert figure and float(figure[1]) >= 0, out


def test_recovery_bench_opens_in_every_mode(tmp_path):
    report = last_json(run_harness("recovery_bench.py", "--gib", "0.0005", "--runs", "1",
                                   "--segment-mib", "4", "--dir", str(tmp_path), "--json").stdout)
    assert report["messages"] > 0 and report["log_bytes"] > 0
    for mode in ("clean", "crash (checkpoint)", "crash (whole log)"):
        assert report[mode]["median_s"] > 0, report
    # The worst case scans and CRC-checks the whole log.
    assert report["crash (whole log)"]["scanned_bytes"] == report["log_bytes"]
    assert not any(tmp_path.iterdir())  # the store is deleted at the end


def test_batch_cost_bench_serves_its_batch_reads(tmp_path):
    # The broker's batch path through a stand-in connection (the send processor's group
    # handler, the appender at the end of the iteration, every answer encoded).
    report = last_json(run_harness("batch_cost_bench.py", "--requests", "6", "--batch", "16",
                                   "--runs", "1", "--dir", str(tmp_path), "--json").stdout)
    assert report["median"]["A"] > 0 and len(report["runs"]["A"]) == 1
