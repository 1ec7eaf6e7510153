"""What ACL signing and TLS cost batch produce (issue: security), runnable by anyone:

    .venv/bin/python benchmarks/security_bench.py [--runs 3] [--messages 300000] [--size 1024]

Each run starts two ``tidemq dev`` servers (fresh stores, free loopback ports):

- ``plain+tls``: TLS in permissive mode (a certificate made for the run with ``openssl``), ACL
  off. It serves ``produce_plain`` (plain TCP) and ``produce_tls`` (the client verifies the
  server against the run's certificate);
- ``acl``: aclEnable=true with one account and no white list, so every request is signed by
  the client and verified by the broker: ``produce_acl``.

Every figure is batch produce as broker_bench.py runs it (64 x ``--size`` bytes per request,
16 requests in flight, ``tidemq bench produce`` in its own process, started once the broker
is idle), with broker and client CPU per message. The ratios ``acl / plain`` and
``tls / plain`` are taken within each run (the machine is shared and its speed drifts from
hour to hour); the summary gives the median of each figure and of each ratio. Credentials go
to ``tidemq bench`` by environment variable, never on a command line.

It also measures, in this process, the CPU the ACL adds per batch request of that shape (the
steadier figure when the machine is busy): ``sign_us`` (the client's request hook) and
``verify_us`` (the broker's full check: header values, HMAC over the body, permissions).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from broker_bench import CALIBRATION_MESSAGES, TIDEMQ, DevServer, calibration_us, children_cpu_s
from idle import process_cpu_s, wait_process_idle
from store_bench import machine_description

ACCESS_KEY, SECRET_KEY = "benchmark", "benchmark-secret"
ACL_YAML = f"""\
accounts:
  - accessKey: {ACCESS_KEY}
    secretKey: {SECRET_KEY}
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: PUB|SUB
    admin: true
