"""Source trees a benchmark compares: ``--variant NAME=SRC`` options and their run order.

A helper of the A/B harnesses (send_cost_bench.py, store_put_cost_bench.py,
put_answer_cost_bench.py ...), not a benchmark: it has no ``main``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

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


def run_variant_children(
    bench: str,
    script: str,
    variants: list[tuple[str, str]],
    runs: int,
    out_dir: str,
    child_args: list[str],
    *,
    quiet: bool = False,
) -> dict[str, list[dict[str, float]]]:
    """Run ``script --child-store <store> *child_args`` once per variant per run, in
    ``rotated`` order, each with its variant's src on PYTHONPATH and a store folder of its own
    in a work folder made under ``out_dir`` (each store removed after its child, the work
    folder at the end); returns each variant's results, the JSON object each child prints as
    its last line. Unless ``quiet``, prints each run's ``us_per_message`` and
    ``calls_per_message``.

    Raises:
        SystemExit: a child failed (its stderr is written out first), naming ``bench``,
            the variant and its tree.
    """
    os.makedirs(out_dir, exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix=f"{bench}-", dir=out_dir)
    try:
        return _run_children(bench, script, variants, runs, work_dir, child_args, quiet)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def _run_children(bench: str, script: str, variants: list[tuple[str, str]], runs: int,
                  work_dir: str, child_args: list[str], quiet: bool,
                  ) -> dict[str, list[dict[str, float]]]:
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in variants}
    for run in range(runs):
        for name, src in rotated(variants, run):
            store = os.path.join(work_dir, f"store-{run}-{name}")
            done = subprocess.run(
                [sys.executable, os.path.abspath(script), "--child-store", store, *child_args],
                env={**os.environ, "PYTHONPATH": src}, capture_output=True, text=True,
                timeout=600)
            shutil.rmtree(store, ignore_errors=True)
            if done.returncode:  # its traceback, not only "exit status 1"
                sys.stderr.write(done.stderr)
                raise SystemExit(f"{bench}: variant {name} ({src}) exited "
                                 f"{done.returncode}; its output is above")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            results[name].append(result)
            if not quiet:
                print(f"run {run + 1} {name:<10} {result['us_per_message']:.2f} us per "
                      f"message, {result['calls_per_message']:.1f} calls per message",
                      flush=True)
    return results


def cost_medians(results: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each variant's median ``us_per_message`` and ``calls_per_message`` over its runs."""
    return {
        name: {key: statistics.median(r[key] for r in runs)
               for key in ("us_per_message", "calls_per_message")}
        for name, runs in results.items()
    }


def print_cost_medians(title: str, medians: dict[str, dict[str, float]]) -> None:
    """Print ``title`` with the load average, then each variant's ``cost_medians`` line."""
    load = " ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"{title} (load average {load}):")
    for name, value in medians.items():
        print(f"{name:<10} {value['us_per_message']:.2f} us per message, "
              f"{value['calls_per_message']:.1f} calls per message")
