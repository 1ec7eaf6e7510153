"""The console's pure pieces: body previews, charts, escaping, times, dev keys."""

from __future__ import annotations

import pytest

from tidemq.cli.dev_console import DevConsoleSettings, pop_console_settings
from tidemq.console.charts import sparkline
from tidemq.console.html import table, url
from tidemq.console.preview import PREVIEW_BYTES_MAX, preview_body
from tidemq.console.times import parse_time


def test_json_bodies_are_pretty_printed() -> None:
    preview = preview_body(b'{"a": 1, "b": [1, 2]}')
    assert preview.kind == "json"
    assert preview.text == '{\n  "a": 1,\n  "b": [\n    1,\n    2\n  ]\n}'


def test_text_and_binary_bodies() -> None:
    assert preview_body("héllo {not json".encode()).kind == "text"
    binary = preview_body(bytes(range(20)))
    assert binary.kind == "hex"
    assert binary.text.splitlines()[0].startswith("00000000  00 01 02")
    assert preview_body(b"\x00\x01abc").kind == "hex"  # control bytes are not text


def test_long_bodies_are_cut() -> None:
    preview = preview_body(b"x" * (PREVIEW_BYTES_MAX + 10))
    assert preview.truncated and len(preview.text) == PREVIEW_BYTES_MAX


def test_cells_are_escaped_unless_marked_raw() -> None:
    html = table(("a", "b"), [("<script>", "<b>x</b>")], raw_columns=frozenset({1}))
    assert "&lt;script&gt;" in html and "<b>x</b>" in html
    assert url("/topic", topic="%DLQ%g a", flash=None) == "/topic?topic=%25DLQ%25g%20a"


def test_sparkline_scales_to_the_largest_value() -> None:
    svg = sparkline("put", [0.0, 5.0, 10.0], chart_id="c")
    assert 'id="c"' in svg and "put: 10.0/s" in svg and "<polyline" in svg
    assert "no samples yet" in sparkline("put", [])


def test_times_are_read_as_now_ms_or_iso() -> None:
    assert parse_time("1764150000000") == 1764150000000
    assert parse_time("now") > 1764000000000
    assert parse_time("2026-11-26T12:00:00") > 0
    with pytest.raises(ValueError, match="is not a time"):
        parse_time("yesterday")


def test_dev_console_keys_leave_the_broker_overrides() -> None:
    overrides = {"consolePort": "0", "consoleWrite": "true", "flushDiskType": "SYNC_FLUSH"}
    assert pop_console_settings(overrides) == DevConsoleSettings(0, True)
    assert overrides == {"flushDiskType": "SYNC_FLUSH"}
    assert pop_console_settings({}) == DevConsoleSettings(8080, False)
    assert pop_console_settings({"consolePort": "off"}).port is None
    with pytest.raises(ValueError, match="consolePort"):
        pop_console_settings({"consolePort": "http"})
    with pytest.raises(ValueError, match="consoleWrite"):
        pop_console_settings({"consoleWrite": "yes"})
