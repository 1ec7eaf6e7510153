"""Server verbs: broker and name-server settings, write permission, KV config, housekeeping,
and exporting the settings and metadata of a cluster to a file."""

from __future__ import annotations

from pathlib import Path

import click
import orjson

from tidemq.cli.admin.base import (
    admin,
    did_you_mean,
    json_option,
    namesrv_option,
    print_json,
    print_settings,
    print_table,
    with_admin,
)
from tidemq.client.admin import Admin

_EXPORT_DIR_DEFAULT = "./tidemq-export"  # mqadmin writes to /tmp/rocketmq/export


def _broker_options(function):
    function = click.option("-c", "--clusterName", "cluster",
                            help="Every master of this cluster.")(function)
    return click.option("-b", "--brokerAddr", "broker_addr",
                        help="One broker, host:port.")(function)


@admin.command("getBrokerConfig")
@namesrv_option
@_broker_options
@json_option
@with_admin
async def get_broker_config(client: Admin, broker_addr: str | None, cluster: str | None,
                            as_json: bool) -> None:
    """Show the settings of one broker or of every master of a cluster."""
    configs = {address: await client.broker_config(address)
               for address in await client.broker_targets(cluster, broker_addr)}
    if as_json:
        print_json(configs)
        return
    for address, settings in configs.items():
        print_settings(f"config of broker {address}", settings)


@admin.command("updateBrokerConfig")
@namesrv_option
@_broker_options
@click.option("-k", "--key", required=True, help="The setting's key, e.g. fileReservedTime.")
@click.option("-v", "--value", required=True, help="Its new value.")
@json_option
@with_admin
async def update_broker_config(client: Admin, broker_addr: str | None, cluster: str | None,
                               key: str, value: str, as_json: bool) -> None:
    """Change a broker setting at run time (kept across restarts); the broker refuses keys
    that only take effect at start."""
    updated = await client.update_broker_config({key: value}, cluster=cluster,
                                                broker_addr=broker_addr)
    if as_json:
        print_json({"updated": updated, "key": key, "value": value})
        return
    for address in updated:
        click.echo(f"update broker config {key}={value} on {address} success.")


@admin.command("getNamesrvConfig")
@namesrv_option
@json_option
@with_admin
async def get_namesrv_config(client: Admin, as_json: bool) -> None:
    """Show the settings of every name server."""
    configs = await client.namesrv_config()
    if as_json:
        print_json(configs)
        return
    for address, settings in configs.items():
        print_settings(f"config of name server {address}", settings)


@admin.command("updateNamesrvConfig")
@namesrv_option
@click.option("-k", "--key", required=True, help="The setting's key, e.g. orderMessageEnable.")
@click.option("-v", "--value", required=True, help="Its new value.")
@json_option
@with_admin
async def update_namesrv_config(client: Admin, key: str, value: str, as_json: bool) -> None:
    """Change a name-server setting at run time on every name server."""
    updated = await client.update_namesrv_config({key: value})
    if as_json:
        print_json({"updated": updated, "key": key, "value": value})
        return
    for address in updated:
        click.echo(f"update name server config {key}={value} on {address} success.")


@admin.command("wipeWritePerm")
@namesrv_option
@click.option("-b", "--brokerName", "broker_name", required=True)
@json_option
@with_admin
async def wipe_write_perm(client: Admin, broker_name: str, as_json: bool) -> None:
    """Stop producers from choosing a broker (before maintenance); reads go on."""
    counts = await client.wipe_write_perm(broker_name)
    if as_json:
        print_json({"brokerName": broker_name, "wipeTopicCount": counts})
        return
    for address, count in counts.items():
        click.echo(f"wipe write perm of broker[{broker_name}] in name server[{address}] OK, "
                   f"{count} topics")


@admin.command("addWritePerm")
@namesrv_option
@click.option("-b", "--brokerName", "broker_name", required=True)
@json_option
@with_admin
async def add_write_perm(client: Admin, broker_name: str, as_json: bool) -> None:
    """Let producers choose a broker again (undoes wipeWritePerm)."""
    counts = await client.add_write_perm(broker_name)
    if as_json:
        print_json({"brokerName": broker_name, "addTopicCount": counts})
        return
    for address, count in counts.items():
        click.echo(f"add write perm of broker[{broker_name}] in name server[{address}] OK, "
                   f"{count} topics")


@admin.command("updateKvConfig")
@namesrv_option
@click.option("-s", "--namespace", required=True)
@click.option("-k", "--key", required=True)
@click.option("-v", "--value", required=True)
@json_option
@with_admin
async def update_kv_config(client: Admin, namespace: str, key: str, value: str,
                           as_json: bool) -> None:
    """Set a KV config entry on every name server."""
    await client.put_kv_config(namespace, key, value)
    if as_json:
        print_json({"namespace": namespace, "key": key, "value": value})
        return
    click.echo(f"update kv config {namespace}/{key}={value} success.")


