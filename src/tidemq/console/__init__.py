"""The tidemq web console: an aiohttp application over the tidemq client (never over broker
internals), with plain server-rendered pages and inline SVG charts, so it works on a machine
with no internet. ``tidemq console`` serves it; ``tidemq dev`` serves it too, on the port it
prints. Read-only unless started with write actions enabled (docs/monitoring.md).
"""
