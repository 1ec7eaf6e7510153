"""Soak the rocketmq-nodejs (cpp2) retry scenario: many --fail-first runs, anomalies counted.

    python tests/interop/node/retry_soak.py --runs 6 --count 200 [--modes sync,sync-gated]
        [--apache] [--workdir DIR] [--thread-count N] [--max-batch-size N] [--timeout-s S]

Starts one name server and one broker as the tests do (tests/server_processes.py, every
delay level 1 s; with --apache Apache RocketMQ's own, tests/reference_cluster.py), then
runs the cpp2 consume scenario of scenarios.js ``--runs`` times, the modes alternated, each
run with its own topic and group. A mode is a name holding ``deferred`` (the listener acks
from setImmediate; else in the listener) and how the soak produces: ``gated`` one message
at a time, each after the consumer's first delivery of the one before (as the test does);
``preloaded`` all of them before the consumer starts; else all at once after it started.
Per run it prints one JSON line: third (or later) deliveries, bodies without a second
delivery, the C++ core's "consume fail" log lines (its send-backs), how many of those were
for a message at index > 0 of the batch the core handed to the listener, and the messages
stored in the group's retry topic beyond one per message. Bounded: each run ends at
--timeout-s; the servers are stopped by PID.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent.parent), str(HERE.parent)]

from client_process import ClientProcess  # noqa: E402
from tidemq_side import create_topic, produce, read_back  # noqa: E402

from reference_cluster import ReferenceCluster  # noqa: E402
from server_processes import start_cluster  # noqa: E402
from tidemq.client import Message  # noqa: E402

CONSUME_FAIL = re.compile(r"consume fail, MQ is:(.*?), its msgId is:(\w+), index is:(\d+), "
                          r"reconsume times is:(\d+)")


def run_once(cluster, workdir: Path, index: int, mode: str, count: int, extra: list[str],
             timeout_s: float) -> dict:
    topic, group = f"Soak{index}", f"soak_{index}"
    create_topic(cluster, topic)
    create_topic(cluster, f"%RETRY%{group}", queue_nums=1)
    args = ["node", str(HERE / "scenarios.js"), "cpp2", "consume", "--namesrv",
            cluster.namesrv_addr, "--topic", topic, "--group", group, "--fail-first",
            "--expect", str(2 * count), *extra]
    if "deferred" in mode:
        args.append("--deferred-ack")
    messages = [Message(topic, f"msg-{i}", tags="TagA", keys=[f"k{i}"]) for i in range(count)]
    if "preloaded" in mode:  # stored before the consumer starts: its first pulls get several
        produce(cluster.namesrv_addr, messages)
    process = ClientProcess(f"soak {index}", workdir / f"run-{index}", args, timeout_s,
                            exit_hang_tolerated=True).start()
    try:
        process.wait_for_output("CONSUMER STARTED")
        if "preloaded" in mode:
            pass
        elif "gated" in mode:  # one at a time, each after the previous one's first delivery
            for i, message in enumerate(messages):
                produce(cluster.namesrv_addr, [message])
                process.wait_for_output(f"delivered msg-{i} attempt 1\n")
        else:
            produce(cluster.namesrv_addr, messages)
        status = process._wait_for_end()
    finally:
        process.kill()
    document = json.loads(process.out_path.read_text()) if process.out_path.exists() else {}
    attempts = collections.defaultdict(list)
    for record in document.get("received", []):
        attempts[record["body"]].append(record["attempt"])
    log = process.workdir / "cpp2-logs"  # the C++ core's log file
    fails = CONSUME_FAIL.findall(log.read_text(errors="replace")) if log.exists() else []
    time.sleep(2)  # lets a send-back of the last messages reach the retry topic (soak only)
    retry_stored = read_back(cluster.namesrv_addr, f"%RETRY%{group}")
    return {
        "run": index, "mode": mode, "status": status, "ok": document.get("ok"),
        "received": len(document.get("received", [])),
        "third_deliveries": sum(1 for a in attempts.values() if max(a) >= 3),
        "no_second_delivery": count - sum(1 for a in attempts.values() if 2 in a),
        "send_backs": len(fails),
        "send_backs_at_index_gt_0": sum(1 for f in fails if int(f[2]) > 0),
        "send_backs_reconsume_gt_0": sum(1 for f in fails if int(f[3]) > 0),
        "retry_topic_extra": len(retry_stored) - count,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--modes", default="sync")
    parser.add_argument("--thread-count", type=int)
    parser.add_argument("--max-batch-size", type=int)
    parser.add_argument("--timeout-s", type=float, default=90.0)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--apache", action="store_true",
                        help="against Apache RocketMQ's name server and broker "
                             "(tests/reference_cluster.py), not tidemq's")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="cpp2-soak-"))
    processes: list = []
    modes = args.modes.split(",")
    extra = [*(["--thread-count", str(args.thread_count)] if args.thread_count else []),
             *(["--max-batch-size", str(args.max_batch_size)] if args.max_batch_size else [])]
    delays = {"messageDelayLevel": " ".join(["1s"] * 18)}
    apache = ReferenceCluster(workdir / "apache") if args.apache else None
    try:
        if apache:
            apache.start(delays)
            cluster = SimpleNamespace(namesrv_addr=apache.namesrv_addr, namesrvs=[
                SimpleNamespace(addr=apache.namesrv_addr, name="Apache name server")])
        else:
            cluster = start_cluster(workdir, processes, broker_overrides=delays)
        for index in range(args.runs):
            line = run_once(cluster, workdir, index, modes[index % len(modes)], args.count,
                            extra, args.timeout_s)
            print(json.dumps(line), flush=True)
    finally:
        for server in reversed(processes):
            server.stop()
        if apache:
            apache.stop()
    print(f"workdir: {workdir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
