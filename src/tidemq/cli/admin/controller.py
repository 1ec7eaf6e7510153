"""Automatic failover's verbs (RocketMQ 5's names): getControllerMetaData, getSyncStateSet,
getBrokerEpoch and electMaster. They read and change the controller's records in etcd
directly (-a: etcd's client endpoints, the brokers' controllerAddr); docs/failover.md.

electMaster obeys the controller's rules (controller/election.py): it refuses a replica
that is not alive or not in the sync-state set, unless forced, and says why; the decision is
one compare-and-set on the group's state, like the controller's own.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Coroutine
from typing import Any

import click

from tidemq.cli.admin.base import admin, format_ms, json_option, print_json, print_table
from tidemq.controller.election import ElectionRefused, decide
from tidemq.controller.etcd import ControllerStore, GroupView, parse_endpoints
from tidemq.controller.keys import DEFAULT_PREFIX
from tidemq.errors import TidemqError
from tidemq.remoting.loop import run as run_on_loop

CONTROLLER_ADDR_ENV = "TIDEMQ_CONTROLLER_ADDR"


def _controller_options(function: Callable[..., Any]) -> Callable[..., Any]:
    function = click.option(
        "--controllerEtcdPrefix", "prefix", default=DEFAULT_PREFIX, show_default=True,
        help="The cluster's key prefix in etcd (the brokers' controllerEtcdPrefix).")(function)
    return click.option(
        "-a", "--controllerAddress", "controller_addr",
        default=lambda: os.environ.get(CONTROLLER_ADDR_ENV, "127.0.0.1:2379"),
        show_default=f"${CONTROLLER_ADDR_ENV} or 127.0.0.1:2379",
        help="etcd's client endpoints, host:port;host:port (the brokers' controllerAddr).",
    )(function)


def _with_store(function: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    @functools.wraps(function)
    def wrapper(controller_addr: str, prefix: str, **options: Any) -> None:
        async def main() -> None:
            async with ControllerStore(parse_endpoints(controller_addr, "-a"), prefix) as store:
                await function(store, **options)

        try:
            run_on_loop(main())
        except (TidemqError, ValueError) as e:
            raise click.ClickException(str(e)) from None

    return wrapper


async def _group(store: ControllerStore, broker_name: str) -> GroupView:
    view = await store.read_group(broker_name)
    if view.state is None and not view.replicas:
        known = await store.group_names()
        raise click.ClickException(
            f"no broker group {broker_name!r} in etcd under {store.keys.prefix} "
            f"(known: {', '.join(known) or 'none'}); check -b and --controllerEtcdPrefix")
    return view


@admin.command("getControllerMetaData")
@_controller_options
@json_option
@_with_store
async def get_controller_meta_data(store: ControllerStore, as_json: bool) -> None:
    """Show etcd's members, the cluster using the prefix, the running controllers and groups."""
    meta = {
        "controllerAddr": store.endpoints_text,
        "answeredBy": store.endpoint,
        "prefix": store.keys.prefix,
        "cluster": await store.cluster_name(),
        "etcdMembers": await store.members(),
        "controllers": await store.controllers(),
        "groups": await store.group_names(),
    }
    if as_json:
        print_json(meta)
        return
    rows = [("controllerAddr", meta["controllerAddr"]), ("answeredBy", meta["answeredBy"]),
            ("prefix", meta["prefix"]), ("cluster", meta["cluster"] or "-"),
            ("etcdMembers", "; ".join(meta["etcdMembers"])),
            ("controllers", "; ".join(f"{k} ({v})" for k, v in meta["controllers"].items())
             or "none running"),
            ("groups", ", ".join(meta["groups"]) or "none")]
    print_table("Controller", ("Key", "Value"), rows)


