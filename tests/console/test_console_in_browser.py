"""The web console in headless Chromium against a running ``tidemq dev``: find a message by
key (its body pretty-printed, its trace), watch a group's lag fall while a consumer runs,
redrive a dead letter, reset a group's offsets to a time, create and delete a topic; and a
read-only console refuses every change.

The messages are made with the tidemq client in the test process; everything checked is
what the browser shows. Waits are bounded polls; screenshots of each step are kept in
tests/console/screenshots/.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

import pytest
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tidemq import sync
from tidemq.client import Admin, ConsumeResult, Message, MessageExt, Producer, PushConsumer
from tidemq.console.server import ConsoleServer

pytestmark = pytest.mark.console

WAIT_S = 90.0


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


async def create_topic(namesrv: str, topic: str, queues: int = 2) -> None:
    async with Admin(namesrv) as admin:
        await admin.create_topic(topic, queues)
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                await admin.topic_route(topic)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.1)


def _detached(error: WebDriverException) -> bool:
    """True for chromedriver's way of saying an element's page went away under a command
    (a navigation in between): "unhandled inspector error: ... Node with given id does not
    belong to the document", an unknown error rather than StaleElementReferenceException."""
    return isinstance(error, StaleElementReferenceException) or (
        "does not belong to the document" in str(error))


def text_of(browser, element_id: str) -> str:
    """The text of the element ``element_id``, waiting (bounded) for a page that is still
    loading after a click to show it; found again if its page was replaced under the read."""
    def read(driver) -> tuple[str] | None:  # a tuple: an empty text is an answer too
        try:
            return (driver.find_element(By.ID, element_id).text,)
        except NoSuchElementException:
            return None
        except WebDriverException as e:
            if _detached(e):
                return None
            raise

    return WebDriverWait(browser, WAIT_S).until(read)[0]


def submit_and_wait(browser, button) -> None:
    """Click a form's button and wait until the page it leads to has replaced this one."""
    old_page = browser.find_element(By.TAG_NAME, "html")
    button.click()

    def replaced(_driver) -> bool:
        try:
            old_page.is_enabled()
        except WebDriverException as e:
            if _detached(e):
                return True
            raise
        return False

    WebDriverWait(browser, WAIT_S).until(replaced)


def fill_and_submit(browser, form_id: str, values: dict[str, str]) -> None:
    form = browser.find_element(By.ID, form_id)
    for name, value in values.items():
        box = form.find_element(By.NAME, name)
        box.clear()
        box.send_keys(value)
    submit_and_wait(browser, form.find_element(By.CSS_SELECTOR, "button[type=submit]"))


def test_find_a_message_by_key_with_its_body_and_trace(dev_cluster, browser, screenshot
                                                       ) -> None:
    namesrv = dev_cluster.namesrv

    async def produce() -> str:
        await create_topic(namesrv, "ConsoleOrders")
        async with Producer("console_producer", namesrv, enable_msg_trace=True) as producer:
            await producer.send(Message("ConsoleOrders", b"other", keys=["order-1"]))
            result = await producer.send(Message(
                "ConsoleOrders", b'{"order": 42, "items": ["tea", "cake"]}', tags="paid",
                keys=["order-42"]))
        return result.msg_id

    msg_id = asyncio.run(produce())
    browser.get(dev_cluster.console_url)
    screenshot("cluster")
    assert "broker-a" in text_of(browser, "brokers")
    browser.get(dev_cluster.console_url + "messages")
    fill_and_submit(browser, "search-key", {"key_topic": "ConsoleOrders", "key": "order-42"})
    wait_until(lambda: msg_id in text_of(browser, "results"), "the message in the results")
    screenshot("search-by-key")
    rows = browser.find_elements(By.CSS_SELECTOR, "#results tr")
    assert len(rows) == 2  # the header and the one message with that key
    submit_and_wait(browser, browser.find_element(By.LINK_TEXT, msg_id))
    assert text_of(browser, "body-kind") == "json"
    body = text_of(browser, "body")
    assert '"order": 42' in body and '"tea"' in body and "\n" in body  # pretty-printed
    assert "order-42" in text_of(browser, "message")
    screenshot("message")
    submit_and_wait(browser, browser.find_element(By.LINK_TEXT, "trace of this message"))

    def traced() -> bool:
        browser.refresh()
        return bool(browser.find_elements(By.ID, "trace")) and "console_producer" in text_of(
            browser, "trace")

    wait_until(traced, "the Pub record in the trace page")
    trace = text_of(browser, "trace")
    assert "Pub" in trace and "success" in trace and "ConsoleOrders" in trace
    screenshot("trace")

    # by id (a client id needs its topic): straight to the message
    browser.get(dev_cluster.console_url + "messages")
    fill_and_submit(browser, "search-id", {"id": msg_id, "topic": "ConsoleOrders"})
    assert "order-42" in text_of(browser, "message")
    # by time range: both messages of the topic
    browser.get(dev_cluster.console_url + "messages")
    fill_and_submit(browser, "search-range", {"range_topic": "ConsoleOrders", "begin": "0",
                                              "end": "now"})
    rows = browser.find_elements(By.CSS_SELECTOR, "#results tr")
    assert len(rows) == 3 and msg_id in text_of(browser, "results")  # a header, two messages
    screenshot("search-by-time")


