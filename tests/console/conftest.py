"""Fixtures of the console tests: a running ``tidemq dev`` (with its console, write actions
on) and headless Chromium driven through chromium-driver by Selenium.

Chromium is Debian's (``chromium`` and ``chromium-driver``, which scripts/test installs when
missing); nothing is downloaded. Every page a test visits can be kept as a screenshot in
tests/console/screenshots/ (git-ignored), named after the test and the step.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from server_processes import ServerProcess, free_port

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SCREENSHOTS = Path(__file__).parent / "screenshots"
CONSOLE_LINE = re.compile(r"console (http://[0-9.]+:\d+/)")
START_WAIT_S = 60.0
# Delay levels of the dev broker: short, so retries of the tests come back in a second.
DELAY_LEVELS = "1s 1s 1s 2s 4s " + " ".join(["1s"] * 13)


@dataclass
class DevCluster:
    """A running ``tidemq dev``: its name server and its console's URL."""

    process: ServerProcess
    console_url: str

    @property
    def namesrv(self) -> str:
        return self.process.addr


@pytest.fixture
def dev_cluster(tmp_path: Path, tidemq_server: Callable[..., ServerProcess]) -> DevCluster:
    def make_args(port: int) -> list[str]:
        return ["--namesrvPort", str(port),
                "--listenPort", str(free_port(neighbours=(-2, 1))),
                "--storePathRootDir", str(tmp_path / "dev" / "store"),
                "--mappedFileSizeCommitLog", str(16 * 1024 * 1024),
                "--mappedFileSizeConsumeQueue", str(30_000 * 20),
                "--maxHashSlotNum", "50000", "--maxIndexNum", "200000",
                "--messageDelayLevel", DELAY_LEVELS, "--traceTopicEnable", "true",
                "--consolePort", "0", "--consoleWrite", "true"]

    process = tidemq_server("dev", "dev", make_args)
    process.start()
    deadline = time.monotonic() + START_WAIT_S
    while True:
        match = CONSOLE_LINE.search(process.stdout_path.read_text(errors="replace"))
        if match:
            return DevCluster(process, match.group(1))
        if time.monotonic() > deadline:
            raise AssertionError(f"tidemq dev printed no console URL:\n{process.log_tail()}")
        time.sleep(0.1)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail("chromium and chromium-driver are needed (scripts/test installs them: "
                    "apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1000",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def screenshot(request: pytest.FixtureRequest, browser) -> Callable[[str], Path]:
    """``screenshot(step)`` saves the current page as screenshots/<test>-<step>.png."""
    SCREENSHOTS.mkdir(exist_ok=True)
    test_name = re.sub(r"[^A-Za-z0-9_-]+", "_", request.node.name)

    def take(step: str) -> Path:
        path = SCREENSHOTS / f"{test_name}-{step}.png"
        browser.save_screenshot(str(path))
        return path

    return take
