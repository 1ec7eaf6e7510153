"""How the console shows a message body: text, JSON pretty-printed, or hex for binary."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

PREVIEW_BYTES_MAX = 64 * 1024  # a page shows at most this much of a body
HEX_BYTES_PER_LINE = 16


@dataclass(frozen=True, slots=True)
class BodyPreview:
    """``kind`` is "json", "text" or "hex"; ``text`` what to show; ``truncated`` whether
    the body was longer than the preview."""

    kind: str
    text: str
    truncated: bool


def preview_body(body: bytes) -> BodyPreview:
    """Pick the most readable form of ``body``: JSON (pretty) if it parses as a JSON object
    or array, UTF-8 text if it decodes, else a hex dump with an ASCII column."""
    shown = body[:PREVIEW_BYTES_MAX]
    truncated = len(body) > PREVIEW_BYTES_MAX
    stripped = shown.lstrip()
    if not truncated and stripped[:1] in (b"{", b"["):
        try:
            value = orjson.loads(shown)
        except orjson.JSONDecodeError:
            pass
        else:
            return BodyPreview("json", orjson.dumps(value, option=orjson.OPT_INDENT_2).decode(),
                               False)
    try:
        text = shown.decode("utf-8")
    except UnicodeDecodeError:
        if truncated:  # a multi-byte character may be cut at the end
            try:
                text = shown[:-3].decode("utf-8")
            except UnicodeDecodeError:
                return BodyPreview("hex", hex_dump(shown), truncated)
        else:
            return BodyPreview("hex", hex_dump(shown), truncated)
    if any(ord(c) < 32 and c not in "\t\r\n" for c in text[:4096]):
        return BodyPreview("hex", hex_dump(shown), truncated)
    return BodyPreview("text", text, truncated)


def hex_dump(data: bytes) -> str:
    """``offset  hex bytes  |ascii|`` lines, 16 bytes a line."""
    lines = []
    for start in range(0, len(data), HEX_BYTES_PER_LINE):
        chunk = data[start:start + HEX_BYTES_PER_LINE]
        ascii_part = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{start:08x}  {chunk.hex(' '):<47}  |{ascii_part}|")
    return "\n".join(lines)
