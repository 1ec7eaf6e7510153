"""Broker benchmarks (issue: name server, broker and client), runnable by anyone:

    .venv/bin/python benchmarks/broker_bench.py [--runs 3] [--messages 200000] [--size 1024]

Starts its own ``tidemq dev`` (name server + broker, ASYNC_FLUSH, a fresh store in a temporary
directory, free loopback ports) and drives it with ``tidemq bench`` in separate processes, so
client and broker each have a process, as a user would run them. Figures, median of ``--runs``:

- ``produce_batch``: batches of 64 x 1 KiB, 16 requests in flight, msg/s;
- ``produce_async_single``: single messages, 64 in flight, msg/s;
- ``consume_pull``: pull everything from the first offset, msg/s;
- ``e2e_latency_at_2000``: a consumer waits at the end of a fresh topic while a producer offers
  2,000 single messages a second for ``--latency-seconds``; p50/p99/p999 of now - born time.

Next to each rate it prints CPU time per message, the steadier figure on a shared machine:
the broker's (``tidemq dev`` process, from /proc/<pid>/stat across the run) and the client's
(the ``tidemq bench`` process, from ``RUSAGE_CHILDREN``, less the CPU of a run of
``CALIBRATION_MESSAGES`` messages, so the interpreter's start-up and imports are not counted).

Each produce figure starts once the broker has gone idle (``idle.py``: its start-up warms the
first commit-log segments, seconds of CPU on a fresh virtual machine).

It prints its parameters and the machine first, then one line per figure (``--json``: one JSON
object).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import IO

from idle import process_cpu_s, wait_process_idle
from store_bench import machine_description

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from server_processes import free_port as _test_free_port

VENV_BIN = os.path.dirname(sys.executable)
TIDEMQ = os.path.join(VENV_BIN, "tidemq")

# A client run this short costs about its start-up alone; its CPU is subtracted from the
# measured run's so "client CPU per message" is the steady cost of sending.
CALIBRATION_MESSAGES = 256


def free_port(*, neighbours: tuple[int, ...] = ()) -> int:
    """A loopback port free right now (and ``port + n`` for each n in ``neighbours``).

    tests/server_processes.free_port: below the kernel's ephemeral range, so an outgoing
    connection made meanwhile (the kernel gives those any free ephemeral port) cannot take it
    between this pick and the server's bind, as a port from ``bind(0)`` could on a busy
    machine; under pytest (the harness tests) in the calling worker's slice of that range.
    """
    return _test_free_port(neighbours=neighbours)


READY_MARKER = b"Ctrl-C to stop"  # ends the line tidemq dev prints once it serves
DEV_START_TIMEOUT_S = 60.0


def wait_until_serving(log_path: str, timeout_s: float = DEV_START_TIMEOUT_S,
                       process: subprocess.Popen | None = None) -> None:
    """Wait for tidemq dev's ready line in its log: printed once the broker is registered
    with the name server. Its port listens earlier, and an admin request sent in between
    finds no broker in the cluster (``updateTopic -c`` failed so on a busy CI machine)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(log_path, "rb") as log:
            if READY_MARKER in log.read():
                return
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}) before serving")
        time.sleep(0.05)
    raise RuntimeError(f"tidemq dev did not print its ready line within {timeout_s:g} s")


