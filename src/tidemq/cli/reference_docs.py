"""The reference pages generated from the code: every configuration key (docs/configuration.md)
and every command with its options (docs/cli.md).

Keys, defaults, allowed values and bounds come from the config dataclasses themselves
(``tidemq.config_loader.config_keys``); what a key does comes from, in order, ``EFFECTS``
below, the class docstring's ``Attributes:`` entry, or the comment written above the field.
``tests/unit/cli/test_reference_docs.py`` regenerates both pages and fails when the files
differ or a key has no effect written anywhere, so the pages cannot drift from the code.
Regenerate with ``tidemq docs config > docs/configuration.md`` and ``tidemq docs cli >
docs/cli.md``.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
from collections.abc import Iterable

import click

from tidemq.config_loader import ConfigKey, config_keys

# What a key does, for the keys whose class says it nowhere else (and a few whose comment
# explains why rather than what).
EFFECTS: dict[str, str] = {
    # name server
    "listenPort": "TCP port the server listens on (0 picks a free one).",
    "bindAddress": "Address the name server listens on; 0.0.0.0 serves other hosts.",
    "brokerChannelExpiredTime": "A broker not heard from for this long (ms) is dropped from "
                                "the routes.",
    "orderMessageEnable": "Answer routes with the order config (ORDER_TOPIC_CONFIG KV "
                          "namespace) of a topic.",
    "kvConfigPath": "File keeping the KV config across restarts; empty keeps it in memory.",
    "enableAllTopicList": "Serve GET_ALL_TOPIC_LIST_FROM_NAMESERVER (topicList).",
    "enableTopicList": "Serve GET_TOPICS_BY_CLUSTER.",
    "deleteTopicWithBrokerRegistration": "A master's registration also drops the topics its "
                                         "table no longer lists.",
    "metricsPromExporterHost": "Address of the Prometheus endpoint (empty: the listen "
                               "address).",
    "metricsPromExporterPort": "Port of the Prometheus endpoint.",
    "tlsServerMode": "disabled, permissive (TLS and plain both accepted) or enforcing (TLS "
                     "only); empty follows tlsEnable.",
    "tlsServerCertPath": "PEM certificate chain the server presents.",
    "tlsServerKeyPath": "PEM private key of that certificate.",
    "tlsServerKeyPassword": "Password of the private key, when it is encrypted.",
    "tlsServerNeedClientAuth": "none, optional or require a client certificate (mutual TLS).",
    "tlsServerTrustCertPath": "PEM CA bundle that client certificates are checked against.",
    # broker
    "brokerClusterName": "The cluster this broker belongs to (also a topic name).",
    "autoCreateTopicEnable": "A send to an unknown topic creates it from the TBW102 template; "
                             "false requires updateTopic first.",
    "registerNameServerPeriod": "How often (ms) the broker registers with every name server "
                                "(clamped to 10 s .. 60 s).",
    "longPollingEnable": "A pull that finds nothing is held until a message arrives or its "
                         "suspend time ends (instead of shortPollingTimeMills).",
    "brokerRole": "ASYNC_MASTER answers sends at once, SYNC_MASTER after a slave holds the "
                  "message, SLAVE is a read-only copy of its master.",
    "regionId": "Region name returned with every send (MSG_REGION).",
    "traceOn": "TRACE_ON switch returned with every send (clients may skip tracing when "
               "false).",
    "clusterTopicEnable": "Create a topic named after the cluster (what RocketMQ tools send "
                          "probes to).",
    "brokerTopicEnable": "Create a topic named after the broker (clusterRT, sendMsgStatus).",
    "traceTopicEnable": "Create the message-trace topic on this broker.",
    "msgTraceTopicName": "Name of the message-trace topic.",
    "shortPollingTimeMills": "Without long polling, how long (ms) a pull that found nothing "
                             "waits before it is answered.",
    "flushConsumerOffsetInterval": "How often (ms) changed consumer offsets are written to "
                                   "config/consumerOffset.json.",
    "notifyConsumerIdsChangedEnable": "Tell a group's consumers when a member joins or "
                                      "leaves, so they rebalance at once.",
    "autoCreateSubscriptionGroup": "A consumer group is created on its first heartbeat or "
                                   "pull; false requires updateSubGroup first.",
    "slaveReadEnable": "A slave may serve pulls of data the master has (lagging) consumers "
                       "redirected to.",
    "enablePropertyFilter": "Serve SQL92 property filters (consumers subscribing with an "
                            "SQL92 expression).",
    "transactionCheckInterval": "How often (ms) half messages whose producer went quiet are "
                                "checked.",
    "transactionCheckMax": "Checks of one half message before it is discarded.",
    # store
    "storePathRootDir": "Folder of the store: commit log, consume queues, index, config "
                        "files, checkpoint (and logs unless --logDir).",
    "flushDiskType": "ASYNC_FLUSH flushes in the background; SYNC_FLUSH answers a send only "
                     "once it is on disk (group commit).",
    "flushIntervalConsumeQueue": "How often (ms) consume-queue files are flushed (the index "
                                 "only once a minute, and at shutdown).",
    "maxMessageSize": "Largest message body accepted, bytes.",
    "messageIndexEnable": "Build the hash index of keys and message ids (queryMsgByKey, "
                          "queryMsgById with a topic).",
    "maxHashSlotNum": "Hash slots of one index file (4 bytes each, reserved when the file is "
                      "made).",
    "maxIndexNum": "Entries of one index file (20 bytes each, reserved as they fill).",
    "checkCRCOnRecover": "Check each record's body CRC when recovering after a crash.",
    "checkCrcOnRecover": "Check each record's body CRC when recovering after a crash.",
    "messageDelayLevel": "The delay levels a message may ask for (level 1 is the first).",
    "mappedFileSizeCommitLog": "Size of one commit-log segment, bytes (reserved whole when "
                               "it is made).",
    "mappedFileSizeConsumeQueue": "Size of one consume-queue file, bytes (a multiple of the "
                                  "20-byte entry).",
    "warmMapedFileEnable": "Prepare and zero the next commit-log segment ahead of need on a "
                           "thread (costs one segment of disk and a second write of every "
                           "segment; off, as in RocketMQ, is faster for appends).",
    "fileReservedTime": "Hours a commit-log segment is kept after its last write.",
    "deleteWhen": "Hours of the day (04, or 04;16) when expired segments are deleted.",
    "diskMaxUsedSpaceRatio": "Disk use (percent) above which expired segments are deleted at "
                             "any hour.",
}

_PAGE_HEAD = """\
# Configuration reference

