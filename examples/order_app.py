"""An application that writes order events to a tidemq topic (input of order_daily_report.py).

    python examples/order_app.py [--namesrv 127.0.0.1:9876] [--topic OrderEvents]
                                 [--orders 2000]

Each order goes through ``created`` then ``paid`` (most) and sometimes ``refunded``; each
event is one message, JSON body, the order id as key and the event type as tag::

    {"order_id": "o-000042", "customer": "c-017", "event": "paid", "amount": 37.5,
     "currency": "EUR", "ts": "2024-05-01T12:00:03.250Z"}

Events of one order are sent with the order id as sharding key, so they stay in order on one
queue.
"""

from __future__ import annotations

import argparse
import json
import random
from datetime import UTC, datetime

from tidemq.sync import Admin, Message, Producer


def order_events(orders: int, seed: int) -> list[dict[str, object]]:
    """The events to write, in the order they happen per order."""
    rng = random.Random(seed)
    events: list[dict[str, object]] = []
    for number in range(orders):
        order = {"order_id": f"o-{number:06d}", "customer": f"c-{rng.randint(1, 60):03d}",
                 "amount": round(rng.uniform(5, 250), 2), "currency": "EUR"}
        kinds = ["created"]
        if rng.random() < 0.9:
            kinds.append("paid")
            if rng.random() < 0.07:
                kinds.append("refunded")
        for kind in kinds:
            events.append({**order, "event": kind,
                           "ts": datetime.now(UTC).isoformat(timespec="milliseconds")})
    return events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namesrv", default="127.0.0.1:9876")
    parser.add_argument("--topic", default="OrderEvents")
    parser.add_argument("--orders", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    with Admin(args.namesrv) as admin:
        admin.create_topic(args.topic, 4)
    events = order_events(args.orders, args.seed)
    with Producer("order_app", args.namesrv) as producer:
        for event in events:  # one by one: an order's events must arrive in order
            producer.send(Message(args.topic, json.dumps(event), tags=str(event["event"]),
                                  keys=str(event["order_id"])),
                          sharding_key=str(event["order_id"]))
    print(f"wrote {len(events)} events of {args.orders} orders to topic {args.topic} at "
          f"{args.namesrv}")


if __name__ == "__main__":
    main()