def test_group_lag_falls_as_a_consumer_runs(dev_cluster, browser, screenshot) -> None:
    namesrv = dev_cluster.namesrv
    total = 300

    async def produce() -> None:
        await create_topic(namesrv, "ConsoleLag")
        async with Producer("console_lag_producer", namesrv) as producer:
            await producer.send_batch([Message("ConsoleLag", f"m-{i}") for i in range(total)])

    asyncio.run(produce())
    consumed: list[int] = []

    def slow_listener(messages: list[MessageExt]) -> ConsumeResult:
        time.sleep(0.05 * len(messages))  # slow enough for the lag to be seen falling
        consumed.extend(range(len(messages)))
        return ConsumeResult.SUCCESS

    consumer = sync.PushConsumer("console_lag_group", namesrv, consume_from="FIRST",
                                 pull_batch_size=8, consume_concurrency=1,
                                 persist_consumer_offset_interval_ms=200)
    consumer.subscribe("ConsoleLag", "*")
    consumer.listener(slow_listener)
    consumer.start()
    try:
        lags: list[int] = []

        def lag_seen() -> int:
            browser.get(dev_cluster.console_url + "group?group=console_lag_group")
            lags.append(int(text_of(browser, "total-lag")))
            return lags[-1]

        wait_until(lambda: lag_seen() > 0, "the group's first committed offsets")
        screenshot("lag-high")
        assert "console_lag_group" in browser.title
        assert browser.find_elements(By.CSS_SELECTOR, "#members tr")  # one member online
        wait_until(lambda: lag_seen() == 0, "the lag to fall to 0", timeout_s=180)
        screenshot("lag-zero")
    finally:
        consumer.close()
    positive = [lag for lag in lags if lag > 0]
    assert positive and positive[0] <= total
    assert len(set(positive)) >= 2, f"lag never changed between reloads: {lags}"
    assert lags == sorted(lags, reverse=True) or lags[-1] == 0
    assert len(consumed) >= total


def test_redrive_a_dead_letter(dev_cluster, browser, screenshot) -> None:
    namesrv = dev_cluster.namesrv
    group = "console_dlq_group"
    deliveries: list[str] = []

    async def dead_letter() -> str:
        await create_topic(namesrv, "ConsoleDlq")
        async with Producer("console_dlq_producer", namesrv) as producer:
            result = await producer.send(Message("ConsoleDlq", b"poison", keys=["p-1"]))
        consumer = PushConsumer(group, namesrv, consume_from="FIRST", max_reconsume_times=0)
        consumer.subscribe("ConsoleDlq", "*")

        @consumer.listener
        def fail(messages: list[MessageExt]) -> ConsumeResult:
            deliveries.extend(m.msg_id for m in messages)
            return ConsumeResult.RECONSUME_LATER

        async with consumer, Admin(namesrv) as admin:
            deadline = time.monotonic() + WAIT_S
            while not await admin.dead_letters(group):
                assert time.monotonic() < deadline, "the message never reached the DLQ"
                await asyncio.sleep(0.2)
        return result.msg_id

    msg_id = asyncio.run(dead_letter())
    browser.get(dev_cluster.console_url + "dlq?group=" + group)
    assert text_of(browser, "dlq-count").startswith("1 dead letter")
    assert msg_id in text_of(browser, "dead-letters")
    screenshot("dlq")
    submit_and_wait(browser, browser.find_element(By.ID, f"redrive-{msg_id}").find_element(
        By.CSS_SELECTOR, "button"))
    assert f"1 dead letter(s) sent back to their topic: {msg_id}" in text_of(browser, "flash")
    screenshot("redriven")

    async def consumed_again() -> list[str]:
        again: list[str] = []
        consumer = PushConsumer("console_dlq_check", namesrv, consume_from="FIRST")
        consumer.subscribe("ConsoleDlq", "*")
        consumer.listener(lambda messages: again.extend(m.msg_id for m in messages))
        async with consumer:
            deadline = time.monotonic() + WAIT_S
            while again.count(msg_id) < 2:  # the original and the redriven copy
                assert time.monotonic() < deadline, f"redriven copy not consumed: {again}"
                await asyncio.sleep(0.2)
        return again

    assert asyncio.run(consumed_again()).count(msg_id) == 2