<!-- Generated by `tidemq docs config` from the config classes; do not edit by hand.
     tests/unit/cli/test_reference_docs.py fails when this page and the code differ. -->

Every key of a name server (`tidemq namesrv`) and of a broker (`tidemq broker`, `tidemq dev`),
with its default and its effect. Keys are RocketMQ's names: a `namesrv.properties` or
`broker.conf` written for RocketMQ works as it is. Give them in a properties file (`-c FILE`,
one `key=value` per line) or on the command line (`--key value`, which wins over the file).
An unknown key or a value out of range stops the start with a message naming the key and what
is allowed. Keys marked *run time* may also be changed while the server runs
(`tidemq admin updateBrokerConfig -k KEY -v VALUE`, `updateNamesrvConfig`); a broker keeps such
changes in `<storePathRootDir>/config/runtimeSettings.properties` and applies them at its next
start after the config file and before the command line.
"""


def config_page() -> str:
    """docs/configuration.md."""
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.maintenance_processor import RUNTIME_KEYS
    from tidemq.namesrv.config import NamesrvConfig
    from tidemq.namesrv.processor import NAMESRV_RUNTIME_KEYS
    from tidemq.store.config import StoreConfig

    sections = [
        ("Name server", "NamesrvConfig: `tidemq namesrv`.", [NamesrvConfig],
         NAMESRV_RUNTIME_KEYS),
        ("Broker", "BrokerConfig: `tidemq broker` and `tidemq dev`.", [BrokerConfig],
         RUNTIME_KEYS),
        ("Store", "StoreConfig (RocketMQ's MessageStoreConfig): given to a broker like its "
         "other keys.", [StoreConfig], RUNTIME_KEYS),
    ]
    parts = [_PAGE_HEAD]
    for title, lead, classes, runtime in sections:
        parts.append(f"\n## {title}\n\n{lead}\n\n"
                     "| Key | Default | Allowed | Run time | Effect |\n"
                     "|---|---|---|---|---|\n")
        for cls in classes:
            for key, aliases in primary_keys(cls):
                parts.append(_row(cls, key, aliases, key.key in runtime))
    return "".join(parts)


def primary_keys(cls: type) -> list[tuple[ConfigKey, list[str]]]:
    """Each configurable field's primary key and its aliases, in field order."""
    by_field: dict[str, list[ConfigKey]] = {}
    for config_key in config_keys(cls):
        by_field.setdefault(config_key.field_name, []).append(config_key)
    return [(keys[0], [k.key for k in keys[1:]]) for keys in by_field.values()]


def effect_of(cls: type, key: ConfigKey) -> str:
    """What ``key`` does (module docstring); empty when nothing says it."""
    if key.key in EFFECTS:
        return EFFECTS[key.key]
    attributes = _docstring_attributes(cls)
    if key.field_name in attributes:
        return attributes[key.field_name]
    return _field_comments(cls).get(key.field_name, "")


