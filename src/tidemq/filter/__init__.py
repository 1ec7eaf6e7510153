"""tidemq.filter."""
