"""``tidemq bench produce|consume``: a load generator a user can point at any cluster.

produce: ``--concurrency`` workers each send in a loop — single messages (``--batch 0``) or
batches of ``--batch`` messages — of ``--size`` random-looking bytes, until ``--count``
messages or ``--seconds`` have passed (one of them bounds the run; both may be given). The
latency of each request is recorded; the summary gives msg/s, MB/s and latency p50/p99/p999
per request, and the CPU seconds the client itself spent meanwhile (``cpu_s``: a harness
reads the cost per request from it, without the start-up of the process).

consume: a PullConsumer reads every queue of the topic (from the first or the last offset)
until ``--count`` messages or ``--seconds``, timed from the start of consumption (the
queues assigned and sought, once the route is known) to the last message; the summary gives
msg/s, MB/s, the seconds to the first message and, with
``--latency``, end-to-end latency of each message (clocks of producer and consumer hosts
must agree for that to mean anything). Single messages sent by ``bench produce`` carry their
send time in nanoseconds (the ``BENCH_SENT_NS`` property), which ``--latency`` uses; for
other messages it falls back to the born timestamp, whose millisecond resolution adds about
half a millisecond to every figure.

``--json`` prints the summary as one JSON line (for benchmarks/ and scripts) instead of the
table. The parameters and the machine are part of the summary, so a result file says what
it measured.
"""

from __future__ import annotations

import asyncio
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import click
import orjson
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tidemq.cli.client_security import (
    client_security,
    client_security_options,
    current_client_security,
)
from tidemq.client.message import Message
from tidemq.client.producer import Producer, default_namesrv
from tidemq.client.pull_consumer import PULL_BATCH_SIZE, PullConsumer
from tidemq.errors import TidemqError
from tidemq.remoting.loop import run as run_on_loop

_console = Console(stderr=True)
PROGRESS_REFRESH_S = 0.2
# Send time in nanoseconds of a single message from ``bench produce`` (consume --latency).
SENT_NS_PROPERTY = "BENCH_SENT_NS"


@dataclass
class Summary:
    """What a bench run measured."""

    mode: str
    topic: str
    size: int
    batch: int
    concurrency: int
    messages: int = 0
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    msgs_per_s: float = 0.0
    mb_per_s: float = 0.0
    latency_ms_p50: float | None = None
    latency_ms_p99: float | None = None
    latency_ms_p999: float | None = None
    first_error: str | None = None
    # with --trace: trace records written / failed / dropped (counted after close)
    trace_records: dict[str, int] | None = None
    # CPU seconds (user + system, all threads) this process spent over ``seconds`` (produce
    # and consume), so a harness can tell client CPU per message without counting start-up
    cpu_s: float | None = None
    # consume: seconds from the start of consumption to the first messages polled (None
    # when none came), beside ``seconds``, which runs to the last
    first_message_s: float | None = None
    machine: dict[str, object] = field(default_factory=lambda: {
        "python": platform.python_version(), "platform": platform.platform(),
        "cpus": os.cpu_count(),
    })


def percentile(sorted_values: list[float], fraction: float) -> float | None:
    """The value at ``fraction`` (0..1) of an ascending list (nearest rank); None if empty."""
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, round(fraction * len(sorted_values)) - 1))
    return sorted_values[index]


def _finish(summary: Summary, latencies_ms: list[float], bytes_total: int) -> Summary:
    latencies_ms.sort()
    summary.msgs_per_s = summary.messages / summary.seconds if summary.seconds else 0.0
    summary.mb_per_s = bytes_total / summary.seconds / 1_000_000 if summary.seconds else 0.0
    summary.latency_ms_p50 = percentile(latencies_ms, 0.50)
    summary.latency_ms_p99 = percentile(latencies_ms, 0.99)
    summary.latency_ms_p999 = percentile(latencies_ms, 0.999)
    return summary


def _check_bounds(count: int | None, seconds: float | None) -> None:
    if count is None and seconds is None:
        raise click.UsageError("give --count or --seconds (or both) so the run ends")
    if count is not None and count < 1:
        raise click.UsageError("--count must be at least 1")
    if seconds is not None and seconds <= 0:
        raise click.UsageError("--seconds must be positive")


