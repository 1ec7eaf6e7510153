"""``tidemq admin dlqRedrive`` refuses an ambiguous request before touching any server."""

from __future__ import annotations

from click.testing import CliRunner

from tidemq.cli.admin_command import admin


def test_dlq_redrive_needs_all_or_message_ids_but_not_both():
    runner = CliRunner()
    neither = runner.invoke(admin, ["dlqRedrive", "-n", "127.0.0.1:1", "-g", "cg"])
    both = runner.invoke(admin, ["dlq-redrive", "-n", "127.0.0.1:1", "-g", "cg", "--all",
                                 "--msgId", "X"])
    for result in (neither, both):
        assert result.exit_code == 2
        assert "give either --all or one or more --msgId" in result.output


def test_dlq_verbs_are_listed_in_the_admin_help():
    listing = CliRunner().invoke(admin, ["--help"]).output
    assert "dlqList" in listing and "dlqRedrive" in listing