@admin.command("getSyncStateSet")
@_controller_options
@click.option("-b", "--brokerName", "broker_name", required=True, help="The broker group.")
@json_option
@_with_store
async def get_sync_state_set(store: ControllerStore, broker_name: str, as_json: bool) -> None:
    """Show a group's master, epoch, sync-state set and every live replica's offset."""
    view = await _group(store, broker_name)
    state = view.state
    replicas = [{
        "brokerId": r.broker_id, "address": r.address, "haAddress": r.ha_address,
        "confirmedOffset": r.confirmed_offset, "epoch": r.epoch, "role": r.role,
        "inSyncStateSet": state is not None and r.broker_id in state.sync_state_set,
        "isMaster": state is not None and r.broker_id == state.master_broker_id
        and r.lease == state.master_lease,
    } for r in sorted(view.replicas.values(), key=lambda r: r.broker_id)]
    if as_json:
        print_json({"state": state.to_dict() if state else None, "replicas": replicas,
                    "masterAlive": view.master_alive()})
        return
    if state is not None:
        print_table(f"Broker group {broker_name}", ("Key", "Value"), [
            ("masterBrokerId", state.master_broker_id),
            ("masterAddress", state.master_address),
            ("masterHaAddress", state.master_ha_address),
            ("masterEpoch", state.master_epoch),
            ("masterAlive", view.master_alive()),
            ("masterFlavour", state.master_flavour),
            ("syncStateSet", ", ".join(str(b) for b in sorted(state.sync_state_set))),
            ("syncStateSetEpoch", state.sync_state_set_epoch),
        ])
    print_table("Live replicas", ("brokerId", "Address", "Confirmed offset", "Epoch", "Role",
                                  "In sync-state set"),
                [(r["brokerId"], r["address"], r["confirmedOffset"], r["epoch"], r["role"],
                  r["inSyncStateSet"]) for r in replicas])


@admin.command("getBrokerEpoch")
@_controller_options
@click.option("-b", "--brokerName", "broker_name", required=True, help="The broker group.")
@json_option
@_with_store
async def get_broker_epoch(store: ControllerStore, broker_name: str, as_json: bool) -> None:
    """Show a group's election history: each epoch, its master, start offset and, under
    ASYNC_MASTER, the bytes the old master may have acknowledged that the new one lacks."""
    await _group(store, broker_name)
    history = await store.history(broker_name)
    if as_json:
        print_json([record.to_dict() for record in history])
        return
    rows = []
    for record in history:
        loss = (f"{record.loss_from_offset}..{record.loss_to_offset} "
                f"({record.possible_loss_bytes} bytes)" if record.possible_loss_bytes else "none")
        rows.append((record.epoch, record.master_broker_id, record.master_address,
                     record.start_offset, record.previous_master_broker_id, record.reason,
                     record.flavour, loss, format_ms(record.elected_at_ms)))
    print_table(f"Epochs of {broker_name}", (
        "Epoch", "Master", "Address", "Start offset", "Previous master", "Reason", "Flavour",
        "Possible loss (offsets)", "Elected at"), rows)


@admin.command("electMaster")
@_controller_options
@click.option("-b", "--brokerName", "broker_name", required=True, help="The broker group.")
@click.option("-i", "--brokerId", "broker_id", type=int, default=None,
              help="The replica to make master (default: the best live member of the set).")
@click.option("--force", is_flag=True,
              help="Allow a replica outside the sync-state set (it may lack acknowledged "
                   "messages: they are lost).")
@json_option
@_with_store
async def elect_master(store: ControllerStore, broker_name: str, broker_id: int | None,
                       force: bool, as_json: bool) -> None:
    """Make a replica the group's master now, by the controller's rules."""
    view = await _group(store, broker_name)
    try:
        election = decide(view, requested_broker_id=broker_id, force=force, manual=True)
    except ElectionRefused as e:
        raise click.ClickException(f"electMaster refused: {e.reason}") from None
    if not await store.put_state(election.state, view.state_revision, election.record):
        raise click.ClickException(
            f"electMaster: the state of {broker_name!r} changed while deciding (another "
            "election or a sync-state change); run it again")
    record = election.record
    if as_json:
        print_json(record.to_dict())
        return
    click.echo(f"brokerId {record.master_broker_id} ({record.master_address}) is master of "
               f"{broker_name} for epoch {record.epoch}; its agent takes over within a "
               "heartbeat")
