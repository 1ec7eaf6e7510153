"""Client scenarios run with the third-party ``rocketmq`` 0.4.4 package (Apache C++ client 1.x).

Run by tests/interop as a subprocess, one scenario per process: the C++ client runs native
threads, so a crash or a hang in it can only take down this process, which the test kills by
PID when its time is up. Usage::

    python cpp_client_scenarios.py produce --namesrv 127.0.0.1:9876 --topic T --count 10 \
        --out result.json
    python cpp_client_scenarios.py consume --namesrv ... --topic T --group G --expect 10 \
        --out result.json [--expression "TagA || TagB"] [--orderly] [--broadcasting] \
        [--stop-file PATH] [--fail-below-reconsume N]
    python cpp_client_scenarios.py produce-orderly --namesrv ... --topic T --count 40 \
        --shards 8 --out result.json

Bodies, tags and keys are ASCII text: the C++ client's Python binding passes them as C
strings. Every scenario writes one JSON document to ``--out`` (written before the client is shut
down, so a hang in shutdown does not lose it), then prints ``SCENARIO DONE``. The document
always holds ``wire``: what the C++ client's own debug log says it sent and got back (request
codes and counts, every response that was not SUCCESS with its remark), so a failing test can
say what the server did wrong.

Exit status: 0 when the scenario reached its goal, 3 when it ran out of time (the document
says how far it got), 2 for a client error (its text is in ``error``).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from rocketmq.client import Message, Producer, PushConsumer, RecvMessage
from rocketmq.exceptions import ffi_check
from rocketmq.ffi import MSG_CALLBACK_FUNC, MessageModel, dll

LOG_LEVEL_DEBUG = 5  # the C++ client's debug level logs every request and response header
# Time a consumer keeps listening after it has everything it expects: a message delivered
# twice (a broker or rebalance bug) shows up as a duplicate instead of passing unseen.
SETTLE_S = 1.0

CONSUME_SUCCESS, RECONSUME_LATER = 0, 1  # the C API's consume statuses
# The C++ client signs an extra "OnsChannel" extField with this value (RocketMQ ignores it).
ACL_CHANNEL = "LOCAL"
callbacks_alive: list[Any] = []  # ctypes callbacks must outlive their registration

_REQUEST_CODE = re.compile(r"processResponseCommand, code:(\d+)")
_RESPONSE = re.compile(r"\(debug\):code:(-?\d+), remark:\S+, version:\d+, opaque:\d+, "
                       r"flag:(\d+), remark:(.*?), headLen")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=["produce", "produce-orderly", "consume"])
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--group", default="cpp_interop_group")
    parser.add_argument("--count", type=int, default=10, help="messages to produce")
    parser.add_argument("--batch", type=int, default=0, help="then one batch of this many")
    parser.add_argument("--shards", type=int, default=4, help="sharding keys (orderly)")
    parser.add_argument("--expect", type=int, default=0, help="messages to receive")
    parser.add_argument("--expression", default="*")
    parser.add_argument("--orderly", action="store_true")
    parser.add_argument("--broadcasting", action="store_true", help="BROADCASTING model")
    parser.add_argument("--stop-file", type=Path, help="consume until this file exists")
    parser.add_argument("--fail-below-reconsume", type=int, default=0,
                        help="answer RECONSUME_LATER while a message's reconsume times are lower")
    parser.add_argument("--timeout-s", type=float, default=60.0)
    parser.add_argument("--access-key", help="sign requests (ACL) with these credentials")
    parser.add_argument("--secret-key")
    args = parser.parse_args(argv)

    result: dict[str, Any] = {"scenario": args.scenario}
    started = time.monotonic()
    client = None
    status = 0
    try:
        if args.scenario == "consume":
            client, reached = consume(args, result)
        else:
            client, reached = produce(args, result)
        status = 0 if reached else 3
    except Exception as e:  # the C++ client raises its own exception classes
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc()
        status = 2
    result["elapsed_s"] = round(time.monotonic() - started, 3)
    result["wire"] = wire_summary()
    args.out.write_text(json.dumps(result, indent=1))
    print("SCENARIO DONE", status, flush=True)
    if client is not None:
        client.shutdown()
    # Skip interpreter teardown: the binding's __del__ would shut the client down again from
    # the garbage collector, which the C++ 1.x client does not always survive.
    sys.stdout.flush()
    os._exit(status)


def new_producer(args: argparse.Namespace, group: str) -> Producer:
    producer = Producer(group)
    dll.SetProducerLogLevel(producer._handle, LOG_LEVEL_DEBUG)
    producer.set_namesrv_addr(args.namesrv)
    if args.access_key:
        producer.set_session_credentials(args.access_key, args.secret_key, ACL_CHANNEL)
    return producer


def make_message(topic: str, body: str, tags: str | None, keys: str | None) -> Message:
    message = Message(topic)
    message.set_body(body)
    if tags:
        message.set_tags(tags)
    if keys:
        message.set_keys(keys)
    return message


def produce(args: argparse.Namespace, result: dict[str, Any]) -> tuple[Producer, bool]:
    """Sync sends (``produce``) or sends by sharding key (``produce-orderly``), then a batch.

    Message i has body ``body-i`` (orderly: ``<shard>:<i>``), tag ``TagA``/``TagB`` alternating
    and key ``key-i``; result["sends"] lists ``{index, status, msg_id, offset}``.
    """
    producer = new_producer(args, args.group)
    producer.start()
    sends = result["sends"] = []
    deadline = time.monotonic() + args.timeout_s
    for index in range(args.count):
        if time.monotonic() > deadline:
            return producer, False
        tags = "TagA" if index % 2 == 0 else "TagB"
        if args.scenario == "produce-orderly":
            shard = index % args.shards
            message = make_message(args.topic, f"{shard}:{index}", tags, f"key-{index}")
            sent = producer.send_orderly(message, shard)
        else:
            message = make_message(args.topic, f"body-{index}", tags, f"key-{index}")
            sent = producer.send_sync(message)
        sends.append({"index": index, "status": int(sent.status), "msg_id": sent.msg_id,
                      "offset": sent.offset})
    if args.batch:
        batch = [make_message(args.topic, f"batch-{i}", "TagBatch", f"batch-key-{i}")
                 for i in range(args.batch)]
        sent = producer.send_batch(batch)
        result["batch"] = {"status": int(sent.status), "msg_id": sent.msg_id,
                           "offset": sent.offset}
    return producer, True


def consume(args: argparse.Namespace, result: dict[str, Any]) -> tuple[PushConsumer, bool]:
    """Push-consume until ``--expect`` messages arrived, or until ``--stop-file`` exists
    (then SETTLE_S more), or time is up. Prints ``RECEIVED <count>`` as the count grows.

    result["received"] lists ``{topic, body, tags, keys, msg_id, queue_id, queue_offset,
    reconsume_times, seq}`` (``seq``: the user property of that name, "" when absent) in the
    order the listener saw them (per thread; an orderly consumer consumes one queue on one
    thread at a time, so a queue's messages are in order).

    With ``--fail-below-reconsume N`` the listener answers RECONSUME_LATER to every delivery
    whose reconsume times are below N (the C++ client then hands the message back to the
    broker, CONSUMER_SEND_MSG_BACK, for a later retry); those deliveries are listed in
    result["failed"] and do not count as received.
    """
    model = MessageModel.BROADCASTING if args.broadcasting else MessageModel.CLUSTERING
    consumer = PushConsumer(args.group, orderly=args.orderly, message_model=model)
    dll.SetPushConsumerLogLevel(consumer._handle, LOG_LEVEL_DEBUG)
    consumer.set_namesrv_addr(args.namesrv)
    if args.access_key:
        consumer.set_session_credentials(args.access_key, args.secret_key, ACL_CHANNEL)
    received: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    lock = threading.Lock()

    def on_message(_consumer: int, handle: int) -> int:
        message = RecvMessage(handle)
        record = {
            "topic": message.topic,
            "body": message.body.decode(),
            "tags": (message.tags or b"").decode(),
            "keys": (message.keys or b"").decode(),
            "msg_id": message.id,
            "queue_id": message.queue_id,
            "queue_offset": message.queue_offset,
            "reconsume_times": message.reconsume_times,
            "seq": (message.get_property("seq") or b"").decode(),  # a user property
        }
        later = record["reconsume_times"] < args.fail_below_reconsume
        with lock:
            (failed if later else received).append(record)
        return RECONSUME_LATER if later else CONSUME_SUCCESS

    # Registered through the binding's C entry points rather than PushConsumer.subscribe:
    # its wrapper signals RECONSUME_LATER by raising out of a ctypes callback, which makes the
    # status the C++ client sees undefined.
    callback = MSG_CALLBACK_FUNC(on_message)
    callbacks_alive.append(callback)  # the C++ client calls it for as long as the process lives
    ffi_check(dll.Subscribe(consumer._handle, args.topic.encode(), args.expression.encode()))
    register = (dll.RegisterMessageCallbackOrderly if args.orderly
                else dll.RegisterMessageCallback)
    ffi_check(register(consumer._handle, callback))
    consumer.start()
    print("CONSUMER STARTED", flush=True)
    allocation = AllocationWatcher(args.topic)
    deadline = time.monotonic() + args.timeout_s
    reached = False
    reported = 0
    while time.monotonic() < deadline:
        allocation.report_changes()
        with lock:
            count = len(received)
        if count != reported:
            print(f"RECEIVED {count}", flush=True)
            reported = count
        if args.stop_file is not None and args.stop_file.exists():
            reached = True
            break
        if args.stop_file is None and count >= args.expect:
            reached = True
            break
        time.sleep(0.05)
    if reached:
        time.sleep(SETTLE_S)
    with lock:
        result["received"] = list(received)
        result["failed"] = list(failed)
    return consumer, reached


class AllocationWatcher:
    """Prints ``ALLOCATION <topic> <queue ids>`` whenever the set of the topic's queues this
    consumer pulls changes, so a test can wait until a group's members have split the queues
    (or, broadcasting, each took all). Read from the C++ client's debug log: a rebalance adds
    queues ("add mq:...", "after resume the pull handle ... mq is:...", logged once the
    starting offset is known) and drops them ("drop mq:..."); the set is published when the
    round ends ("updateRequestTableInRebalance exit")."""

    def __init__(self, topic: str):
        self.topic = topic
        self.read_bytes = 0
        self.queues: set[int] = set()
        self.published: set[int] | None = None
        queue = (r"MessageQueue \[topic=" + re.escape(topic)
                 + r", brokerName=[^,]*, queueId=(\d+)\]")
        self.added = re.compile(r"(?:add mq:|after resume the pull handle.*mq is:)" + queue)
        self.dropped = re.compile(r"drop mq:" + queue)

    def report_changes(self) -> None:
        paths = log_paths()
        if not paths:
            return
        with open(paths[0], "rb") as log:
            log.seek(self.read_bytes)
            data = log.read()
        complete = data.rfind(b"\n") + 1  # a line still being written waits for next time
        self.read_bytes += complete
        for line in data[:complete].decode(errors="replace").splitlines():
            if match := self.added.search(line):
                self.queues.add(int(match.group(1)))
            elif match := self.dropped.search(line):
                self.queues.discard(int(match.group(1)))
            elif "updateRequestTableInRebalance exit" in line and self.queues != self.published:
                self.published = set(self.queues)
                print(f"ALLOCATION {self.topic} {','.join(map(str, sorted(self.queues)))}",
                      flush=True)


def log_paths() -> list[str]:
    home = Path(os.environ.get("HOME", "."))
    return sorted(glob.glob(str(home / "logs" / "rocketmq-cpp" /
                                f"{os.getpid()}_rocketmq-cpp.log*")))


def wire_summary() -> dict[str, Any]:
    """What this process's C++ client logged: request codes it sent, responses that were not
    SUCCESS (with their remarks; PULL_NOT_FOUND 19 is normal), requests the server sent it."""
    request_codes: collections.Counter[int] = collections.Counter()
    failures: collections.Counter[str] = collections.Counter()
    server_requests: collections.Counter[int] = collections.Counter()
    errors: list[str] = []
    for path in log_paths():
        with open(path, errors="replace") as log:
            for line in log:
                match = _REQUEST_CODE.search(line)
                if match:
                    request_codes[int(match.group(1))] += 1
                    continue
                match = _RESPONSE.search(line)
                if match and not int(match.group(2)) & 1:  # a request from the server
                    server_requests[int(match.group(1))] += 1
                elif match and match.group(1) != "0":
                    failures[f"code {match.group(1)}: {match.group(3)[:200]}"] += 1
                elif "(error)" in line and "session_credentials" not in line:
                    errors.append(line.strip()[:300])
    return {
        "request_codes": {str(code): count for code, count in sorted(request_codes.items())},
        "non_success_responses": dict(failures),
        "server_requests": {str(code): count for code, count in sorted(server_requests.items())},
        "client_errors": errors[-20:],
    }


if __name__ == "__main__":
    main(sys.argv[1:])
