"""Small inline SVG line charts of the console's live metrics (no script, no library)."""

from __future__ import annotations

from collections.abc import Sequence

from tidemq.console.html import escape

CHART_WIDTH = 240
CHART_HEIGHT = 60


def sparkline(title: str, values: Sequence[float], *, unit: str = "/s",
              chart_id: str = "") -> str:
    """An SVG chart of ``values`` (oldest first) with its title and latest value.

    An empty series draws an empty frame that says so; a flat series a flat line.
    """
    latest = f"{values[-1]:,.1f}{unit}" if values else "no samples yet"
    label = f"{title}: {latest}"
    attributes = f' id="{escape(chart_id)}"' if chart_id else ""
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{CHART_WIDTH}" '
            f'height="{CHART_HEIGHT + 16}" role="img" aria-label="{escape(label)}"'
            f'{attributes}><text x="4" y="12" font-size="11">{escape(label)}</text>')
    if len(values) < 2:
        return head + "</svg>"
    top = max(values) or 1.0
    step = CHART_WIDTH / (len(values) - 1)
    points = " ".join(
        f"{index * step:.1f},{16 + CHART_HEIGHT - (value / top) * (CHART_HEIGHT - 4):.1f}"
        for index, value in enumerate(values)
    )
    return (head + f'<polyline fill="none" stroke="#1d3557" stroke-width="1.5" '
            f'points="{points}"/></svg>')