class _Progress:
    """A rich progress bar fed from counters by a periodic task (not per message)."""

    def __init__(self, enabled: bool, count: int | None, seconds: float | None, label: str):
        self.enabled = enabled
        self.count = count
        self.seconds = seconds
        self.label = label

    async def follow(self, started: float, done: list[int]) -> None:
        if not self.enabled:
            return
        total = float(self.count) if self.count is not None else float(self.seconds or 1)
        with Progress(TextColumn(f"[bold]{self.label}"), BarColumn(),
                      TextColumn("{task.fields[messages]} msgs {task.fields[rate]} msg/s"),
                      TimeElapsedColumn(), console=_console, transient=True) as progress:
            task = progress.add_task(self.label, total=total, messages=0, rate=0)
            while True:
                elapsed = time.perf_counter() - started
                value = float(done[0]) if self.count is not None else elapsed
                progress.update(task, completed=min(value, total), messages=done[0],
                                rate=int(done[0] / elapsed) if elapsed > 0 else 0)
                await asyncio.sleep(PROGRESS_REFRESH_S)


async def run_produce(namesrv: str, topic: str, size: int, batch: int, concurrency: int,
                      count: int | None, seconds: float | None, group: str,
                      show_progress: bool, rate: float | None = None,
                      trace: bool = False) -> Summary:
    """Run the produce benchmark and return its summary (see the module docstring).

    With ``rate`` (messages per second) requests are paced to that rate over all workers
    instead of sent as fast as possible: the way to measure latency at a given load. With
    ``trace`` the producer writes message traces (and the summary says how many records
    were written, failed or dropped, counted after the producer closed).
    """
    summary = Summary("produce", topic, size, batch, concurrency)
    body = (os.urandom(64) * (size // 64 + 1))[:size]
    latencies_ms: list[float] = []
    done = [0]  # messages acknowledged
    claimed = [0]  # messages handed to workers (bounds --count exactly)
    per_request = max(1, batch)
    security = current_client_security()
    producer = Producer(group, namesrv, enable_msg_trace=trace,
                        credentials=security.credentials, tls=security.tls)
    async with producer:
        # Warm-up: the first send learns the route (auto-creating the topic if allowed).
        await producer.send(Message(topic, body))
        started = time.perf_counter()
        cpu_started = time.process_time()
        deadline = started + seconds if seconds is not None else None

        interval_s = per_request / rate if rate else 0.0
        next_slot = [started]

        async def worker() -> None:
            while True:
                if deadline is not None and time.perf_counter() >= deadline:
                    return
                if interval_s:
                    # Each request takes the next slot of a fixed schedule, so a slow reply
                    # does not lower the offered load (no coordinated omission).
                    slot = next_slot[0]
                    next_slot[0] += interval_s
                    delay = slot - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                take = per_request
                if count is not None:
                    take = min(per_request, count - claimed[0])
                    if take <= 0:
                        return
                claimed[0] += take
                request_started = time.perf_counter()
                try:
                    if batch:
                        await producer.send_batch([Message(topic, body) for _ in range(take)])
                    else:
                        await producer.send(Message(
                            topic, body, properties={SENT_NS_PROPERTY: str(time.time_ns())}))
                except TidemqError as e:
                    summary.errors += 1
                    if summary.first_error is None:
                        summary.first_error = str(e)
                    continue
                latencies_ms.append((time.perf_counter() - request_started) * 1000)
                summary.requests += 1
                done[0] += take

        follower = asyncio.ensure_future(
            _Progress(show_progress, count, seconds, "produce").follow(started, done))
        try:
            await asyncio.gather(*(worker() for _ in range(concurrency)))
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
        summary.seconds = time.perf_counter() - started
        summary.cpu_s = time.process_time() - cpu_started
    summary.messages = done[0]
    if producer.tracer is not None:
        dispatcher = producer.tracer.dispatcher
        summary.trace_records = {"written": dispatcher.sent, "failed": dispatcher.failed,
                                 "dropped": dispatcher.dropped, "retried": dispatcher.retried}
    return _finish(summary, latencies_ms, done[0] * size)


async def run_consume(namesrv: str, topic: str, group: str, from_where: str,
                      count: int | None, seconds: float | None, latency: bool,
                      show_progress: bool, pull_batch_size: int = PULL_BATCH_SIZE) -> Summary:
    """Run the consume benchmark and return its summary (see the module docstring)."""
    summary = Summary("consume", topic, 0, 0, 1)
    latencies_ms: list[float] = []
    done = [0]
    bytes_total = 0
    security = current_client_security()
    async with PullConsumer(group, namesrv, consume_from=from_where, auto_commit=False,
                            pull_batch_size=pull_batch_size,
                            credentials=security.credentials, tls=security.tls) as consumer:
        queues = await consumer.queues(topic)  # the route: set-up, as produce's warm-up
        # The clock starts before the queues are assigned: the consumer starts fetching
        # then, in the background, and seeking takes round trips meanwhile. Started after
        # the seek, it missed the messages already fetched, and a small --count (all of it
        # fetched by then) read as an absurd rate.
        started = time.perf_counter()
        cpu_started = time.process_time()
        consumer.assign(queues)
        if from_where.upper() == "FIRST":
            await consumer.seek_to_beginning()
        else:
            await consumer.seek_to_end()
        deadline = started + seconds if seconds is not None else None
        follower = asyncio.ensure_future(
            _Progress(show_progress, count, seconds, "consume").follow(started, done))
        try:
            while True:
                now = time.perf_counter()
                if deadline is not None and now >= deadline:
                    break
                if count is not None and done[0] >= count:
                    break
                wait_ms = 200 if deadline is None else max(1, int((deadline - now) * 1000))
                messages = await consumer.poll(min(wait_ms, 200))
                if count is not None:
                    # A poll hands over whole fetched batches: the messages past --count are
                    # not counted (nor their bytes or latencies), so the run reports the
                    # count it was asked for, as produce does.
                    messages = messages[:count - done[0]]
                if not messages:
                    continue
                if summary.first_message_s is None:
                    summary.first_message_s = time.perf_counter() - started
                if latency:
                    latencies_ms.extend(_latencies_ms(messages, time.time_ns()))
                done[0] += len(messages)
                bytes_total += sum(len(m.body) for m in messages)
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
        summary.seconds = time.perf_counter() - started
        summary.cpu_s = time.process_time() - cpu_started
    summary.messages = done[0]
    summary.size = bytes_total // done[0] if done[0] else 0
    return _finish(summary, latencies_ms, bytes_total)


def _latencies_ms(messages: list, now_ns: int) -> list[float]:
    """Milliseconds from each message's send (``SENT_NS_PROPERTY``, else its born
    timestamp) to ``now_ns``."""
    out = []
    for message in messages:
        sent_ns = message.properties.get(SENT_NS_PROPERTY)
        if sent_ns is not None and sent_ns.isdigit():
            out.append((now_ns - int(sent_ns)) / 1e6)
        else:
            out.append((now_ns - message.born_timestamp * 1_000_000) / 1e6)
    return out


def _report(summary: Summary, as_json: bool) -> None:
    if as_json:
        click.echo(orjson.dumps(asdict(summary)).decode())
        return
    table = Table(title=f"tidemq bench {summary.mode}")
    table.add_column("metric")
    table.add_column("value", justify="right")

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} ms"

    rows = [
        ("topic", summary.topic),
        ("message size", f"{summary.size} B"),
        ("batch", str(summary.batch) if summary.mode == "produce" else "-"),
        ("concurrency", str(summary.concurrency)),
        ("messages", str(summary.messages)),
        ("requests", str(summary.requests) if summary.mode == "produce" else "-"),
        ("errors", str(summary.errors)),
        ("seconds", f"{summary.seconds:.2f}"),
        ("msg/s", f"{summary.msgs_per_s:,.0f}"),
        ("MB/s", f"{summary.mb_per_s:.2f}"),
        ("latency p50", ms(summary.latency_ms_p50)),
        ("latency p99", ms(summary.latency_ms_p99)),
        ("latency p999", ms(summary.latency_ms_p999)),
    ]
    if summary.first_message_s is not None:
        rows.append(("first message after", f"{summary.first_message_s:.2f} s"))
    if summary.cpu_s is not None:
        rows.append(("client CPU", f"{summary.cpu_s:.2f} s"))
    if summary.trace_records is not None:
        rows.append(("trace records", ", ".join(
            f"{value:,} {name}" for name, value in summary.trace_records.items())))
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)
    if summary.first_error:
        click.echo(f"first error: {summary.first_error}", err=True)


