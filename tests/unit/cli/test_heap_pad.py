"""The heap top pad of tidemq's own processes: set on glibc, an operator's value stands, and it
stops the fault-in of freed heap that a pull cycle's allocations paid."""

import platform
import subprocess
import sys

import pytest

from tidemq.cli.heap_pad import pad_heap_top

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

# Allocate and free ~1.2 MB at a time, as a pull cycle does (an answer, its reads, its
# messages), and print the page faults of 50 cycles.
CYCLES = """
import resource, sys
from tidemq.cli.heap_pad import pad_heap_top
if sys.argv[1] == "pad":
    assert pad_heap_top()
def cycle():
    blocks = [bytes(300_000) for _ in range(4)]
    return len(blocks)
cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    cycle()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    env = {"PATH": "/usr/bin:/bin"}  # no MALLOC_TOP_PAD_ from the caller's environment
    out = subprocess.run([sys.executable, "-c", CYCLES, mode], capture_output=True, text=True,
                         check=True, env=env, timeout=60)
    return int(out.stdout)


@pytest.mark.skipif(not GLIBC, reason="mallopt's top pad is glibc's; other C libraries differ")
def test_the_pad_stops_freed_heap_from_being_faulted_in_again():
    unpadded, padded = faults("none"), faults("pad")
    assert unpadded > 1000  # glibc trimmed the freed top and faulted it in again each cycle
    assert padded * 5 < unpadded


@pytest.mark.skipif(not GLIBC, reason="mallopt's top pad is glibc's; other C libraries differ")
def test_an_operator_s_malloc_top_pad_stands(monkeypatch):
    monkeypatch.setenv("MALLOC_TOP_PAD_", "0")
    assert pad_heap_top() is False
    monkeypatch.delenv("MALLOC_TOP_PAD_")
    assert pad_heap_top() is True
