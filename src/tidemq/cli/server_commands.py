"""``tidemq namesrv``, ``tidemq broker`` and ``tidemq dev``: run the servers in the foreground.

Each reads a RocketMQ-style properties file (``-c``) and any ``--<key> value`` options (which
win over the file) into the config dataclasses, starts on one event loop (uvloop when
installed), prints where it listens, and runs until Ctrl-C or SIGTERM, then shuts down
cleanly (requests in flight finish, the store is flushed and closed).

A start that cannot succeed (bad config, port in use, store locked by another process) prints
one line saying what and how to fix it and exits non-zero, without a traceback: exit status 2
for a configuration mistake, 1 for anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from tidemq.cli.dev_console import pop_console_settings, start_dev_console
from tidemq.cli.log_setup import add_log_file, log_options, setup_logging
from tidemq.cli.server_gc import freeze_start_up_objects
from tidemq.config_loader import load_config, parse_override_args
from tidemq.errors import ConfigError, TidemqError

log = logging.getLogger("tidemq.cli")

_SERVER_CONTEXT = {
    "ignore_unknown_options": True,
    "allow_extra_args": True,
    "help_option_names": ["-h", "--help"],
}
EXIT_CONFIG_ERROR = 2
EXIT_START_FAILED = 1

# The dev command's own settings; every other --<key> is a broker or store key.
DEV_NAMESRV_PORT_KEY = "namesrvPort"
DEV_DEFAULT_NAMESRV_PORT = 9876
# tidemq dev's commit-log segment (a broker's default is RocketMQ's 1 GiB). A segment's disk is
# reserved whole when it is made (a full disk then fails cleanly, see store/mapped_file.py)
# and, with warmMapedFileEnable, the next one is prepared ahead, so a store may hold two
# segments: 2 x 64 MiB plus the 20 MB index keeps it under 200 MB, and 64 MiB still holds
# the largest message (4 MiB) many times. Give --mappedFileSizeCommitLog to change it.
DEV_COMMIT_LOG_SEGMENT_BYTES = 64 * 1024 * 1024


def _config_file_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "-c", "--configFile", "config_file", type=click.Path(dir_okay=False, path_type=Path),
        help="RocketMQ-style .properties file (key=value lines).",
    )(function)


@click.command("namesrv", context_settings=_SERVER_CONTEXT)
@_config_file_option
@log_options
@click.pass_context
def namesrv(ctx: click.Context, config_file: Path | None, log_level: str,
            log_dir: Path | None, log_max_bytes: int, log_file_count: int) -> None:
    """Run a name server: tidemq namesrv [-c FILE] [--listenPort 9876] [--<key> value ...]

    Keys are RocketMQ's NamesrvConfig names (listenPort, bindAddress, orderMessageEnable,
    kvConfigPath, scanNotActiveBrokerInterval, brokerChannelExpiredTime, ...).
    """
    setup_logging(log_level)
    from tidemq.namesrv import NamesrvConfig, NamesrvController

    (config,) = _load_or_exit("namesrv", [NamesrvConfig], config_file, ctx.args)
    config = _with_acl_file(config, config_file)
    _log_to_file_or_exit("namesrv", log_dir or Path("logs"), "namesrv", log_max_bytes,
                         log_file_count)

    async def serve(stop: asyncio.Event) -> None:
        controller = _build_or_exit("namesrv", NamesrvController, config)
        await _start_or_exit("namesrv", controller.start(), on_failure=controller.shutdown)
        _started(f"tidemq namesrv: listening on {controller.address}; Ctrl-C to stop")
        try:
            await stop.wait()
        finally:
            await controller.shutdown()

    _run_until_stopped(serve)


@click.command("broker", context_settings=_SERVER_CONTEXT)
@_config_file_option
@click.option("-n", "--namesrvAddr", "namesrv_addr", metavar="'host:port;host:port'",
              help="Name servers to register with (the namesrvAddr key).")
@log_options
@click.pass_context
def broker(ctx: click.Context, config_file: Path | None, namesrv_addr: str | None,
           log_level: str, log_dir: Path | None, log_max_bytes: int,
           log_file_count: int) -> None:
    """Run a broker: tidemq broker [-c FILE] [-n "host:port;host:port"] [--<key> value ...]

    Keys are RocketMQ's BrokerConfig and MessageStoreConfig names (brokerClusterName,
    brokerName, brokerId, listenPort, brokerIP1, brokerRole, storePathRootDir, flushDiskType,
    mappedFileSizeCommitLog, deleteWhen, fileReservedTime, autoCreateTopicEnable, ...).
    """
    setup_logging(log_level)
    overrides = _overrides_or_exit("broker", ctx.args)
    if namesrv_addr is not None:
        overrides["namesrvAddr"] = namesrv_addr
    broker_config_class, store_config_class = _broker_config_classes()
    broker_config, store_config = _load_broker_or_exit(
        "broker", [broker_config_class, store_config_class], config_file, overrides
    )
    broker_config = _with_acl_file(broker_config, config_file)
    _log_to_file_or_exit("broker", log_dir or Path(store_config.store_path_root_dir) / "logs",
                         "broker", log_max_bytes, log_file_count)

    async def serve(stop: asyncio.Event) -> None:
        controller = _open_broker("broker", broker_config, store_config)
        await _start_or_exit("broker", controller.start(), on_failure=controller.shutdown)
        names = broker_config.namesrv_addr or "no name server (give one with -n host:9876)"
        _started(
            f"tidemq broker: {broker_config.broker_name} listening on "
            f"{controller.broker_address} (cluster {broker_config.broker_cluster_name}, "
            f"{broker_config.broker_role}), registered with {names}, store "
            f"{store_config.store_path_root_dir}; Ctrl-C to stop"
        )
        try:
            await stop.wait()
        finally:
            await controller.shutdown()

    _run_until_stopped(serve)


@click.command("dev", context_settings=_SERVER_CONTEXT)
@log_options
@click.pass_context
def dev(ctx: click.Context, log_level: str, log_dir: Path | None, log_max_bytes: int,
        log_file_count: int) -> None:
    """Run a name server and a broker in one process, for development.

    tidemq dev [--storePathRootDir DIR] [--namesrvPort 9876] [--listenPort 10911]
    [--<key> value ...]

    Data goes to ./tidemq-data unless --storePathRootDir says otherwise; any broker or store
    key may be given (e.g. --flushDiskType SYNC_FLUSH). A new store gets 64 MiB commit-log
    segments (a broker's default is 1 GiB), so a first start holds well under 200 MB.

    It also serves the web console (--consolePort 8080, a free port if taken, or off;
    --consoleWrite true allows changes) and Prometheus /metrics of the broker and the name
    server on free ports (--metricsPromExporterPort N fixes the broker's; --metricsExporterType
    DISABLE turns them off); the line printed at start gives every URL.
    """
    setup_logging(log_level)
    from tidemq.namesrv import NamesrvConfig, NamesrvController

    overrides = _overrides_or_exit("dev", ctx.args)
    try:
        console_settings = pop_console_settings(overrides)
    except ValueError as e:
        _fail("dev", e, EXIT_CONFIG_ERROR)
    namesrv_port_text = overrides.pop(DEV_NAMESRV_PORT_KEY, str(DEV_DEFAULT_NAMESRV_PORT))
    # Metrics are on in dev (the broker's and the name server's /metrics, each on a free port
    # unless --metricsPromExporterPort gives the broker's); --metricsExporterType DISABLE
    # turns them off.
    overrides.setdefault("metricsExporterType", "PROM")
    overrides.setdefault("metricsPromExporterPort", "0")
    (namesrv_config,) = _load_or_exit("dev", [NamesrvConfig], None,
                                      {"listenPort": namesrv_port_text,
                                       "metricsExporterType": overrides["metricsExporterType"],
                                       "metricsPromExporterPort": "0"},
                                      rename={"listenPort": DEV_NAMESRV_PORT_KEY})
    broker_config_class, store_config_class = _broker_config_classes()
    # The broker's namesrvAddr is filled in once the name server has its port (0 = any).
    given_namesrv_addr = overrides.pop("namesrvAddr", None)
    broker_config, store_config = _load_broker_or_exit(
        "dev", [broker_config_class, store_config_class], None, overrides
    )
    if "mappedFileSizeCommitLog" not in overrides:
        store_config = _with_dev_segment_size(store_config)
    _log_to_file_or_exit("dev", log_dir or Path(store_config.store_path_root_dir) / "logs",
                         "dev", log_max_bytes, log_file_count)
    broker_config = _with_acl_file(broker_config, None)
    namesrv_config = _dev_namesrv_security(namesrv_config, broker_config)
    if broker_config.tls_client_enable is None:
        # The in-process broker registers with its own permissive name server in plain TCP
        # unless told otherwise (an enforcing broker would otherwise need a trust file).
        broker_config = dataclasses.replace(broker_config, tls_client_enable=False)

    async def serve(stop: asyncio.Event) -> None:
        namesrv_controller = _build_or_exit("dev", NamesrvController, namesrv_config)
        await _start_or_exit("dev", namesrv_controller.start(),
                             on_failure=namesrv_controller.shutdown,
                             port_setting=f"--{DEV_NAMESRV_PORT_KEY}")
        try:
            addresses = [f"127.0.0.1:{namesrv_controller.port}"]
            if given_namesrv_addr:
                addresses.append(given_namesrv_addr)
            effective_config = _with_namesrv_addr(broker_config, ";".join(addresses))
            broker_controller = _open_broker("dev", effective_config, store_config)
            await _start_or_exit("dev", broker_controller.start(),
                                 on_failure=broker_controller.shutdown)
            console = await start_dev_console(console_settings, namesrv_controller.address)
            try:
                console_text = f", console {console.url}" if console is not None else ""
                exporters = (broker_controller.metrics_exporter,
                             namesrv_controller.metrics_exporter)
                if all(exporter is not None for exporter in exporters):
                    console_text += (f", metrics {exporters[0].url} (broker) "
                                     f"{exporters[1].url} (name server)")
                _started(
                    f"tidemq dev: name server {namesrv_controller.address}, broker "
                    f"{effective_config.broker_name} {broker_controller.broker_address} "
                    f"(cluster {effective_config.broker_cluster_name}), store "
                    f"{store_config.store_path_root_dir}{console_text}; Ctrl-C to stop"
                )
                await stop.wait()
            finally:
                if console is not None:
                    await console.close()
                await broker_controller.shutdown()
        finally:
            await namesrv_controller.shutdown()

    _run_until_stopped(serve)


# -- helpers ------------------------------------------------------------------------------------


def _broker_config_classes() -> tuple[type, type]:
    from tidemq.broker.config import BrokerConfig
    from tidemq.store.config import StoreConfig

    return BrokerConfig, StoreConfig


def _build_or_exit(command: str, factory: Callable[..., Any], *args: Any) -> Any:
    """``factory(*args)``, or exit with one line when it refuses its config (an ACL file
    missing, a certificate that does not load)."""
    try:
        return factory(*args)
    except TidemqError as e:
        _fail(command, e, _exit_code_for(e))


def _dev_namesrv_security(namesrv_config: Any, broker_config: Any) -> Any:
    """The dev name server takes the broker's ACL and TLS keys: ACL on its write operations,
    TLS permissive (the in-process broker registers over plain TCP; clients may use TLS)."""
    import dataclasses

    tls = {}
    if broker_config.tls_enable:
        tls = {name: getattr(broker_config, name) for name in (
            "tls_enable", "tls_server_cert_path", "tls_server_key_path",
            "tls_server_key_password", "tls_server_need_client_auth",
            "tls_server_trust_cert_path")} | {"tls_server_mode": "permissive"}
    return dataclasses.replace(namesrv_config, acl_enable=broker_config.acl_enable,
                               acl_file_path=broker_config.acl_file_path, **tls)


def _with_acl_file(config: Any, config_file: Path | None) -> Any:
    """``config`` with aclFilePath resolved when ACL is on and it is not set: RocketMQ's
    $ROCKETMQ_HOME/conf/plain_acl.yml, else beside the config file (``tidemq.acl``)."""
    import dataclasses

    from tidemq.acl.acl_file import default_acl_file

    if not config.acl_enable or config.acl_file_path:
        return config
    return dataclasses.replace(config, acl_file_path=str(default_acl_file(config_file)))


def _with_namesrv_addr(broker_config: Any, namesrv_addr: str) -> Any:
    import dataclasses

    return dataclasses.replace(broker_config, namesrv_addr=namesrv_addr)


def _open_broker(command: str, broker_config: Any, store_config: Any) -> Any:
    """Construct the BrokerController (it opens the store), or exit with one line.

    First the process's open-file soft limit is raised to the hard limit (every mapped
    queue file holds a descriptor), and once the store is open a WARNING gives the numbers
    when the limit leaves too little room (``tidemq.store.open_files``), and another when
    message body CRCs are computed without the accelerator (``tidemq.protocol.crc``).
    """
    from tidemq.broker.controller import BrokerController
    from tidemq.protocol import crc
    from tidemq.store import open_files

    limit = open_files.raise_open_file_limit()
    try:
        controller = BrokerController(broker_config, store_config)
    except TidemqError as e:
        _fail(command, e, _exit_code_for(e))
    except OSError as e:
        if open_files.is_open_file_shortage(e):
            _fail(command, open_files.describe_open_file_error(
                f"cannot open the store at {store_config.store_path_root_dir}", e),
                EXIT_START_FAILED)
        _fail(command, f"cannot open the store at {store_config.store_path_root_dir}: "
                       f"{e.strerror or e} (check storePathRootDir)", EXIT_START_FAILED)
    in_use = open_files.count_open_descriptors()
    shortage = open_files.open_file_shortage(limit, in_use) if in_use is not None else None
    if shortage is not None:
        log.warning("%s", shortage)
    slow_crc = crc.accelerator_warning()
    if slow_crc is not None:
        log.warning("%s", slow_crc)
    return controller


def _overrides_or_exit(command: str, args: list[str]) -> dict[str, str]:
    try:
        return parse_override_args(args)
    except ConfigError as e:
        _fail(command, e, EXIT_CONFIG_ERROR)


def _load_or_exit(command: str, targets: list[type], config_file: Path | None,
                  overrides: dict[str, str] | list[str], *,
                  rename: dict[str, str] | None = None) -> list[Any]:
    if isinstance(overrides, list):
        overrides = _overrides_or_exit(command, overrides)
    try:
        return load_config(targets, config_file, overrides)
    except ConfigError as e:
        message = str(e)
        for key, shown in (rename or {}).items():
            message = message.replace(key, shown)
        _fail(command, message, EXIT_CONFIG_ERROR)


def _with_dev_segment_size(store_config: Any) -> Any:
    """``tidemq dev``'s commit-log segments: DEV_COMMIT_LOG_SEGMENT_BYTES for a new store, the
    size of the segments already there for an existing one (a segment size cannot change
    under a store)."""
    import dataclasses

    commit_log = Path(store_config.store_path_root_dir) / "commitlog"
    existing = sorted(commit_log.glob("[0-9]" * 20)) if commit_log.is_dir() else []
    size = existing[0].stat().st_size if existing else DEV_COMMIT_LOG_SEGMENT_BYTES
    return dataclasses.replace(store_config, mapped_file_size_commit_log=size)


def _log_to_file_or_exit(command: str, log_dir: Path, name: str, max_bytes: int,
                         file_count: int) -> None:
    try:
        path = add_log_file(log_dir, name, max_bytes=max_bytes, file_count=file_count)
    except OSError as e:
        _fail(command, f"cannot write the log file in {log_dir}: {e.strerror or e} (give "
                       "another folder with --logDir)", EXIT_START_FAILED)
    log.info("logging to %s (rotated at %d bytes, %d old files kept)", path, max_bytes,
             file_count)


def _load_broker_or_exit(command: str, targets: list[type], config_file: Path | None,
                         overrides: dict[str, str]) -> list[Any]:
    """The broker's settings: the config file, then what ``updateBrokerConfig`` changed at
    run time (kept under the store), then the command line."""
    from tidemq.broker.maintenance_processor import load_runtime_settings, runtime_settings_path

    broker_config, store_config = _load_or_exit(command, targets, config_file, overrides)
    try:
        kept = load_runtime_settings(store_config.store_path_root_dir)
    except TidemqError as e:
        _fail(command, e, EXIT_CONFIG_ERROR)
    if not kept:
        return [broker_config, store_config]
    log.info("applying %d settings changed at run time, from %s: %s", len(kept),
             runtime_settings_path(store_config.store_path_root_dir),
             ", ".join(f"{k}={v}" for k, v in sorted(kept.items())))
    return _load_or_exit(command, targets, config_file, {**kept, **overrides})


async def _start_or_exit(command: str, start: Awaitable[None], *,
                         on_failure: Callable[[], Awaitable[None]],
                         port_setting: str | None = None) -> None:
    """Await a server's start; on a start error, stop what started and exit with one line."""
    try:
        await start
    except TidemqError as e:
        message = str(e)
        if port_setting is not None and "listenPort" in message:
            message = message.replace("listenPort", port_setting)
        with contextlib.suppress(Exception):
            await on_failure()
        _fail(command, message, _exit_code_for(e))
    except OSError as e:
        with contextlib.suppress(Exception):
            await on_failure()
        _fail(command, f"start failed: {e.strerror or e}", EXIT_START_FAILED)