class DevServer:
    """A ``tidemq dev`` process (name server + broker) on free ports with its own store,
    started once it serves and stopped by its PID; every benchmark's one way to start it.

    Args:
        work_dir: folder of its store (``store/``) and log (``dev.log``), left in place at
            ``stop``; when None, a temporary folder that ``stop`` deletes.
        extra_args: more ``tidemq dev`` words (``--flushDiskType SYNC_FLUSH`` ...).
        log_level: ``--log-level`` (tidemq dev's default when None).
        start_new_session: run it in a session of its own (a Ctrl-C in the terminal, or a
            signal to this benchmark's process group, does not reach it; ``stop`` does).
        start_timeout_s: bound on the wait for its ready line.

    Raises:
        RuntimeError: it did not start in three tries (the message ends with its log).
    """

    def __init__(self, work_dir: str | None = None, extra_args: list[str] | None = None, *,
                 log_level: str | None = None, start_new_session: bool = False,
                 start_timeout_s: float = DEV_START_TIMEOUT_S):
        self.temporary_dir = work_dir is None
        self.work_dir = tempfile.mkdtemp(prefix="tidemq-dev-bench-") if work_dir is None \
            else work_dir
        args = list(extra_args or [])
        if log_level is not None:
            args += ["--log-level", log_level]
        # Free ports are only free when asked: another process may take one (the broker also
        # binds listenPort - 2 and listenPort + 1) before the broker does; try again.
        for attempt in range(3):
            try:
                self._start(args, start_new_session, start_timeout_s)
                return
            except RuntimeError:
                if attempt == 2:
                    if self.temporary_dir:
                        shutil.rmtree(self.work_dir, ignore_errors=True)
                    raise

    def _start(self, extra_args: list[str], start_new_session: bool,
               start_timeout_s: float) -> None:
        work_dir = self.work_dir
        self.namesrv_port = free_port()
        broker_port = free_port(neighbours=(-2, 1))  # its VIP port below, its HA port above
        log_path = os.path.join(work_dir, "dev.log")
        self.log = open(log_path, "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [TIDEMQ, "dev", "--namesrvPort", str(self.namesrv_port),
             "--listenPort", str(broker_port),
             "--storePathRootDir", os.path.join(work_dir, "store"), *extra_args],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=work_dir,
            start_new_session=start_new_session,
        )
        try:
            wait_until_serving(log_path, start_timeout_s, process=self.process)
        except RuntimeError:
            stop_process(self.process, self.log, grace_s=20)  # by PID, never left behind
            shutil.rmtree(os.path.join(work_dir, "store"), ignore_errors=True)
            with open(log_path, errors="replace") as log:
                raise RuntimeError(f"tidemq dev did not start; its log ends:\n"
                                   f"{log.read()[-2000:]}") from None
        self.namesrv = f"127.0.0.1:{self.namesrv_port}"
        self.broker_port = broker_port

    def stop(self) -> None:
        """Stop it by its PID (SIGTERM, then SIGKILL after 20 s); a temporary folder goes."""
        stop_process(self.process, self.log, grace_s=20)
        if self.temporary_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)


def stop_process(process: subprocess.Popen, log: IO[bytes], grace_s: float = 20) -> None:
    """Stop a server this benchmark started, by its PID: SIGTERM, then SIGKILL if it is
    still running after ``grace_s``; then close its log."""
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    log.close()


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench(namesrv: str, *args: str, timeout_s: float = 300, broker_pid: int | None = None
          ) -> dict:
    """Run ``tidemq bench ... --json`` and return its summary, with ``client_cpu_s`` (and
    ``broker_cpu_s`` when ``broker_pid`` is given) added: CPU seconds spent during the run."""
    broker_before = process_cpu_s(broker_pid) if broker_pid else 0.0
    client_before = children_cpu_s()
    out = subprocess.run(
        [TIDEMQ, "bench", *args, "-n", namesrv, "--json"],
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"tidemq bench {' '.join(args)} failed: {out.stderr.strip()}")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    summary["client_cpu_s"] = children_cpu_s() - client_before
    if broker_pid:
        summary["broker_cpu_s"] = process_cpu_s(broker_pid) - broker_before
    return summary


def produce_with_cpu(server: DevServer, topic: str, count: int, *args: str) -> dict:
    """A produce run plus CPU µs per message of broker and client (see module docstring),
    started once the broker is idle (idle.py)."""
    wait_process_idle(server.process.pid)
    calibration = bench(server.namesrv, "produce", "-t", topic, *args,
                        "--count", str(CALIBRATION_MESSAGES), broker_pid=server.process.pid)
    summary = bench(server.namesrv, "produce", "-t", topic, *args, "--count", str(count),
                    broker_pid=server.process.pid)
    extra = summary["messages"] - calibration["messages"]
    summary["broker_cpu_us_per_msg"] = (
        (summary["broker_cpu_s"] - calibration["broker_cpu_s"]) / extra * 1e6)
    summary["client_cpu_us_per_msg"] = (
        (summary["client_cpu_s"] - calibration["client_cpu_s"]) / extra * 1e6)
    return summary


def calibration_us() -> float:
    """Host speed now: codec_bench's ``send_request_decode`` CPU µs (RESULTS.md compares runs
    by it, as the host's speed moves by a factor of 2 from hour to hour)."""
    out = subprocess.run(
        [sys.executable, os.path.join(os.path.dirname(__file__), "codec_bench.py"),
         "--only", "send_request_decode", "--runs", "3", "--json"],
        capture_output=True, text=True, timeout=120, check=True,
    )
    return json.loads(out.stdout)["results"][0]["cpu_us_per_op"]


