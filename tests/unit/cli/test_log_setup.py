"""The servers' log lines: one per event, tracebacks folded in."""

from __future__ import annotations

import logging

from tidemq.cli.log_setup import LOG_FORMAT, OneLineFormatter


def test_a_traceback_and_line_breaks_stay_on_the_event_line():
    formatter = OneLineFormatter(LOG_FORMAT)
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        record = logging.LogRecord("tidemq.x", logging.ERROR, __file__, 1, "failed:\n%s",
                                   ("two lines",), exc_info=__import__("sys").exc_info())
    line = formatter.format(record)
    assert "\n" not in line
    assert "failed: | two lines | Traceback" in line and "ValueError: bad | value" in line