def _fail(command: str, problem: object, exit_code: int) -> NoReturn:
    """Print ``tidemq <command>: <problem>`` to stderr and end the command with ``exit_code``."""
    click.echo(f"tidemq {command}: {problem}", err=True)
    # click.exceptions.Exit is an ordinary exception: it leaves the event loop like any
    # other, and click turns it into the exit status without printing a traceback.
    raise click.exceptions.Exit(exit_code)


def _exit_code_for(error: BaseException) -> int:
    """2 for a configuration mistake, 1 for a start that failed otherwise (port in use...)."""
    from tidemq.remoting.errors import RemotingListenError

    if isinstance(error, ConfigError) and not isinstance(error, RemotingListenError):
        return EXIT_CONFIG_ERROR
    return EXIT_START_FAILED


def _announce(line: str) -> None:
    click.echo(line)
    sys.stdout.flush()


def _started(line: str) -> None:
    """Say the server is up; then leave what its start-up made out of later garbage
    collections (server_gc.py: a full collection over it stopped the loop for ~24 ms)."""
    _announce(line)
    freeze_start_up_objects()


def _run_until_stopped(serve: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``serve(stop)`` on a fresh event loop; Ctrl-C or SIGTERM sets ``stop``."""
    from tidemq.remoting.loop import run

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def request_stop(signal_name: str) -> None:
            if stop.is_set():
                log.warning("%s again: already shutting down", signal_name)
                return
            log.info("%s received: shutting down", signal_name)
            stop.set()

        for signal_number in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signal_number, request_stop, signal_number.name)
        try:
            await serve(stop)
        finally:
            for signal_number in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signal_number)

    run(main())