@click.group()
@client_security_options
@click.pass_context
def bench(ctx: click.Context, **security: Any) -> None:
    """Load generators: produce to or consume from a topic and report throughput.

    Against servers with ACL or TLS on, give --accessKey/--secretKey and --tls/--tlsCaFile
    before the verb (or the TIDEMQ_* environment variables).
    """
    ctx.obj = client_security(**security)


@bench.command("produce")
@click.option("-n", "--namesrv", default=default_namesrv, show_default="$NAMESRV_ADDR or "
              "127.0.0.1:9876")
@click.option("-t", "--topic", default="BenchmarkTest", show_default=True)
@click.option("-s", "--size", type=click.IntRange(1), default=1024, show_default=True,
              help="Message body bytes.")
@click.option("-b", "--batch", type=click.IntRange(0), default=64, show_default=True,
              help="Messages per batch request; 0 sends single messages.")
@click.option("-c", "--concurrency", type=click.IntRange(1), default=16, show_default=True,
              help="Requests in flight.")
@click.option("--count", type=int, help="Stop after this many messages.")
@click.option("--seconds", type=float, help="Stop after this many seconds.")
@click.option("-g", "--group", default="BENCH_PRODUCER", show_default=True)
@click.option("--rate", type=click.FloatRange(min=0, min_open=True),
              help="Offer this many messages per second instead of as many as possible.")
