"""``tidemq console``: serve the web console over a cluster's name servers.

Needs the ``console`` extra (``pip install 'tidemq[console]'``: aiohttp).
"""

from __future__ import annotations

import asyncio
import signal

import click

from tidemq.client.producer import default_namesrv
from tidemq.client.security import ACCESS_KEY_ENV, SECRET_KEY_ENV, Credentials
from tidemq.client.trace_data import TRACE_TOPIC_DEFAULT

CONSOLE_PORT_DEFAULT = 8080  # RocketMQ Dashboard's port


@click.command("console")
@click.option("-n", "--namesrvAddr", "namesrv", default=default_namesrv,
              show_default="$NAMESRV_ADDR or 127.0.0.1:9876",
              help="Name server addresses, host:port;host:port.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 for every interface).")
@click.option("-p", "--port", type=click.IntRange(0, 65535), default=CONSOLE_PORT_DEFAULT,
              show_default=True, help="Port to listen on; 0 picks a free one.")
@click.option("--write", "write_enabled", is_flag=True,
              help="Allow changes: create/update/delete topics, reset offsets, redrive dead "
                   "letters. Without it the console is read-only.")
@click.option("--traceTopic", "trace_topic", default=TRACE_TOPIC_DEFAULT, show_default=True)
@click.option("--accessKey", "access_key", envvar=ACCESS_KEY_ENV, metavar="KEY",
              help=f"ACL access key the console signs every request with [env "
                   f"{ACCESS_KEY_ENV}].")
@click.option("--secretKey", "secret_key", envvar=SECRET_KEY_ENV, metavar="KEY",
              help=f"ACL secret key (never printed) [env {SECRET_KEY_ENV}].")
def console(namesrv: str, host: str, port: int, write_enabled: bool, trace_topic: str,
            access_key: str | None, secret_key: str | None) -> None:
    """Serve the web console (cluster, topics, groups, messages, traces, dead letters)."""
    if bool(access_key) != bool(secret_key):
        raise click.UsageError(f"give both --accessKey and --secretKey (or {ACCESS_KEY_ENV} "
                               f"and {SECRET_KEY_ENV}), or neither")
    credentials = Credentials(access_key, secret_key) if access_key and secret_key else None
    try:
        from tidemq.console.server import ConsoleServer
    except ImportError as e:
        raise click.ClickException(
            f"the console needs aiohttp ({e}); install it with: pip install 'tidemq[console]'"
        ) from None
    from tidemq.remoting.loop import run

    async def main() -> None:
        server = ConsoleServer(namesrv, host=host, port=port, write_enabled=write_enabled,
                               trace_topic=trace_topic, credentials=credentials)
        try:
            await server.start()
        except OSError as e:
            raise click.ClickException(
                f"cannot listen on {host}:{port}: {e.strerror or e} (choose another --port)"
            ) from None
        mode = "write actions enabled" if write_enabled else "read-only"
        click.echo(f"tidemq console: {server.url} ({mode}), name servers {namesrv}; "
                   "Ctrl-C to stop")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signal_number in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signal_number, stop.set)
        try:
            await stop.wait()
        finally:
            await server.close()

    run(main())