@admin.command("deleteKvConfig")
@namesrv_option
@click.option("-s", "--namespace", required=True)
@click.option("-k", "--key", required=True)
@json_option
@with_admin
async def delete_kv_config(client: Admin, namespace: str, key: str, as_json: bool) -> None:
    """Delete a KV config entry from every name server."""
    if await client.get_kv_config(namespace, key) is None:
        known = await client.kv_list(namespace)
        raise click.ClickException(f"no KV config {namespace}/{key} on the name servers."
                                   f"{did_you_mean(key, known)}")
    await client.delete_kv_config(namespace, key)
    if as_json:
        print_json({"namespace": namespace, "key": key, "deleted": True})
        return
    click.echo(f"delete kv config {namespace}/{key} success.")


@admin.command("cleanExpiredCQ")
@namesrv_option
@_broker_options
@json_option
@with_admin
async def clean_expired_cq(client: Admin, broker_addr: str | None, cluster: str | None,
                           as_json: bool) -> None:
    """Drop consume-queue files wholly below the commit log's first message."""
    cleaned = await client.clean_expired_consume_queue(cluster=cluster, broker_addr=broker_addr)
    if as_json:
        print_json({"cleaned": cleaned})
        return
    for address in cleaned:
        click.echo(f"clean expired consume queues on {address} success.")


@admin.command("cleanUnusedTopic")
@namesrv_option
@_broker_options
@json_option
@with_admin
async def clean_unused_topic(client: Admin, broker_addr: str | None, cluster: str | None,
                             as_json: bool) -> None:
    """Drop consume queues of topics a broker no longer has."""
    cleaned = await client.clean_unused_topic(cluster=cluster, broker_addr=broker_addr)
    if as_json:
        print_json({"cleaned": cleaned})
        return
    for address in cleaned:
        click.echo(f"clean unused topics on {address} success.")


# -- export -------------------------------------------------------------------------------------


def _write_export(folder: Path, name: str, document: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    return path


@admin.command("exportConfigs")
@namesrv_option
@click.option("-c", "--clusterName", "cluster", help="Only this cluster's masters.")
@click.option("-f", "--filePath", "file_path", default=_EXPORT_DIR_DEFAULT, show_default=True,
              type=click.Path(file_okay=False, path_type=Path), help="Folder to write to.")
@json_option
@with_admin
async def export_configs(client: Admin, cluster: str | None, file_path: Path,
                         as_json: bool) -> None:
    """Write every master's and name server's settings to <filePath>/configs.json."""
    brokers = {}
    info = await client.cluster_list()
    for address in await client.broker_targets(cluster, None):
        name = next(n for n, b in info.brokers.items() if address in b.broker_addrs.values())
        brokers[name] = await client.broker_config(address)
    document = {"namesrvConfig": await client.namesrv_config(), "brokerConfigs": brokers}
    path = _write_export(file_path, "configs.json", document)
    if as_json:
        print_json({"file": str(path), **document})
        return
    click.echo(f"export {path} success ({len(brokers)} brokers, "
               f"{len(document['namesrvConfig'])} name servers)")


@admin.command("exportMetadata")
@namesrv_option
@_broker_options
@click.option("-f", "--filePath", "file_path", default=_EXPORT_DIR_DEFAULT, show_default=True,
              type=click.Path(file_okay=False, path_type=Path), help="Folder to write to.")
@click.option("-t", "--topic", "topic_only", is_flag=True, help="Only the topics.")
@click.option("-g", "--subscriptionGroup", "group_only", is_flag=True, help="Only the groups.")
@json_option
@with_admin
async def export_metadata(client: Admin, broker_addr: str | None, cluster: str | None,
                          file_path: Path, topic_only: bool, group_only: bool,
                          as_json: bool) -> None:
    """Write the topic configs and subscription groups of a broker or cluster to
    <filePath>/metadata.json (a backup; updateTopic/updateSubGroup recreate them)."""
    topics: dict[str, object] = {}
    groups: dict[str, object] = {}
    for address in await client.broker_targets(cluster, broker_addr):
        if not group_only:
            topics.update(await client.topic_configs(address))
        if not topic_only:
            groups.update(await client.subscription_groups(address))
    document: dict[str, object] = {}
    if not group_only:
        document["topicConfigTable"] = topics
    if not topic_only:
        document["subscriptionGroupTable"] = groups
    path = _write_export(file_path, "metadata.json", document)
    if as_json:
        print_json({"file": str(path), **document})
        return
    print_table(None, ("File", "Topics", "Groups"), [(path, len(topics), len(groups))])
