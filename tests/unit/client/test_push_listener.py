"""How listeners are called and what their answers mean."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from tidemq.client.listener import ConsumeResult, ListenerInvoker, MessageModel
from tidemq.protocol.message import MessageExt

BATCH = [MessageExt(topic="T", body=b"x")]


def test_suspend_is_rocketmqs_orderly_name_for_reconsume_later():
    assert ConsumeResult.SUSPEND_CURRENT_QUEUE_A_MOMENT is ConsumeResult.RECONSUME_LATER


def test_message_model_parses_names_and_rejects_others():
    assert MessageModel.parse("broadcasting") is MessageModel.BROADCASTING
    with pytest.raises(ValueError, match="CLUSTERING or BROADCASTING"):
        MessageModel.parse("fanout")


@pytest.mark.parametrize(("returned", "expected"), [
    (None, ConsumeResult.SUCCESS),
    (ConsumeResult.SUCCESS, ConsumeResult.SUCCESS),
    (ConsumeResult.RECONSUME_LATER, ConsumeResult.RECONSUME_LATER),
    (False, ConsumeResult.RECONSUME_LATER),  # not mistaken for success
    ("ok", ConsumeResult.RECONSUME_LATER),
])
def test_answers_of_plain_and_coroutine_listeners(run, returned, expected):
    def plain(messages):
        return returned

    async def coroutine(messages):
        return returned

    async def main():
        return [await ListenerInvoker(plain, None, "g").call(BATCH),
                await ListenerInvoker(coroutine, None, "g").call(BATCH)]

    assert run(main()) == [expected, expected]


def test_an_exception_counts_as_reconsume_later_and_is_logged(run, caplog):
    def plain(messages):
        raise ValueError("bad message")

    async def coroutine(messages):
        raise ValueError("bad message")

    async def main():
        return [await ListenerInvoker(plain, None, "g").call(BATCH),
                await ListenerInvoker(coroutine, None, "g").call(BATCH)]

    assert run(main()) == [ConsumeResult.RECONSUME_LATER] * 2
    assert sum("listener of g raised" in r.getMessage() for r in caplog.records) == 2


def test_plain_listeners_run_on_the_loop_or_in_the_given_threads(run):
    threads: list[str] = []

    def plain(messages):
        threads.append(threading.current_thread().name)

    async def main():
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="listener") as pool:
            on_loop = ListenerInvoker(plain, None, "g")
            in_pool = ListenerInvoker(plain, pool, "g")
            assert on_loop.inline and not in_pool.inline
            await on_loop.call(BATCH)
            await in_pool.call(BATCH)

    run(main())
    assert threads[0] == threading.current_thread().name
    assert threads[1].startswith("listener")


def test_callable_objects_with_an_async_call_are_coroutine_listeners(run):
    class Handler:
        async def __call__(self, messages):
            return ConsumeResult.SUCCESS

    invoker = ListenerInvoker(Handler(), None, "g")
    assert invoker.coroutine and not invoker.inline

    async def main():
        return await invoker.call(BATCH)

    assert run(main()) is ConsumeResult.SUCCESS
