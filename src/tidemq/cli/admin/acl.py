"""ACL verbs (mqadmin's names and short options): updateAclConfig, deleteAclConfig,
clusterAclConfigVersion, updateGlobalWhiteAddr, getAclConfig.

Each goes to one broker (-b) or every master of a cluster (-c; the only cluster when there
is one). Against a broker with ACL on, the signing account must be admin:
``tidemq admin --accessKey AK --secretKey SK updateAclConfig -a app1 -s secret1 -t Orders=PUB``.
"""

from __future__ import annotations

import click
from rich.table import Table

from tidemq.cli.admin.base import (
    admin,
    console,
    format_ms,
    json_option,
    namesrv_option,
    print_json,
    with_admin,
)
from tidemq.client.admin import Admin

_HIDDEN = "******"


def _targets(function):
    function = click.option("-c", "--clusterName", "cluster",
                            help="Every master of this cluster.")(function)
    return click.option("-b", "--brokerAddr", "broker_addr", help="One broker's address.")(
        function)


def _split(text: str | None) -> list[str] | None:
    if text is None:
        return None
    return [item.strip() for item in text.split(",") if item.strip()]


def _changed(addresses: list[str], what: str, as_json: bool = False) -> None:
    if as_json:
        print_json({"updated": addresses, "what": what})
        return
    for address in addresses:
        click.echo(f"{what} on {address}")


@admin.command("updateAclConfig")
@namesrv_option
@_targets
@click.option("-a", "--accessKey", "access_key", required=True, help="The account's access key.")
@click.option("-s", "--secretKey", "secret_key", help="Its secret key (more than 6 characters).")
@click.option("-w", "--whiteRemoteAddress", "white", help="Peers that need no signature.")
@click.option("-i", "--defaultTopicPerm", "topic_perm",
              type=click.Choice(["DENY", "PUB", "SUB", "PUB|SUB"], case_sensitive=False),
              help="Permission on topics not listed.")
@click.option("-u", "--defaultGroupPerm", "group_perm",
              type=click.Choice(["DENY", "PUB", "SUB", "PUB|SUB"], case_sensitive=False),
              help="Permission on groups not listed.")
@click.option("-t", "--topicPerms", "topic_perms", help="topicA=PUB,topicB=SUB|PUB,...")
@click.option("-g", "--groupPerms", "group_perms", help="groupA=SUB,groupB=DENY,...")
@click.option("-m", "--admin", "is_admin", type=click.BOOL, help="true: may administer.")
@json_option
@with_admin
async def update_acl_config(client: Admin, broker_addr: str | None, cluster: str | None,
                            access_key: str, secret_key: str | None, white: str | None,
                            topic_perm: str | None, group_perm: str | None,
                            topic_perms: str | None, group_perms: str | None,
                            is_admin: bool | None, as_json: bool) -> None:
    """Create an ACL account, or change the fields given for it."""
    changed = await client.update_acl_config(
        access_key, broker_addr=broker_addr, cluster=cluster, secret_key=secret_key,
        white_remote_address=white, admin=is_admin,
        default_topic_perm=topic_perm.upper() if topic_perm else None,
        default_group_perm=group_perm.upper() if group_perm else None,
        topic_perms=_split(topic_perms), group_perms=_split(group_perms))
    _changed(changed, f"ACL account {access_key} created or updated", as_json)


@admin.command("deleteAclConfig")
@namesrv_option
@_targets
@click.option("-a", "--accessKey", "access_key", required=True, help="The account to delete.")
@json_option
@with_admin
async def delete_acl_config(client: Admin, broker_addr: str | None, cluster: str | None,
                            access_key: str, as_json: bool) -> None:
    """Delete an ACL account."""
    changed = await client.delete_acl_config(access_key, broker_addr=broker_addr,
                                             cluster=cluster)
    _changed(changed, f"ACL account {access_key} deleted", as_json)


@admin.command("updateGlobalWhiteAddr")
@namesrv_option
@_targets
@click.option("-g", "--globalWhiteRemoteAddresses", "patterns", required=True,
              help="Address patterns, comma-separated (10.0.0.*,192.168.1.10); they replace "
                   "the list.")
@json_option
@with_admin
async def update_global_white_addr(client: Admin, broker_addr: str | None, cluster: str | None,
                                   patterns: str, as_json: bool) -> None:
    """Replace the ACL global white list (peers that need no signature)."""
    changed = await client.update_global_white_addrs(_split(patterns) or [],
                                                     broker_addr=broker_addr, cluster=cluster)
    _changed(changed, "ACL global white list updated", as_json)


@admin.command("clusterAclConfigVersion")
@namesrv_option
@_targets
@json_option
@with_admin
async def cluster_acl_config_version(client: Admin, broker_addr: str | None,
                                     cluster: str | None, as_json: bool) -> None:
    """Show each broker's ACL file version."""
    versions = await client.acl_config_versions(broker_addr=broker_addr, cluster=cluster)
    if as_json:
        print_json([{"clusterName": v.cluster_name, "brokerName": v.broker_name,
                     "brokerAddr": v.broker_addr, "counter": v.counter,
                     "timestamp": v.timestamp_ms, "files": v.files} for v in versions])
        return
    table = Table(title="ACL config versions")
    for column in ("Cluster Name", "Broker Name", "Broker Address", "Version", "Last Update"):
        table.add_column(column)
    for v in versions:
        table.add_row(v.cluster_name, v.broker_name, v.broker_addr, str(v.counter),
                      format_ms(v.timestamp_ms))
    console.print(table)


@admin.command("getAclConfig")
@namesrv_option
@_targets
@click.option("--showSecrets", "show_secrets", is_flag=True,
              help="Print secret keys instead of hiding them.")
@json_option
@with_admin
async def get_acl_config(client: Admin, broker_addr: str | None, cluster: str | None,
                         show_secrets: bool, as_json: bool) -> None:
    """Show each broker's ACL rules (secret keys hidden unless --showSecrets)."""
    configs = await client.acl_config(broker_addr, cluster=cluster)
    for config in configs.values():
        for account in config.accounts:
            if not show_secrets and account.get("secretKey"):
                account["secretKey"] = _HIDDEN
    if as_json:
        print_json({address: {"globalWhiteAddrs": c.global_white_addrs,
                              "accounts": c.accounts} for address, c in configs.items()})
        return
    for address, config in configs.items():
        click.echo(f"{address}: globalWhiteRemoteAddresses "
                   f"{', '.join(config.global_white_addrs) or '(none)'}")
        table = Table(title=f"ACL accounts of {address}")
        for column in ("Access Key", "Secret Key", "Admin", "White Address", "Topic Default",
                       "Group Default", "Topic Perms", "Group Perms"):
            table.add_column(column)
        for a in config.accounts:
            table.add_row(str(a.get("accessKey")), str(a.get("secretKey")),
                          str(bool(a.get("admin"))).lower(),
                          str(a.get("whiteRemoteAddress") or ""),
                          str(a.get("defaultTopicPerm") or "DENY"),
                          str(a.get("defaultGroupPerm") or "DENY"),
                          ", ".join(a.get("topicPerms") or []),
                          ", ".join(a.get("groupPerms") or []))
        console.print(table)
