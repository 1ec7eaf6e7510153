"""Times as the console shows and reads them (local time, like ``tidemq admin``)."""

from __future__ import annotations

import datetime
import time


def format_ms(timestamp_ms: int) -> str:
    """``2026-11-26 12:00:00`` for ms since the epoch; ``-`` for 0 or less (never)."""
    if timestamp_ms <= 0:
        return "-"
    moment = datetime.datetime.fromtimestamp(timestamp_ms / 1000)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def parse_time(text: str) -> int:
    """ms since the epoch from ``now`` (or empty), digits (ms) or an ISO local time.

    Raises:
        ValueError: none of these, naming what is accepted.
    """
    text = text.strip()
    if text in ("", "now"):
        return int(time.time() * 1000)
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        return int(datetime.datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise ValueError(f"{text!r} is not a time: use 'now', ms since the epoch, or "
                         "2026-11-26T12:00:00") from None
