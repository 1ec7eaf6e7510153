"""An application that writes JSON log lines to a tidemq topic (input of log_error_counts.py).

    python examples/log_app.py [--namesrv 127.0.0.1:9876] [--topic AppLogs] [--minutes 10]
                               [--lines-per-second 20]

It writes ``--minutes`` minutes of log lines, their event times spread evenly from that long
ago up to now (a fast backfill, so a streaming query has closed windows to report at once),
one JSON object per message::

    {"ts": "2024-05-01T12:00:03.250Z", "service": "checkout", "level": "ERROR",
     "message": "payment gateway timed out", "host": "web-2"}

The service is the message key (``keys``), the level its tag (``tags``).
"""

from __future__ import annotations

import argparse
import json
import random
from datetime import UTC, datetime, timedelta

from tidemq.sync import Admin, Message, Producer

SERVICES = ("checkout", "search", "auth", "inventory")
LEVELS = (("INFO", 0.80), ("WARN", 0.12), ("ERROR", 0.08))
MESSAGES = {
    "INFO": ["request served", "cache refreshed", "user signed in"],
    "WARN": ["slow response", "retrying upstream call"],
    "ERROR": ["payment gateway timed out", "database connection refused", "unexpected null"],
}
SEND_BATCH = 200


def log_lines(minutes: int, per_second: int, seed: int) -> list[dict[str, str]]:
    """The log lines to write, oldest first."""
    rng = random.Random(seed)
    now = datetime.now(UTC)
    count = minutes * 60 * per_second
    lines = []
    for index in range(count):
        at = now - timedelta(minutes=minutes) + timedelta(seconds=index / per_second)
        level = rng.choices([name for name, _ in LEVELS], [w for _, w in LEVELS])[0]
        lines.append({
            "ts": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "service": rng.choice(SERVICES),
            "level": level,
            "message": rng.choice(MESSAGES[level]),
            "host": f"web-{rng.randint(1, 3)}",
        })
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namesrv", default="127.0.0.1:9876")
    parser.add_argument("--topic", default="AppLogs")
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--lines-per-second", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    with Admin(args.namesrv) as admin:
        admin.create_topic(args.topic, 4)
    lines = log_lines(args.minutes, args.lines_per_second, args.seed)
    with Producer("log_app", args.namesrv) as producer:
        for first in range(0, len(lines), SEND_BATCH):
            producer.send_batch([
                Message(args.topic, json.dumps(line), tags=line["level"], keys=line["service"])
                for line in lines[first:first + SEND_BATCH]
            ])
    errors = sum(1 for line in lines if line["level"] == "ERROR")
    print(f"wrote {len(lines)} log lines ({errors} errors) to topic {args.topic} at "
          f"{args.namesrv}, event times {lines[0]['ts']} .. {lines[-1]['ts']}")


if __name__ == "__main__":
    main()
