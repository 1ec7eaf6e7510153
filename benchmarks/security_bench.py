"""What ACL signing and TLS cost batch produce (issue: security), runnable by anyone:

    .venv/bin/python benchmarks/security_bench.py [--runs 3] [--messages 300000] [--size 1024]

One run starts two ``tidemq dev`` servers (fresh stores, free loopback ports) and keeps them
for ``--runs`` rounds:

- ``plain+tls``: TLS in permissive mode (a certificate made for the run with ``openssl``), ACL
  off. It serves ``produce_plain`` (plain TCP) and ``produce_tls`` (the client verifies the
  server against the run's certificate);
- ``acl``: aclEnable=true with one account and no white list, so every request is signed by
  the client and verified by the broker: ``produce_acl``.

Every figure is batch produce as broker_bench.py runs it (64 x ``--size`` bytes per request,
16 requests in flight, ``tidemq bench produce`` in its own process, started once the broker
is idle), with broker and client CPU per message and the load average before it. A round
takes one figure of each kind, in an order that alternates from round to round (plain, TLS,
ACL, then ACL, TLS, plain), and the ratios ``acl / plain`` and ``tls / plain`` are taken
within each round (the machine is shared and its speed drifts from minute to minute); the
summary gives the median of each figure and of each ratio. Each ratio also comes as a CPU
ratio (broker plus client CPU per message of plain over the other), the rate ratio a
machine would show where the pipeline is CPU-bound. Credentials go
to ``tidemq bench`` by environment variable, never on a command line.

It also measures, in this process, the CPU the ACL adds per batch request of that shape (the
steadier figure when the machine is busy): ``sign_us`` (the client's request hook) and
``verify_us`` (the broker's full check: header values, HMAC over the body, permissions);
and after each round the HA stream (master to slave, in-memory stores) in plain TCP and
over TLS: MB/s and CPU seconds per 100 MB (``ha_stream_cost``).
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


FIGURES = ("produce_plain", "produce_tls", "produce_acl")


class _NoCheck:
    """The slave's master check, passed (it asks a broker's remoting port; here is none)."""

    async def problem(self, master_addr: str) -> None:
        return None


def ha_stream_cost(megabytes: int, cert: str, key: str) -> dict:
    """The HA stream in this process, plain TCP then TLS (the broker's permissive mode):
    a master's HAService sends ``megabytes`` of commit log (1 KiB messages) to a fresh
    slave's HAClient on in-memory stores; MB/s and CPU seconds per 100 MB (both ends, the
    slave's dispatch included) for each."""
    import asyncio

    from tidemq.broker.ha import HAClient, HAService, HASettings
    from tidemq.remoting.loop import run
    from tidemq.remoting.tls import ServerTls, TlsMode, client_context, server_context
    from tidemq.store.config import StoreConfig
    from tidemq.store.interface import StoreMessage
    from tidemq.store.memory_store import MemoryMessageStore

    def new_store() -> MemoryMessageStore:
        return MemoryMessageStore(StoreConfig(mapped_file_size_commit_log=64 * 1024 * 1024))

    master = new_store()
    body = os.urandom(1024)
    batches = 0
    while master.commit_log_max_offset() < megabytes * 1024 * 1024:
        result = master.put_messages([StoreMessage("HaBench", batches % 4, body, {})] * 64)
        if not result.ok:
            raise RuntimeError(f"cannot fill the HA benchmark's master: {result.status}")
        batches += 1
    end = master.commit_log_max_offset()
    settings = HASettings(transfer_batch_size=1024 * 1024)
    tls = ServerTls(TlsMode.PERMISSIVE, server_context(cert, key))

    async def copy(client_tls: object) -> dict:
        service = HAService(master, "127.0.0.1", 0, settings, "bench", tls=tls)
        await service.start()
        slave = new_store()
        client = HAClient(slave, _NoCheck(), settings, service.address,  # type: ignore[arg-type]
                          "bench", tls=client_tls)  # type: ignore[arg-type]
        started, cpu = time.perf_counter(), time.process_time()
        client.start()
        try:
            while slave.commit_log_max_offset() < end:
                await asyncio.sleep(0.005)
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        finally:
            await client.stop()
            await service.stop()
        return {"mb_per_s": end / wall / 1e6, "cpu_s_per_100mb": cpu / (end / 1e8)}

    plain = run(copy(None))
    over_tls = run(copy(client_context(ca_file=cert)))
    return {"megabytes": end / 1e6, "plain": plain, "tls": over_tls,
            "cpu_ratio_tls_over_plain": plain["cpu_s_per_100mb"] / over_tls["cpu_s_per_100mb"]}


def one_round(args: argparse.Namespace, round_index: int, servers: dict[str, DevServer],
              cert: str, work_dir: str) -> dict:
    """One figure of each kind on the servers started once for the whole run, in an order
    that alternates from round to round (plain, TLS, ACL; then ACL, TLS, plain), so a
    drift of the machine's load does not favour one of them; the load average before each
    figure is kept beside it."""
    envs = {"produce_plain": {}, "produce_tls": {"TIDEMQ_TLS_CA_FILE": cert},
            "produce_acl": {"TIDEMQ_ACCESS_KEY": ACCESS_KEY, "TIDEMQ_SECRET_KEY": SECRET_KEY}}
    topics = {"produce_plain": "BenchPlain", "produce_tls": "BenchTls",
              "produce_acl": "BenchAcl"}
    server_of = {"produce_plain": servers["tls"], "produce_tls": servers["tls"],
                 "produce_acl": servers["acl"]}
    results: dict = {"calibration": {"send_request_decode_cpu_us": calibration_us()},
                     "acl_cost_per_request": signature_cost(args.size, work_dir)}
    order = FIGURES if round_index % 2 == 0 else tuple(reversed(FIGURES))
    for name in order:
        load = os.getloadavg()[0]
        results[name] = bench_produce(server_of[name], topics[name], args.messages, args.size,
                                      envs[name])
        results[name]["load_average"] = load
    results["order"] = list(order)
    plain = results["produce_plain"]["msgs_per_s"]
    results["ratio_acl_over_plain"] = results["produce_acl"]["msgs_per_s"] / plain
    results["ratio_tls_over_plain"] = results["produce_tls"]["msgs_per_s"] / plain
    # What the rates would be where the pipeline is CPU-bound (broker and client CPU per
    # message summed): steadier than the rates on a shared machine, whose scheduler hands
    # each figure a different share of the cores.
    plain_cpu = _cpu_us_per_msg(results["produce_plain"])
    results["cpu_ratio_acl_over_plain"] = plain_cpu / _cpu_us_per_msg(results["produce_acl"])
    results["cpu_ratio_tls_over_plain"] = plain_cpu / _cpu_us_per_msg(results["produce_tls"])
    return results


def _cpu_us_per_msg(figure: dict) -> float:
    return figure["broker_cpu_us_per_msg"] + figure["client_cpu_us_per_msg"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--ha-megabytes", type=int, default=200,
                        help="commit log the in-process HA stream figure copies per round")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    print(f"security_bench: {args.runs} runs, {args.messages} x {args.size} B per figure, "
          "batches of 64, 16 in flight; " + machine_description(), flush=True)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    runs = []
    work_dir = tempfile.mkdtemp(prefix="security-bench-", dir=args.dir)
    servers: dict[str, DevServer] = {}
    try:
        cert, key = make_certificate(work_dir)
        acl_file = os.path.join(work_dir, "plain_acl.yml")
        with open(acl_file, "w") as handle:
            handle.write(ACL_YAML)
        for name, extra in (
            ("tls", ["--tlsEnable", "true", "--tlsServerMode", "permissive",
                     "--tlsServerCertPath", cert, "--tlsServerKeyPath", key]),
            ("acl", ["--aclEnable", "true", "--aclFilePath", acl_file]),
        ):
            os.makedirs(os.path.join(work_dir, name))
            servers[name] = DevServer(os.path.join(work_dir, name), extra)
        for run in range(args.runs):
            runs.append(one_round(args, run, servers, cert, work_dir))
            report_round(runs[-1], run, args.json)
            runs[-1]["ha_stream"] = ha_stream_cost(args.ha_megabytes, cert, key)
            if not args.json:
                ha = runs[-1]["ha_stream"]
                print(f"  HA stream, {ha['megabytes']:.0f} MB in-process: plain "
                      f"{ha['plain']['mb_per_s']:.0f} MB/s ({ha['plain']['cpu_s_per_100mb']:.2f}"
                      f" CPU s per 100 MB), TLS {ha['tls']['mb_per_s']:.0f} MB/s "
                      f"({ha['tls']['cpu_s_per_100mb']:.2f}); CPU ratio "
                      f"{ha['cpu_ratio_tls_over_plain']:.3f}", flush=True)
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    summary = {
        name: statistics.median(r[name]["msgs_per_s"] for r in runs)
        for name in FIGURES
    } | {
        name: statistics.median(r[name] for r in runs)
        for name in ("ratio_acl_over_plain", "ratio_tls_over_plain",
                     "cpu_ratio_acl_over_plain", "cpu_ratio_tls_over_plain")
    }
    for name in ("sign_us", "verify_us"):
        summary[name] = statistics.median(r["acl_cost_per_request"][name] for r in runs)
    for mode in ("plain", "tls"):
        summary[f"ha_stream_{mode}_mb_per_s"] = statistics.median(
            r["ha_stream"][mode]["mb_per_s"] for r in runs)
    summary["ha_stream_cpu_ratio_tls_over_plain"] = statistics.median(
        r["ha_stream"]["cpu_ratio_tls_over_plain"] for r in runs)
    summary["load_average_at_end"] = os.getloadavg()
    if args.json:
        print(json.dumps({"runs": runs, "median": summary}))
    else:
        print("median: " + json.dumps(summary))
    return 0


def report_round(result: dict, run: int, as_json: bool) -> None:
    """One line per round (unless --json): each figure with its CPU and load average."""
    if not as_json:
        print(f"round {run + 1} ({', '.join(result['order'])}): calibration "
              f"{result['calibration']['send_request_decode_cpu_us']:.2f} us; " + "; ".join(
                  f"{name} {result[name]['msgs_per_s']:,.0f} msg/s "
                  f"({result[name]['broker_cpu_us_per_msg']:.1f} / "
                  f"{result[name]['client_cpu_us_per_msg']:.1f} us, load "
                  f"{result[name]['load_average']:.1f})"
                  for name in FIGURES)
                  + f"; acl/plain {result['ratio_acl_over_plain']:.3f} (CPU "
                  f"{result['cpu_ratio_acl_over_plain']:.3f}), tls/plain "
                  f"{result['ratio_tls_over_plain']:.3f} (CPU "
                  f"{result['cpu_ratio_tls_over_plain']:.3f}); ACL CPU per "
                  f"{result['acl_cost_per_request']['body_bytes']} B request: sign "
                  f"{result['acl_cost_per_request']['sign_us']:.1f} us, verify "
                  f"{result['acl_cost_per_request']['verify_us']:.1f} us", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
