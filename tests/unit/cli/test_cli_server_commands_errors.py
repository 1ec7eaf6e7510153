"""Server commands refuse bad settings before starting anything: one line, a clear exit code."""

from __future__ import annotations

import logging

import pytest
from click.testing import CliRunner

from tidemq.cli.main import main


@pytest.fixture
def runner():
    # The commands set up root logging on CliRunner's stream, which closes after each run;
    # put the root logger back so later tests do not log into a closed stream.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield CliRunner()
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["namesrv", "--bogusKey", "1"],
         "tidemq namesrv: unknown key bogusKey on the command line"),
        (["namesrv", "--listenPort"], "tidemq namesrv: option --listenPort needs a value"),
        (["namesrv", "stray"], "tidemq namesrv: unexpected argument 'stray'"),
        (["namesrv", "--listenPort", "99999"], "listenPort=99999 (from the command line): "
                                               "expected at most 65535"),
        (["broker", "--brokerNmae", "b"], "did you mean brokerName?"),
        (["broker", "--flushDiskType", "SYNC"], "expected one of ASYNC_FLUSH, SYNC_FLUSH"),
        (["broker", "--brokerRole", "SLAVE"], "brokerRole=SLAVE with brokerId=0"),
        (["dev", "--namesrvPort", "abc"], "tidemq dev: namesrvPort=abc (from the command line): "
                                          "expected a whole number"),
        (["dev", "--fileReservedTime", "soon"], "fileReservedTime=soon"),
    ],
)
def test_bad_settings_exit_2_with_one_line(runner, args, message):
    result = runner.invoke(main, args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_help_lists_the_commands(runner):
    result = runner.invoke(main, ["--help"])
    assert result.exit_code == 0
    for command in ("namesrv", "broker", "dev"):
        assert command in result.output


def test_namesrv_help_shows_the_contract(runner):
    result = runner.invoke(main, ["namesrv", "--help"])
    assert result.exit_code == 0
    assert "--listenPort 9876" in result.output
