"""``tidemq admin``: RocketMQ's mqadmin verbs over the tidemq Admin client.

Verbs keep mqadmin's names and short options (``updateTopic -n ns -t T -c DefaultCluster``);
each may also be written in kebab case (``update-topic``). Expected failures (an unknown topic,
a broker refusal, a name server that is down) print one line naming the problem and exit with
status 1; only bugs show a traceback. Tables are drawn with rich (as wide as their content
when the output is not a terminal); ``--json`` prints machine-readable output instead.

The verbs live in ``tidemq.cli.admin``, one module per subject; the group and the helpers
they share are in ``tidemq.cli.admin.base``. Importing a verb module registers its verbs:
a new module is added to the import list below.
"""

from __future__ import annotations

from tidemq.cli.admin import (  # noqa: F401  (each import registers that module's verbs)
    acl,
    clients,
    clusters,
    controller,
    dead_letters,
    groups,
    messages,
    sending,
    servers,
    topics,
    traces,
)
from tidemq.cli.admin.base import admin

__all__ = ["admin"]