"""


def make_certificate(work_dir: str) -> tuple[str, str]:
    """A self-signed EC certificate for 127.0.0.1 (it is its own CA) and its key."""
    cert, key = os.path.join(work_dir, "server.pem"), os.path.join(work_dir, "server.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=tidemq bench", "-addext",
                    "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    return cert, key


def bench_produce(server: DevServer, topic: str, count: int, size: int,
                  env: dict[str, str]) -> dict:
    """Batch produce ``count`` messages plus CPU per message (broker_bench's method: a
    ``CALIBRATION_MESSAGES`` run is subtracted so start-up is not counted)."""
    wait_process_idle(server.process.pid)
    runs = []
    for messages in (CALIBRATION_MESSAGES, count):
        broker_before, client_before = process_cpu_s(server.process.pid), children_cpu_s()
        out = subprocess.run(
            [TIDEMQ, "bench", "produce", "-t", topic, "-s", str(size), "-b", "64", "-c", "16",
             "--count", str(messages), "-n", server.namesrv, "--json"],
            capture_output=True, text=True, timeout=600, check=False, env={**os.environ, **env})
        if out.returncode != 0:
            raise RuntimeError(f"tidemq bench produce failed: {out.stderr.strip()}")
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        if summary.get("errors"):
            raise RuntimeError(f"tidemq bench produce had errors: {summary.get('first_error')}")
        summary["broker_cpu_s"] = process_cpu_s(server.process.pid) - broker_before
        summary["client_cpu_s"] = children_cpu_s() - client_before
        runs.append(summary)
    calibration, summary = runs
    extra = summary["messages"] - calibration["messages"]
    summary["broker_cpu_us_per_msg"] = (
        (summary["broker_cpu_s"] - calibration["broker_cpu_s"]) / extra * 1e6)
    summary["client_cpu_us_per_msg"] = (
        (summary["client_cpu_s"] - calibration["client_cpu_s"]) / extra * 1e6)
    return summary


def signature_cost(size: int, work_dir: str, rounds: int = 2000) -> dict:
    """CPU µs per batch request (64 messages of ``size`` bytes) to sign and to verify."""
    from tidemq.acl import AclValidator, load_acl_file
    from tidemq.client.security import Credentials
    from tidemq.protocol.codes import RequestCode
    from tidemq.protocol.command import RemotingCommand
    from tidemq.protocol.message import BatchEntry, encode_batch_body

    acl_file = Path(work_dir) / "cost_acl.yml"
    acl_file.write_text(ACL_YAML)
    validator = AclValidator(load_acl_file(acl_file))
    body = encode_batch_body([BatchEntry(os.urandom(size), "UNIQ_KEY\x01" + "0" * 32)
                              for _ in range(64)])
    fields = {"a": "BENCH_PRODUCER", "b": "BenchAcl", "c": "TBW102", "d": "4", "e": "1",
              "f": "0", "g": "1764115200000", "h": "0", "i": "", "j": "0", "k": "false",
              "m": "true"}
    hook = Credentials(ACCESS_KEY, SECRET_KEY).request_hook()
    request = RemotingCommand(RequestCode.SEND_BATCH_MESSAGE, 1, ext_fields=fields, body=body)
    started = time.process_time()
    for _ in range(rounds):
        request.ext_fields = fields
        hook(request)
    sign_us = (time.process_time() - started) / rounds * 1e6
    started = time.process_time()
    for _ in range(rounds):
        assert validator.check(request, "127.0.0.1:1") is None
    verify_us = (time.process_time() - started) / rounds * 1e6
    return {"body_bytes": len(body), "sign_us": sign_us, "verify_us": verify_us}


def one_run(args: argparse.Namespace, run: int) -> dict:
    work_dir = tempfile.mkdtemp(prefix="security-bench-", dir=args.dir)
    try:
        cert, key = make_certificate(work_dir)
        acl_file = os.path.join(work_dir, "plain_acl.yml")
        with open(acl_file, "w") as handle:
            handle.write(ACL_YAML)
        results: dict = {"calibration": {"send_request_decode_cpu_us": calibration_us()},
                         "acl_cost_per_request": signature_cost(args.size, work_dir)}
        tls_dir = os.path.join(work_dir, "tls")
        os.makedirs(tls_dir)
        server = DevServer(tls_dir, ["--tlsEnable", "true", "--tlsServerMode", "permissive",
                                     "--tlsServerCertPath", cert, "--tlsServerKeyPath", key])
        try:
            results["produce_plain"] = bench_produce(server, "BenchPlain", args.messages,
                                                     args.size, {})
            results["produce_tls"] = bench_produce(server, "BenchTls", args.messages,
                                                   args.size, {"TIDEMQ_TLS_CA_FILE": cert})
        finally:
            server.stop()
        acl_dir = os.path.join(work_dir, "acl")
        os.makedirs(acl_dir)
        server = DevServer(acl_dir, ["--aclEnable", "true", "--aclFilePath", acl_file])
        try:
            results["produce_acl"] = bench_produce(
                server, "BenchAcl", args.messages, args.size,
                {"TIDEMQ_ACCESS_KEY": ACCESS_KEY, "TIDEMQ_SECRET_KEY": SECRET_KEY})
        finally:
            server.stop()
        plain = results["produce_plain"]["msgs_per_s"]
        results["ratio_acl_over_plain"] = results["produce_acl"]["msgs_per_s"] / plain
        results["ratio_tls_over_plain"] = results["produce_tls"]["msgs_per_s"] / plain
        return results
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    print(f"security_bench: {args.runs} runs, {args.messages} x {args.size} B per figure, "
          "batches of 64, 16 in flight; " + machine_description(), flush=True)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    runs = []
    for run in range(args.runs):
        result = one_run(args, run)
        runs.append(result)
        if not args.json:
            print(f"run {run + 1}: calibration "
                  f"{result['calibration']['send_request_decode_cpu_us']:.2f} us; " + "; ".join(
                      f"{name} {result[name]['msgs_per_s']:,.0f} msg/s "
                      f"({result[name]['broker_cpu_us_per_msg']:.1f} / "
                      f"{result[name]['client_cpu_us_per_msg']:.1f} us)"
                      for name in ("produce_plain", "produce_acl", "produce_tls"))
                  + f"; acl/plain {result['ratio_acl_over_plain']:.3f}, "
                  f"tls/plain {result['ratio_tls_over_plain']:.3f}; ACL CPU per "
                  f"{result['acl_cost_per_request']['body_bytes']} B request: sign "
                  f"{result['acl_cost_per_request']['sign_us']:.1f} us, verify "
                  f"{result['acl_cost_per_request']['verify_us']:.1f} us", flush=True)
    summary = {
        name: statistics.median(r[name]["msgs_per_s"] for r in runs)
        for name in ("produce_plain", "produce_acl", "produce_tls")
    } | {
        name: statistics.median(r[name] for r in runs)
        for name in ("ratio_acl_over_plain", "ratio_tls_over_plain")
    }
    for name in ("sign_us", "verify_us"):
        summary[name] = statistics.median(r["acl_cost_per_request"][name] for r in runs)
    summary["load_average_at_end"] = os.getloadavg()
    if args.json:
        print(json.dumps({"runs": runs, "median": summary}))
    else:
        print("median: " + json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
