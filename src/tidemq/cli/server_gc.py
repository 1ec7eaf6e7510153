"""Garbage collection in a server process: the start-up's objects frozen out of it.

CPython's full (generation-2) collection visits every tracked object the process holds.
After a broker's start-up that is ~40,000 objects and more (modules, classes, functions,
configuration, tables), and a full collection took 23-24 ms of the event loop in a
``tidemq dev`` at 2,000 msg/s (timed with ``gc.callbacks``; one ran 33 s into a run): every
message in flight waited for it. Nearly all of those objects live as long as the process, so
visiting them finds nothing. ``gc.freeze()`` moves every object alive at that moment to a
permanent generation that collections skip; later full collections visit only what was
created since (the same approach large Python services take after start-up, as the CPython
docs suggest for forked workers). Cyclic garbage made before the freeze is collected first.

Reference counting still frees a frozen object once nothing refers to it; only a reference
cycle among frozen objects is never collected. So this is only for objects made by the
start-up itself (which live as long as the process); it is done once, when the server says
it is up.
"""

from __future__ import annotations

import gc


def freeze_start_up_objects() -> int:
    """Collect the start-up's garbage, then move every object still alive out of the garbage
    collector's view (``gc.freeze``). Returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
