"""Where a server's log goes: stderr and a rotating file, one line per event.

``tidemq namesrv``, ``tidemq broker`` and ``tidemq dev`` log to stderr (for a terminal or a
service manager's journal) and to ``<logDir>/<name>.log``, which is rotated when it passes
``--logMaxSize`` bytes, keeping ``--logFileCount`` old files (``<name>.log.1`` is the newest
of them). The default folder is ``<storePathRootDir>/logs`` for a broker (and ``tidemq dev``)
and ``./logs`` for a name server; ``--logDir`` puts them anywhere.

Every event is one line, ``time level logger: message``: a message's line breaks and an
exception's traceback are folded into it (`` | `` between lines), so ``grep`` and log
shippers see whole events.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
LOG_LEVELS = ("debug", "info", "warning", "error")
# RocketMQ keeps its broker logs in 1 GiB files; a development machine and most services
# are better served by smaller files: 64 MiB x 10 caps the folder at 704 MiB.
LOG_MAX_BYTES_DEFAULT = 64 * 1024 * 1024
LOG_FILE_COUNT_DEFAULT = 10
LOG_MAX_BYTES_MIN = 1024  # smaller would rotate on nearly every line


class OneLineFormatter(logging.Formatter):
    """The standard format with line breaks and tracebacks folded into one line."""

    def format(self, record: logging.LogRecord) -> str:
        return " | ".join(line for line in super().format(record).splitlines() if line)


def log_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """``--logLevel``, ``--logDir``, ``--logMaxSize`` and ``--logFileCount``."""
    function = click.option(
        "--logFileCount", "log_file_count", type=click.IntRange(1, 1000),
        default=LOG_FILE_COUNT_DEFAULT, show_default=True,
        help="Rotated log files kept besides the current one.")(function)
    function = click.option(
        "--logMaxSize", "log_max_bytes", type=click.IntRange(LOG_MAX_BYTES_MIN),
        default=LOG_MAX_BYTES_DEFAULT, show_default=True,
        help="Rotate the log file when it passes this many bytes.")(function)
    function = click.option(
        "--logDir", "log_dir", type=click.Path(file_okay=False, path_type=Path),
        help="Folder of the log file (default: <storePathRootDir>/logs for a broker, ./logs "
             "for a name server).")(function)
    return click.option(
        "--logLevel", "--log-level", "log_level", type=click.Choice(LOG_LEVELS),
        default="info", show_default=True, help="How much to log.")(function)


def setup_logging(level_name: str) -> None:
    """Log to stderr at ``level_name``, one line per event (the file comes later, once the
    settings say where it goes)."""
    root = logging.getLogger()
    root.setLevel(level_name.upper())
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter(LOG_FORMAT, datefmt="%H:%M:%S"))
    root.addHandler(handler)


def add_log_file(log_dir: Path, name: str, *, max_bytes: int, file_count: int) -> Path:
    """Also log to ``<log_dir>/<name>.log``, rotated at ``max_bytes`` keeping ``file_count``.

    Returns:
        The log file's path.

    Raises:
        OSError: the folder cannot be made or the file opened.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"{name}.log"
    handler = logging.handlers.RotatingFileHandler(
        path, maxBytes=max_bytes, backupCount=file_count, encoding="utf-8")
    # The file carries the date too: it outlives the day a terminal shows.
    handler.setFormatter(OneLineFormatter(LOG_FORMAT))
    logging.getLogger().addHandler(handler)
    return path