def _row(cls: type, key: ConfigKey, aliases: list[str], runtime: bool) -> str:
    default = _default_text(cls, key.field_name)
    allowed = ""
    if key.choices:
        allowed = ", ".join(key.choices)
    elif key.minimum is not None or key.maximum is not None:
        low = "" if key.minimum is None else f"{key.minimum:g}"
        high = "" if key.maximum is None else f"{key.maximum:g}"
        allowed = f"{low} .. {high}".strip()
    elif key.value_type is bool:
        allowed = "true, false"
    name = f"`{key.key}`" + "".join(f" (alias `{alias}`)" for alias in aliases)
    cells = [name, f"`{default}`" if default else "(none)", allowed,
             "yes" if runtime else "", effect_of(cls, key)]
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |\n"


def _default_text(cls: type, field_name: str) -> str:
    for config_field in dataclasses.fields(cls):
        if config_field.name != field_name:
            continue
        if config_field.default is not dataclasses.MISSING:
            value = config_field.default
        elif config_field.default_factory is not dataclasses.MISSING:
            value = config_field.default_factory()
        else:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, enum.Enum):
            return str(value.value)
        return "" if value is None else str(value)
    return ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _docstring_attributes(cls: type) -> dict[str, str]:
    """``name: text`` entries (and their indented continuation lines) under Attributes:."""
    doc = inspect.getdoc(cls) or ""
    found: dict[str, str] = {}
    current: list[str] = []
    in_attributes = False
    for line in doc.splitlines():
        if line.strip() == "Attributes:":
            in_attributes = True
            continue
        if not in_attributes:
            continue
        match = re.match(r"    ([a-z_0-9, ]+):\s*(.*)", line)
        if match:
            current = [name.strip() for name in match.group(1).split(",")]
            for name in current:
                found[name] = match.group(2).strip()
        elif line.startswith("        "):
            for name in current:
                found[name] = f"{found[name]} {line.strip()}"
        elif line.strip():
            in_attributes = False
    return found


def _field_comments(cls: type) -> dict[str, str]:
    """The comment lines written right above each field of the class body or of a config
    dataclass it inherits from (``ServerSecurityConfig``); the class's own comments win."""
    found: dict[str, str] = {}
    for owner in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(owner):
            continue
        pending: list[str] = []
        for line in inspect.getsource(owner).splitlines():
            stripped = line.strip()
            if stripped.startswith("# --"):
                pending = []
            elif stripped.startswith("#"):
                pending.append(stripped.lstrip("#").strip())
            else:
                match = re.match(r"([a-z_0-9]+)\s*:", stripped)
                if match and pending:
                    found[match.group(1)] = " ".join(pending)
                pending = []
    return found


# -- the CLI reference --------------------------------------------------------------------------

_CLI_HEAD = """\
# Command reference

<!-- Generated by `tidemq docs cli` from the commands themselves; do not edit by hand.
     tests/unit/cli/test_reference_docs.py fails when this page and the code differ. -->

Every `tidemq` command and `tidemq admin` verb with its options, as `--help` prints them.
Admin verbs keep mqadmin's names and short options; each also answers to kebab case
(`topic-list`) and takes `--json` for machine-readable output. Server commands also take any
configuration key as `--key value` (see [configuration.md](configuration.md)).
"""
_HELP_WIDTH = 100


def cli_page() -> str:
    """docs/cli.md."""
    from tidemq.cli.main import main

    parts = [_CLI_HEAD]
    root = click.Context(main, info_name="tidemq", terminal_width=_HELP_WIDTH,
                         max_content_width=_HELP_WIDTH)
    for name in main.list_commands(root):
        command = main.get_command(root, name)
        if command is None or name == "docs":
            continue
        parts.append(_command_section(command, [name], root))
        if isinstance(command, click.Group):
            group_context = click.Context(command, info_name=name, parent=root,
                                          terminal_width=_HELP_WIDTH,
                                          max_content_width=_HELP_WIDTH)
            for verb in sorted(command.list_commands(group_context), key=str.lower):
                sub = command.get_command(group_context, verb)
                if sub is not None:
                    parts.append(_command_section(sub, [name, verb], group_context, level=3))
    return "".join(parts)


def _command_section(command: click.Command, path: Iterable[str], parent: click.Context,
                     level: int = 2) -> str:
    words = list(path)
    # make_context applies the command's own context_settings (e.g. -h for --help).
    context = command.make_context(words[-1], [], parent=parent, resilient_parsing=True,
                                   terminal_width=_HELP_WIDTH, max_content_width=_HELP_WIDTH)
    help_text = command.get_help(context).rstrip()
    return f"\n{'#' * level} `tidemq {' '.join(words)}`\n\n```\n{help_text}\n```\n"


@click.group("docs")
def docs() -> None:
    """Print the generated reference pages (docs/configuration.md, docs/cli.md)."""


@docs.command("config")
def docs_config() -> None:
    """Every configuration key with its default and effect, as Markdown."""
    click.echo(config_page(), nl=False)


@docs.command("cli")
def docs_cli() -> None:
    """Every command and admin verb with its options, as Markdown."""
    click.echo(cli_page(), nl=False)