def test_reset_offset_to_a_time(dev_cluster, browser, screenshot) -> None:
    namesrv = dev_cluster.namesrv
    group = "console_reset_group"

    async def consume_all() -> None:
        await create_topic(namesrv, "ConsoleReset")
        async with Producer("console_reset_producer", namesrv) as producer:
            await producer.send_batch([Message("ConsoleReset", f"r-{i}") for i in range(40)])
        seen: list[str] = []
        consumer = PushConsumer(group, namesrv, consume_from="FIRST",
                                persist_consumer_offset_interval_ms=200)
        consumer.subscribe("ConsoleReset", "*")
        consumer.listener(lambda messages: seen.extend(m.msg_id for m in messages))
        async with consumer:
            deadline = time.monotonic() + WAIT_S
            while len(seen) < 40:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)

    asyncio.run(consume_all())
    browser.get(dev_cluster.console_url + "group?group=" + group)
    wait_until(lambda: (browser.refresh() or True) and text_of(browser, "total-lag") == "0",
               "every offset committed")
    screenshot("before-reset")
    fill_and_submit(browser, "reset-offset", {"time": "0"})
    assert "reset to" in text_of(browser, "flash")
    assert text_of(browser, "total-lag") == "40"  # back to the beginning
    screenshot("after-reset")


def test_create_and_delete_a_topic(dev_cluster, browser, screenshot) -> None:
    browser.get(dev_cluster.console_url + "topics")
    fill_and_submit(browser, "create-topic", {"topic": "ConsoleMade", "queues": "3"})
    assert "ConsoleMade saved" in text_of(browser, "flash")

    def queue_rows() -> int:
        if not browser.find_elements(By.ID, "queues"):
            browser.refresh()  # the name server had not learnt the route yet
            return 0
        return len(browser.find_elements(By.CSS_SELECTOR, "#queues tr")) - 1

    wait_until(lambda: queue_rows() == 3, "the new topic's three queues")
    screenshot("created")
    submit_and_wait(browser, browser.find_element(By.ID, "delete-topic").find_element(
        By.CSS_SELECTOR, "button"))
    assert "ConsoleMade deleted" in text_of(browser, "flash")

    def listed() -> bool:
        browser.get(dev_cluster.console_url + "topics?q=ConsoleMade")
        return "ConsoleMade" in text_of(browser, "topics")

    wait_until(lambda: not listed(), "the topic to leave the list")


def test_read_only_console_refuses_changes(dev_cluster) -> None:
    async def scenario() -> tuple[int, str, str]:
        server = ConsoleServer(dev_cluster.namesrv, port=0)  # write actions off
        await server.start()
        try:
            def post() -> int:
                data = urllib.parse.urlencode({"topic": "Sneaky", "queues": "1"}).encode()
                try:
                    urllib.request.urlopen(server.url + "topics/update", data, timeout=30)
                except urllib.error.HTTPError as e:
                    e.close()
                    return e.code
                return 200

            def get(path: str) -> str:
                with urllib.request.urlopen(server.url + path, timeout=30) as response:
                    return response.read().decode()

            loop = asyncio.get_running_loop()
            status = await loop.run_in_executor(None, post)
            topics = await loop.run_in_executor(None, get, "topics")
            topic = await loop.run_in_executor(None, get, "topic?topic=TBW102")
            return status, topics, topic
        finally:
            await server.close()

    status, topics_html, topic_html = asyncio.run(scenario())
    assert status == 403
    assert "read-only" in topics_html and 'id="create-topic"' not in topics_html
    assert 'id="delete-topic"' not in topic_html
