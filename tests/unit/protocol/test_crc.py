"""The BODYCRC accelerator (protocol/crc.py) is zlib's CRC-32 exactly: any bytes, any
starting value, any buffer type."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.protocol import crc
from tidemq.protocol.message import body_crc


def test_a_server_is_told_when_crcs_are_computed_without_the_accelerator(monkeypatch) -> None:
    monkeypatch.setattr(crc, "ACCELERATED", False)
    warning = crc.accelerator_warning()
    assert warning is not None and "zlib" in warning and "pip install isal" in warning
    monkeypatch.setattr(crc, "ACCELERATED", True)
    assert crc.accelerator_warning() is None


@pytest.fixture(scope="module")
def accelerated():
    return pytest.importorskip(
        "isal.isal_zlib",
        reason="the optional accelerator (PyPI isal) is not installed here: tidemq uses "
        "zlib's crc32 and this comparison has nothing to compare (pip install isal to run it)",
    )


def test_the_accelerator_is_used_when_installed(accelerated) -> None:
    assert crc.ACCELERATED
    assert crc.crc32 is accelerated.crc32


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=5000), value=st.integers(0, 2**32 - 1))
def test_accelerated_crc32_is_zlibs(accelerated, data: bytes, value: int) -> None:
    assert accelerated.crc32(data) == zlib.crc32(data)
    assert accelerated.crc32(data, value) == zlib.crc32(data, value)
    assert crc.crc32(data) & 0x7FFFFFFF == body_crc(data) == zlib.crc32(data) & 0x7FFFFFFF


def test_accelerated_crc32_takes_the_buffers_the_store_gives_it(accelerated) -> None:
    record = bytes(range(256)) * 9
    for data in (bytearray(record), memoryview(record)[7:2000], memoryview(bytearray(record))):
        assert accelerated.crc32(data) == zlib.crc32(data)
    # Lengths around the vector widths and the high bit of the CRC set.
    for length in (0, 1, 15, 16, 17, 63, 64, 65, 1023, 1024, 1025, 4096):
        body = bytes((n * 7) % 251 for n in range(length))
        assert accelerated.crc32(body) == zlib.crc32(body)
    assert any(zlib.crc32(bytes([n]) * 1024) >> 31 for n in range(16))
