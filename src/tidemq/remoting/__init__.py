"""tidemq.remoting."""
