"""tidemq.namesrv: the name server — route tables, request handlers, broker expiry.

``NamesrvController(NamesrvConfig(...))`` is one name server; ``await start()`` /
``await shutdown()``.
"""

from tidemq.namesrv.config import NamesrvConfig
from tidemq.namesrv.controller import NamesrvController

__all__ = ["NamesrvConfig", "NamesrvController"]
