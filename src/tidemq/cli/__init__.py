"""tidemq.cli."""
