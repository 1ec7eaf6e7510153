"""The properties of a batch's messages merged with the batch's, column by column.

A SEND_BATCH_MESSAGE stores each entry with its own properties, less WAIT, updated with the
batch-level properties (the request header's, CLUSTER added by the broker), and a UNIQ_KEY
added when it has none (docs/protocol.md §6.2, §6.5). Done with a dict per message, that is
decode, update, render: the costliest step of the batch path after the CRC.

``merge_batch_properties`` gives the same stored bytes without a dict, in the common case:
every entry's PROPERTIES is valid UTF-8, well-formed (each piece ``name\\x01value`` with a
non-empty name and value, no name twice) and names the same properties in the same order
(what a producer sends for messages made alike, e.g. UNIQ_KEY alone, or TAGS, KEYS, UNIQ_KEY),
or no entry has properties at all (the Spark sink's rows).
Then one split of the joined texts gives a column of values per name, checked with a few C
calls for the whole batch, and each stored text is one ``bytes %`` of a template that holds
the batch's values, or just the entry's text with the batch's properties appended. Any other
batch (or one with a DELAY, which the broker must refuse or keep by its rules) returns None
and takes the dict path, which stores the same bytes as before.

The dict path's order, kept here: the entry's names in their order (a name the batch also
sets keeps its place and takes the batch's value), then the batch's other names in the
batch's order, then UNIQ_KEY when neither had one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import add

from tidemq.protocol.message import (
    KEY_SEPARATOR,
    NAME_VALUE_SEPARATOR,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    PROPERTY_WAIT_STORE_MSG_OK,
)
from tidemq.store.key_columns import KeyColumns

_NAME_VALUE = NAME_VALUE_SEPARATOR.encode()
_PROPERTY = PROPERTY_SEPARATOR.encode()
_UNIQ_KEY_NAME = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX.encode()
# bytes.translate deletes these, leaving only the separators of a text, in order.
_NOT_SEPARATORS = bytes(code for code in range(256) if code not in (1, 2))


@dataclass(slots=True)
class MergedProperties:
    """Each message's stored PROPERTIES, and what the store indexes from them.

    ``tags`` is None when no message has TAGS; ``keys[i]`` is UNIQ_KEY then each KEYS token.
    ``without_dropped[i]``, when asked for (``drop``), is ``properties[i]`` without the
    batch's properties named in ``drop``, the other pairs in their order: what a
    transaction's commit stores (None when an entry itself names one of them).
    """

    properties: list[bytes]
    tags: list[str] | None
    keys: Sequence[Sequence[str]]  # KeyColumns in the common case
    without_dropped: list[bytes] | None = None


def merge_batch_properties(
    texts: Sequence[bytes],
    batch_properties: Mapping[str, str],
    new_unique_keys: Callable[[int], list[str]],
    drop: Collection[str] = (),
) -> MergedProperties | None:
    """Merge each entry's PROPERTIES (bytes as sent) with the batch's (module docstring).

    Args:
        texts: each entry's PROPERTIES bytes.
        batch_properties: the batch's properties, WAIT already removed, CLUSTER set.
        new_unique_keys: makes ``n`` UNIQ_KEYs, for the entries that have none.
        drop: batch property names to leave out of ``without_dropped`` (empty: no such
            column is made).
    Returns:
        The merged properties, or None when the batch is not in the common form (then merge
        with dicts; nothing here refuses a batch).
    """
    count = len(texts)
    if not count:
        return None
    if drop and "" in batch_properties.values():
        drop = ()  # decode_properties skips an empty value: the commit's rule must decide
    empty = texts.count(b"")
    if empty:
        if empty != count:
            return None
        try:
            return _merge_into_empty(count, batch_properties, new_unique_keys, drop)
        except UnicodeEncodeError:
            return None  # a batch value the dict path would fail on the same way
    joined = _PROPERTY.join(texts)
    if not joined.isascii():
        try:
            joined.decode("utf-8")
        except UnicodeDecodeError:
            return None
    names = texts[0].replace(_PROPERTY, _NAME_VALUE).split(_NAME_VALUE)[0::2]
    width = len(names)
    # Separators strictly alternate (one \x01 in each piece), so the tokens alternate name,
    # value; every entry names the same properties in the same order, none empty or twice.
    if joined.translate(None, _NOT_SEPARATORS) != (_NAME_VALUE + _PROPERTY) * (
        width * count - 1
    ) + _NAME_VALUE:
        return None
    tokens = joined.replace(_PROPERTY, _NAME_VALUE).split(_NAME_VALUE)
    values = tokens[1::2]
    if (
        tokens[0::2] != names * count
        or b"" in values
        or b"" in names
        or len(set(names)) != width
    ):
        return None
    try:
        return _merge(names, values, count, texts, batch_properties, new_unique_keys, drop)
    except UnicodeEncodeError:
        return None  # a batch value the dict path would fail on the same way


def _merge(
    names: list[bytes],
    values: list[bytes],
    count: int,
    texts: Sequence[bytes],
    batch_properties: Mapping[str, str],
    new_unique_keys: Callable[[int], list[str]],
    drop: Collection[str],
) -> MergedProperties | None:
    width = len(names)
    entry_names = [name.decode("utf-8") for name in names]
    if PROPERTY_DELAY_TIME_LEVEL in entry_names:
        return None
    # Where each stored name's values come from: a column of the entries', or one text.
    template: list[bytes] = []
    columns: list[list[bytes]] = []
    sources: dict[str, list[bytes] | bytes] = {}
    changed = False
    for position, name in enumerate(entry_names):
        if name == PROPERTY_WAIT_STORE_MSG_OK:
            changed = True
            continue
        if name in batch_properties:
            changed = True
            value = batch_properties[name].encode("utf-8")
            template.append(_literal(names[position], value))
            sources[name] = value
            continue
        column = values[position::width]
        template.append(names[position].replace(b"%", b"%%") + _NAME_VALUE + b"%b")
        columns.append(column)
        sources[name] = column
    # The batch's other names, in its order: name\x01value each (not yet escaped for %).
    suffix_names = [name for name in batch_properties if name not in sources]
    suffix = [
        name.encode("utf-8") + _NAME_VALUE + batch_properties[name].encode("utf-8")
        for name in suffix_names
    ]
    for name, value in batch_properties.items():
        sources.setdefault(name, value.encode("utf-8"))
    unique_keys = sources.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    unique_key_slot: list[bytes] = []
    if unique_keys is None:
        changed = True
        unique_keys = list(map(str.encode, new_unique_keys(count)))
        unique_key_slot.append(_UNIQ_KEY_NAME + _NAME_VALUE + b"%b")
        columns.append(unique_keys)

    def render(suffix: list[bytes]) -> list[bytes]:
        if not changed:
            # The common case: each entry's text as it is, the batch's properties after it.
            tail = _PROPERTY.join(suffix)
            return list(map(add, texts, repeat(_PROPERTY + tail))) if tail else list(texts)
        escaped = [piece.replace(b"%", b"%%") for piece in suffix]
        pattern = _PROPERTY.join(template + escaped + unique_key_slot)
        if columns:
            return list(map(pattern.__mod__, zip(*columns, strict=True)))
        return [pattern % ()] * count  # every value is the batch's

    without_dropped = None
    if drop and not any(name in drop for name in entry_names):
        without_dropped = render(
            [piece for name, piece in zip(suffix_names, suffix, strict=True) if name not in drop])
    return MergedProperties(
        render(suffix),
        _texts(sources.get(PROPERTY_TAGS), count),
        _index_keys(_texts(unique_keys, count), _texts(sources.get(PROPERTY_KEYS), count)),
        without_dropped,
    )


def _merge_into_empty(
    count: int,
    batch_properties: Mapping[str, str],
    new_unique_keys: Callable[[int], list[str]],
    drop: Collection[str],
) -> MergedProperties | None:
    # Entries without properties (the Spark sink's rows): each stores the batch's pairs in
    # the batch's order, then a UNIQ_KEY of its own unless the batch names one.
    batch_key = batch_properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    if batch_key == "":
        return None  # index_keys skips an empty UNIQ_KEY: left to the dict path
    heads = [_head(batch_properties, ())]
    if drop:
        heads.append(_head(batch_properties, drop))
    if batch_key is None:
        keys = new_unique_keys(count)
        key_texts = list(map(str.encode, keys))
        rendered = [
            list(map(add, repeat((head + _PROPERTY if head else b"") + _UNIQ_KEY_NAME
                                 + _NAME_VALUE), key_texts))
            for head in heads
        ]
    else:
        keys = [batch_key] * count
        rendered = [[head] * count for head in heads]
    tags = batch_properties.get(PROPERTY_TAGS)
    user_keys = batch_properties.get(PROPERTY_KEYS)
    return MergedProperties(
        rendered[0],
        None if tags is None else [tags] * count,
        _index_keys(keys, None if user_keys is None else [user_keys] * count),
        rendered[1] if drop else None,
    )


def _head(batch_properties: Mapping[str, str], drop: Collection[str]) -> bytes:
    # The batch's pairs but those in ``drop``, in the batch's order.
    return _PROPERTY.join(
        name.encode("utf-8") + _NAME_VALUE + value.encode("utf-8")
        for name, value in batch_properties.items() if name not in drop
    )


def _literal(name: bytes, value: bytes) -> bytes:
    # A fixed name and value in a ``bytes %`` template.
    return (name + _NAME_VALUE + value).replace(b"%", b"%%")


def _texts(source: list[bytes] | bytes | None, count: int) -> list[str] | None:
    if source is None:
        return None
    if isinstance(source, bytes):
        return [source.decode("utf-8")] * count
    return list(map(bytes.decode, source))


def _index_keys(unique_keys: list[str] | None, user_keys: list[str] | None
                ) -> Sequence[Sequence[str]]:
    # record_encoder.index_keys for each message: UNIQ_KEY (never empty here), then each
    # non-empty KEYS token.
    assert unique_keys is not None
    if user_keys is None:
        return KeyColumns((unique_keys,))
    if KEY_SEPARATOR not in "".join(user_keys):
        return KeyColumns((unique_keys, user_keys))
    return [
        [unique_key, *filter(None, keys.split(KEY_SEPARATOR))]
        for unique_key, keys in zip(unique_keys, user_keys, strict=True)
    ]
