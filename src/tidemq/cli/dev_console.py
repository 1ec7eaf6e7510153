"""The web console inside ``tidemq dev``: its two keys and its start.

``--consolePort N`` (default 8080; ``0`` any free port; ``off`` no console) and
``--consoleWrite true`` (write actions; read-only by default). When the port is taken the
console takes a free one instead (the line ``tidemq dev`` prints says which); when aiohttp
is missing (no ``console`` extra) dev runs without a console and says how to get one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("tidemq.console")

CONSOLE_PORT_KEY = "consolePort"
CONSOLE_WRITE_KEY = "consoleWrite"
CONSOLE_PORT_DEFAULT = 8080


@dataclass(frozen=True, slots=True)
class DevConsoleSettings:
    port: int | None  # None: no console
    write_enabled: bool


def pop_console_settings(overrides: dict[str, str]) -> DevConsoleSettings:
    """Take the console keys out of ``overrides`` (the broker does not know them).

    Raises:
        ValueError: a bad value, naming the key and what is allowed.
    """
    port_text = overrides.pop(CONSOLE_PORT_KEY, str(CONSOLE_PORT_DEFAULT)).strip()
    write_text = overrides.pop(CONSOLE_WRITE_KEY, "false").strip().lower()
    if write_text not in ("true", "false"):
        raise ValueError(f"--{CONSOLE_WRITE_KEY} {write_text!r}: use true or false")
    if port_text.lower() == "off":
        return DevConsoleSettings(None, write_text == "true")
    if not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"--{CONSOLE_PORT_KEY} {port_text!r}: use a port 0-65535 "
                         "(0 = any free port) or off")
    return DevConsoleSettings(int(port_text), write_text == "true")


async def start_dev_console(settings: DevConsoleSettings, namesrv: str) -> Any | None:
    """Start the console on ``settings.port`` (a free port if that one is taken); None
    when there is to be no console or aiohttp is missing (logged)."""
    if settings.port is None:
        return None
    try:
        from tidemq.console.server import ConsoleServer
    except ImportError as e:
        log.warning("no web console: it needs aiohttp (%s); pip install 'tidemq[console]'", e)
        return None
    server = ConsoleServer(namesrv, port=settings.port, write_enabled=settings.write_enabled)
    try:
        await server.start()
    except OSError as e:
        if settings.port == 0:
            log.warning("no web console: cannot listen: %s", e)
            return None
        log.warning("console port %d is taken (%s); using a free port instead",
                    settings.port, e.strerror or e)
        server = ConsoleServer(namesrv, port=0, write_enabled=settings.write_enabled)
        await server.start()
    return server
