"""The web console as a server: ``tidemq console`` runs, serves and stops; against a broker
with ACL on it signs every request with the keys it was given, so an admin account's console
creates a topic, and a console without keys shows the broker's refusal (a page naming it,
status 502) instead of changing anything.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tidemq.client import Admin
from tidemq.client.security import Credentials
from tidemq.console.server import ConsoleServer

pytestmark = pytest.mark.integration

OPERATOR = Credentials("operator", "operator-secret")
ACL_YAML = """\
globalWhiteRemoteAddresses:
accounts:
  - accessKey: operator
    secretKey: operator-secret
    admin: true
"""


def post(url: str, fields: dict[str, str]) -> tuple[int, str]:
    data = urllib.parse.urlencode(fields).encode()
    try:
        with urllib.request.urlopen(url, data, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read().decode()


def test_console_signs_with_its_credentials(tidemq_cluster, tmp_path: Path) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL_YAML)
    cluster = tidemq_cluster(broker_overrides={"aclEnable": "true",
                                               "aclFilePath": str(acl_file)})
    namesrv = cluster.namesrv_addr

    async def scenario() -> tuple[tuple[int, str], tuple[int, str], list[str]]:
        loop = asyncio.get_running_loop()
        signed = ConsoleServer(namesrv, port=0, write_enabled=True, credentials=OPERATOR)
        unsigned = ConsoleServer(namesrv, port=0, write_enabled=True)
        await signed.start()
        await unsigned.start()
        try:
            refused = await loop.run_in_executor(
                None, post, unsigned.url + "topics/update", {"topic": "Unsigned", "queues": "2"})
            created = await loop.run_in_executor(
                None, post, signed.url + "topics/update", {"topic": "Signed", "queues": "2"})
        finally:
            await signed.close()
            await unsigned.close()
        async with Admin(namesrv, credentials=OPERATOR) as admin:
            topics = await admin.topic_list()
        return refused, created, topics

    refused, created, topics = asyncio.run(scenario())
    assert refused[0] == 502 and "Unsigned" in refused[1] and 'id="error"' in refused[1]
    assert created[0] == 200 and "topic Signed saved on 1 broker(s)" in created[1]
    assert "Signed" in topics and "Unsigned" not in topics


def test_tidemq_console_command_serves_and_stops(tidemq_cluster, tmp_path: Path) -> None:
    """``tidemq console --port 0`` prints where it listens, serves pages, and stops cleanly
    on SIGTERM."""
    cluster = tidemq_cluster()
    process = subprocess.Popen(
        [sys.executable, "-m", "tidemq", "console", "-n", cluster.namesrv_addr, "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        line = process.stdout.readline()  # blocks until the console printed its URL
        match = re.search(r"tidemq console: (http://127\.0\.0\.1:\d+/) \(read-only\)", line)
        assert match, line + process.stderr.read()
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(match.group(1) + "topics?system=1",
                                            timeout=30) as page:
                    html = page.read().decode()
                break
            except urllib.error.HTTPError as e:
                e.close()
                assert time.monotonic() < deadline, "the console never served the topics"
                time.sleep(0.2)
        assert "TBW102" in html and "read-only" in html
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
        process.stderr.close()