def one_run(args: argparse.Namespace, run: int) -> dict[str, dict]:
    calibration = {"send_request_decode_cpu_us": calibration_us()}
    work_dir = tempfile.mkdtemp(prefix="broker-bench-", dir=args.dir)
    server = DevServer(work_dir)
    try:
        size = str(args.size)
        results = {
            "calibration": calibration,
            "produce_batch": produce_with_cpu(server, "BenchBatch", args.messages, "-s", size,
                                              "-b", "64", "-c", "16"),
            "produce_async_single": produce_with_cpu(server, "BenchSingle", args.messages // 4,
                                                     "-s", size, "-b", "0", "-c", "64"),
            "consume_pull": bench(server.namesrv, "consume", "-t", "BenchBatch", "--from",
                                  "first", "--count", str(args.messages)),
        }
        bench(server.namesrv, "produce", "-t", "BenchLatency", "-b", "0", "-c", "1",
              "--count", "1")  # creates the topic so the consumer finds its queues
        # The consumer must be waiting at the end of the topic before the paced producer starts.
        consumer = subprocess.Popen(
            [TIDEMQ, "bench", "consume", "-n", server.namesrv, "-t", "BenchLatency", "-g",
             f"LATENCY_{run}", "--from", "last", "--latency", "--seconds",
             str(args.latency_seconds + 6), "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        time.sleep(4)
        bench(server.namesrv, "produce", "-t", "BenchLatency", "-s", size, "-b", "0",
              "-c", "16", "--rate", "2000", "--seconds", str(args.latency_seconds))
        stdout, stderr = consumer.communicate(timeout=args.latency_seconds + 60)
        if consumer.returncode != 0:
            raise RuntimeError(f"latency consumer failed: {stderr.strip()}")
        results["e2e_latency_at_2000"] = json.loads(stdout.strip().splitlines()[-1])
        return results
    finally:
        server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--latency-seconds", type=float, default=10)
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    if not args.json:
        print(f"broker bench: {args.messages} x {args.size} B, median of {args.runs}, "
              f"tidemq dev with ASYNC_FLUSH; {time.strftime('%Y-%m-%d')}")
        print(f"machine: {machine_description()}")
    runs = [one_run(args, run) for run in range(args.runs)]
    figures: dict[str, object] = {"machine": machine_description(),
                                  "date": time.strftime("%Y-%m-%d"), "runs": args.runs}
    for name in ("produce_batch", "produce_async_single", "consume_pull"):
        rates = [r[name]["msgs_per_s"] for r in runs]
        figures[name] = statistics.median(rates)
        cpu = ""
        if name.startswith("produce"):
            for side in ("broker", "client"):
                per_msg = [r[name][f"{side}_cpu_us_per_msg"] for r in runs]
                figures[f"{name}_{side}_cpu_us_per_msg"] = statistics.median(per_msg)
                cpu += (f"; {side} CPU {statistics.median(per_msg):.1f} us/msg "
                        f"({', '.join(f'{x:.1f}' for x in per_msg)})")
        if not args.json:
            print(f"{name}: {statistics.median(rates):,.0f} msg/s "
                  f"(runs: {', '.join(f'{x:,.0f}' for x in rates)}){cpu}")
    calibrations = [r["calibration"]["send_request_decode_cpu_us"] for r in runs]
    figures["codec_send_request_decode_cpu_us"] = statistics.median(calibrations)
    if not args.json:
        print(f"calibration: codec_bench send_request_decode {statistics.median(calibrations):.2f}"
              f" CPU us (runs: {', '.join(f'{x:.2f}' for x in calibrations)})")
    latency = {q: statistics.median(r["e2e_latency_at_2000"][f"latency_ms_{q}"] for r in runs)
               for q in ("p50", "p99", "p999")}
    figures["e2e_latency_at_2000_ms"] = latency
    if not args.json:
        print(f"e2e latency at 2,000 msg/s: p50 {latency['p50']:.1f} ms, p99 "
              f"{latency['p99']:.1f} ms, p999 {latency['p999']:.1f} ms")
    else:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
