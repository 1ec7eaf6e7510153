"""Apache RocketMQ's broker beside tidemq, driven by the same client with the same workload:

    .venv/bin/python benchmarks/reference_bench.py [--runs 3] [--messages 200000]

The client is the official RocketMQ 4.9.8 Java client (``tidemq.interop.Bench`` in
tests/interop/java, built by ``bash scripts/_java.sh``), one JVM per figure, so neither broker
is measured through the other's client. The reference is Apache's name server and broker
4.9.7 from Maven Central's jars (tests/reference_cluster.py; 1 GiB heap, ASYNC_FLUSH); tidemq
is ``tidemq dev`` (ASYNC_FLUSH). Both get a fresh store in a temporary folder with 128 MiB
commit-log segments, and a topic of 4 queues per figure, and is warmed first with 32,000
batched and 8,000 single messages (not measured; a fresh JVM runs interpreted). Each run
measures every figure on
both brokers, the order of the two alternating from run to run; figures are medians of the
runs, and the ratio is tidemq / Apache (higher is better for rates, lower for latency).

- ``batch``: batches of 64 x 1 KiB, 16 batches in flight, msg/s;
- ``async``: single 1 KiB messages, 64 in flight (64 sending threads; the Java client's
  callback send stalled under load here), msg/s;
- ``consume``: lite pull of everything ``batch`` stored, from the first offset, msg/s;
- ``e2e``: a push consumer at the end of a fresh topic while the producer offers
  ``--rate`` messages a second (oneway); p50 / p99 of receive time - send time.

The machine is shared: it prints the load average before and after each run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from broker_bench import DevServer  # noqa: E402
from java_runtime import client_classpath, java  # noqa: E402
from reference_cluster import ReferenceCluster  # noqa: E402
from store_bench import machine_description  # noqa: E402

SEGMENT_BYTES = 128 * 1024 * 1024
FIGURES = ("batch", "async", "consume", "e2e")
CLIENT_HEAP_MB = 512
REFERENCE_HEAP_MB = 1024
# Apache's own flow-control bounds (its defaults), which the test settings of
# tests/reference_cluster.py lengthen for busy test machines: the benchmark measures Apache as
# shipped.
APACHE_FLOW_CONTROL = {"waitTimeMillsInSendQueue": "200", "osPageCacheBusyTimeOutMills": "1000"}
WARM_MESSAGES = 32_000
START_TIMEOUT_S = 120.0  # bound on tidemq dev's start, twice DevServer's default, as before


def load_average() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def run_bench(namesrv: str, figure: str, topic: str, messages: int, rate: int,
              work_dir: str) -> dict:
    command = [java(), f"-Xmx{CLIENT_HEAP_MB}m", f"-Duser.home={work_dir}",
               "-cp", client_classpath(), "tidemq.interop.Bench", figure, namesrv, topic,
               str(messages), str(rate)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{figure} failed ({done.returncode}):\n{done.stdout[-2000:]}\n"
                           f"{done.stderr[-2000:]}")
    return json.loads(lines[-1])


def create_topics(namesrv: str, topics: list[str], work_dir: str) -> None:
    """Create the topics through tidemq's admin client (works against both brokers)."""
    for topic in topics:
        subprocess.run([os.path.join(os.path.dirname(sys.executable), "tidemq"), "admin",
                        "updateTopic", "-n", namesrv, "-t", topic, "-c", "DefaultCluster",
                        "-r", "4", "-w", "4"], check=True, capture_output=True, cwd=work_dir,
                       timeout=120)


def measure(broker: str, namesrv: str, args: argparse.Namespace, work_dir: str) -> dict:
    suffix = f"{broker}_{int(time.time() * 1000)}"
    topics = {figure: f"Bench_{figure}_{suffix}" for figure in ("batch", "async", "e2e")}
    warm = f"Bench_warm_{suffix}"
    create_topics(namesrv, [*topics.values(), warm], work_dir)
    time.sleep(2)  # both brokers register new topics with the name server asynchronously
    # Not measured: a fresh JVM broker runs interpreted at first; both brokers get the same.
    run_bench(namesrv, "batch", warm, WARM_MESSAGES, 0, work_dir)
    run_bench(namesrv, "async", warm, WARM_MESSAGES // 4, 0, work_dir)
    figures = {}
    figures["batch"] = run_bench(namesrv, "batch", topics["batch"], args.messages, 0, work_dir)
    figures["async"] = run_bench(namesrv, "async", topics["async"], args.messages // 4, 0,
                                 work_dir)
    figures["consume"] = run_bench(namesrv, "consume", topics["batch"],
                                   args.messages // 64 * 64, 0, work_dir)
    figures["e2e"] = run_bench(namesrv, "e2e", topics["e2e"], args.rate * args.latency_seconds,
                               args.rate, work_dir)
    return figures


def start(broker: str, work_dir: str):
    if broker == "apache":
        cluster = ReferenceCluster(Path(work_dir) / "apache")
        cluster.start({"mappedFileSizeCommitLog": SEGMENT_BYTES, **APACHE_FLOW_CONTROL},
                      heap_mb=REFERENCE_HEAP_MB)
        return cluster, cluster.namesrv_addr
    server = DevServer(work_dir, ["--mappedFileSizeCommitLog", str(SEGMENT_BYTES)],
                       start_timeout_s=START_TIMEOUT_S)
    return server, server.namesrv


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--latency-seconds", type=int, default=10)
    args = parser.parse_args()
    print(f"machine: {machine_description()}")
    print(f"parameters: messages={args.messages} (async {args.messages // 4}) size=1024 "
          f"rate={args.rate}/s for {args.latency_seconds} s, runs={args.runs}")
    results: dict[str, list[dict]] = {"apache": [], "tidemq": []}
    for run in range(args.runs):
        order = ("apache", "tidemq") if run % 2 == 0 else ("tidemq", "apache")
        for broker in order:
            with tempfile.TemporaryDirectory(prefix=f"refbench-{broker}-") as work_dir:
                before = load_average()
                server, namesrv = start(broker, work_dir)
                try:
                    figures = measure(broker, namesrv, args, work_dir)
                finally:
                    server.stop()
                figures["load"] = f"{before} -> {load_average()}"
                results[broker].append(figures)
                print(f"run {run + 1} {broker}: " + json.dumps(figures), flush=True)
    print("\nfigure | Apache 4.9.7 (median) | tidemq (median) | tidemq / Apache")
    for figure, key in (("batch", "msgPerS"), ("async", "msgPerS"), ("consume", "msgPerS"),
                        ("e2e", "p50Ms"), ("e2e", "p99Ms")):
        apache = statistics.median(r[figure][key] for r in results["apache"])
        tidemq = statistics.median(r[figure][key] for r in results["tidemq"])
        print(f"{figure} {key} | {apache:,.1f} | {tidemq:,.1f} | {tidemq / apache:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
