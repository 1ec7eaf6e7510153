"""The generated reference pages match the code: every key documented, no page out of date."""

from __future__ import annotations

from pathlib import Path

from tidemq.broker.config import BrokerConfig
from tidemq.cli.reference_docs import cli_page, config_page, effect_of, primary_keys
from tidemq.namesrv.config import NamesrvConfig
from tidemq.store.config import StoreConfig

DOCS = Path(__file__).resolve().parents[3] / "docs"
REGENERATE = "regenerate it: tidemq docs {0} > docs/{1}"


def test_every_config_key_has_an_effect_and_a_row():
    page = (DOCS / "configuration.md").read_text()
    for cls in (NamesrvConfig, BrokerConfig, StoreConfig):
        for key, _ in primary_keys(cls):
            assert effect_of(cls, key).strip(), f"{cls.__name__}.{key.key} says nowhere what " \
                "it does: add it to EFFECTS in tidemq/cli/reference_docs.py"
            assert f"| `{key.key}`" in page, key.key


def test_configuration_page_is_up_to_date():
    assert (DOCS / "configuration.md").read_text() == config_page(), REGENERATE.format(
        "config", "configuration.md")


def test_cli_page_is_up_to_date():
    page = (DOCS / "cli.md").read_text()
    assert page == cli_page(), REGENERATE.format("cli", "cli.md")
    assert "### `tidemq admin updateBrokerConfig`" in page
