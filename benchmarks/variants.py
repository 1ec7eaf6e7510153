"""Source trees a benchmark compares: ``--variant NAME=SRC`` options and their run order.

A helper of the A/B harnesses (send_cost_bench.py, store_put_cost_bench.py), not a
benchmark: it has no ``main``.
"""

from __future__ import annotations

import os

# This checkout's src/, which a variant's SRC of "." names.
HERE_SRC = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))


def src_variants(texts: list[str]) -> list[tuple[str, str]]:
    """``NAME=SRC`` options -> (name, absolute src folder) pairs; none given: this checkout
    as ``A``.

    Raises:
        SystemExit: an option is not NAME=SRC.
    """
    variants = []
    for text in texts or ["A=."]:
        name, sep, src = text.partition("=")
        if not sep or not name or not src:
            raise SystemExit(f"--variant {text!r}: expected NAME=SRC (SRC: a src/ folder or .)")
        variants.append((name, HERE_SRC if src == "." else os.path.abspath(src)))
    return variants


def rotated(variants: list[tuple[str, str]], run: int) -> list[tuple[str, str]]:
    """The variants in run ``run``'s order: each run starts one further along, so no tree
    always runs first (whichever runs first in a pair tends to be slower)."""
    shift = run % len(variants)
    return variants[shift:] + variants[:shift]
