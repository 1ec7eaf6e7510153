"""The verbs of ``tidemq admin``, one module per subject (see tidemq.cli.admin_command)."""
