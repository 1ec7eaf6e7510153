"""A server's start-up objects leave the garbage collector's view once it is up."""

import subprocess
import sys

# Run in a process of its own: freezing this test process would hide its objects from the
# collector for the rest of the session.
PROBE = """
import gc
import tidemq.broker.controller, tidemq.namesrv.controller  # what a server imports
from tidemq.cli.server_gc import freeze_start_up_objects
gc.collect()
before = len(gc.get_objects())
frozen = freeze_start_up_objects()
print(before, frozen, len(gc.get_objects()))
"""


def test_freezing_leaves_the_start_up_objects_out_of_later_collections():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=120, check=True)
    before, frozen, after = map(int, done.stdout.split())
    assert before > 10_000  # a server's modules, classes and tables
    assert frozen > before * 0.9  # nearly all of them (the collection first frees a few)
    assert after < 1_000  # what a full collection visits from now on