@click.option("--trace", is_flag=True,
              help="Write message traces to RMQ_SYS_TRACE_TOPIC (enable_msg_trace).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON line.")
def produce(namesrv: str, topic: str, size: int, batch: int, concurrency: int,
            count: int | None, seconds: float | None, group: str, rate: float | None,
            trace: bool, as_json: bool) -> None:
    """Send messages as fast as the cluster takes them (or at --rate)."""
    _check_bounds(count, seconds)
    try:
        summary = run_on_loop(run_produce(namesrv, topic, size, batch, concurrency, count,
                                          seconds, group, not as_json, rate, trace))
    except (TidemqError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    _report(summary, as_json)


@bench.command("consume")
@click.option("-n", "--namesrv", default=default_namesrv, show_default="$NAMESRV_ADDR or "
              "127.0.0.1:9876")
@click.option("-t", "--topic", default="BenchmarkTest", show_default=True)
@click.option("-g", "--group", default="BENCH_CONSUMER", show_default=True)
@click.option("--from", "from_where", type=click.Choice(["first", "last"],
              case_sensitive=False), default="first", show_default=True)
@click.option("--count", type=int, help="Stop after this many messages.")
@click.option("--seconds", type=float, help="Stop after this many seconds.")
@click.option("--latency", is_flag=True, help="Report end-to-end latency from born time.")
@click.option("--pull-batch-size", type=click.IntRange(1, 1024), default=PULL_BATCH_SIZE,
              show_default=True, help="Messages asked for per pull request (pull_batch_size).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON line.")
def consume(namesrv: str, topic: str, group: str, from_where: str, count: int | None,
            seconds: float | None, latency: bool, pull_batch_size: int, as_json: bool) -> None:
    """Pull messages from every queue of a topic as fast as possible."""
    _check_bounds(count, seconds)
    try:
        summary = run_on_loop(run_consume(namesrv, topic, group, from_where, count, seconds,
                                          latency, not as_json, pull_batch_size))
    except (TidemqError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    _report(summary, as_json)
