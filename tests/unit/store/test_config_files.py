"""Config files: atomic saves with a .bak copy, and loads that fall back to it."""

import errno
import logging
import os

import orjson
import pytest

from tidemq.errors import ConfigFileCorrupt, StoreError, StoreFull
from tidemq.store.config_file import ConfigFile

LOGGER = "tidemq.store.config_file"


def reject_garbage(data: bytes) -> None:
    orjson.loads(data)


@pytest.fixture
def path(tmp_path):
    return tmp_path / "config" / "topics.json"


def test_missing_file_loads_as_none(path):
    assert ConfigFile(path).load() is None
    assert ConfigFile(path).load_json() is None


def test_save_then_load(path):
    ConfigFile(path).save(b'{"a":1}')
    assert ConfigFile(path).load() == b'{"a":1}'
    assert not path.with_name("topics.json.tmp").exists()
    assert not path.with_name("topics.json.bak").exists()  # nothing to back up yet


def test_second_save_keeps_the_previous_content_as_bak(path):
    config = ConfigFile(path)
    config.save(b'{"v":1}')
    config.save(b'{"v":2}')
    config.save(b'{"v":3}')
    assert path.read_bytes() == b'{"v":3}'
    assert path.with_name("topics.json.bak").read_bytes() == b'{"v":2}'
    assert not path.with_name("topics.json.tmp").exists()


def test_corrupt_main_file_falls_back_to_bak_with_a_warning(path, caplog):
    config = ConfigFile(path, validator=reject_garbage)
    config.save(b'{"v":1}')
    config.save(b'{"v":2}')
    path.write_bytes(b'{"v":2')  # torn
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert ConfigFile(path, validator=reject_garbage).load() == b'{"v":1}'
    (record,) = [r for r in caplog.records if r.name == LOGGER]
    assert record.levelno == logging.WARNING
    assert str(path) in record.getMessage()
    assert str(path) + ".bak" in record.getMessage()


def test_corrupt_json_falls_back_with_load_json(path, caplog):
    config = ConfigFile(path)
    config.save_json({"v": 1})
    config.save_json({"v": 2})
    path.write_bytes(b"\x00\x00\x00garbage")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert ConfigFile(path).load_json() == {"v": 1}
    assert "corrupt" in caplog.text


def test_empty_main_file_falls_back_to_bak(path, caplog):
    config = ConfigFile(path)
    config.save(b"first")
    config.save(b"second")
    path.write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert ConfigFile(path).load() == b"first"
    assert "is empty" in caplog.text


def test_missing_main_file_with_a_bak_loads_the_bak(path, caplog):
    config = ConfigFile(path)
    config.save(b"first")
    config.save(b"second")
    path.unlink()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert ConfigFile(path).load() == b"first"
    assert "missing" in caplog.text


def test_both_corrupt_raises_naming_the_file_and_the_fix(path):
    config = ConfigFile(path, validator=reject_garbage)
    config.save(b'{"v":1}')
    config.save(b'{"v":2}')
    path.write_bytes(b"garbage")
    path.with_name("topics.json.bak").write_bytes(b"more garbage")
    with pytest.raises(ConfigFileCorrupt) as caught:
        ConfigFile(path, validator=reject_garbage).load()
    message = str(caught.value)
    assert str(path) in message and "topics.json.bak" in message
    assert "restore" in message and "delete" in message


def test_corrupt_main_without_bak_raises(path):
    path.parent.mkdir(parents=True)
    path.write_bytes(b"{not json")
    with pytest.raises(ConfigFileCorrupt, match=r"backup .* is missing"):
        ConfigFile(path).load_json()


def test_unreadable_main_file_falls_back(path, caplog):
    config = ConfigFile(path)
    config.save(b"first")
    config.save(b"second")
    path.unlink()
    path.mkdir()  # reading a directory fails with an OSError
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert ConfigFile(path).load() == b"first"
    assert "unreadable" in caplog.text


def test_fastjson_file_with_unquoted_int_keys_loads(path):
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{\n\t"offsetTable":{\n\t\t"T@g":{0:125,1:130}\n\t}\n}')
    assert ConfigFile(path).load_json() == {"offsetTable": {"T@g": {0: 125, 1: 130}}}


def test_save_json_is_pretty_sorted_standard_json(path):
    ConfigFile(path).save_json({"b": {1: 2}, "a": [1]})
    text = path.read_bytes()
    assert text == b'{\n  "a": [\n    1\n  ],\n  "b": {\n    "1": 2\n  }\n}'
    assert orjson.loads(text) == {"a": [1], "b": {"1": 2}}


def test_save_after_loading_from_bak_keeps_the_good_bak(path):
    config = ConfigFile(path, validator=reject_garbage)
    config.save(b'{"v":1}')
    config.save(b'{"v":2}')
    path.write_bytes(b"garbage")
    reloaded = ConfigFile(path, validator=reject_garbage)
    assert reloaded.load() == b'{"v":1}'
    reloaded.save(b'{"v":3}')
    # The corrupt main file was not copied over the only good copy.
    assert path.with_name("topics.json.bak").read_bytes() == b'{"v":1}'
    assert reloaded.load() == b'{"v":3}'
    reloaded.save(b'{"v":4}')
    assert path.with_name("topics.json.bak").read_bytes() == b'{"v":3}'


def test_stale_tmp_from_a_crash_is_ignored_and_replaced(path):
    config = ConfigFile(path)
    config.save(b"good")
    path.with_name("topics.json.tmp").write_bytes(b"half writ")
    assert ConfigFile(path).load() == b"good"
    config.save(b"better")
    assert path.read_bytes() == b"better"
    assert not path.with_name("topics.json.tmp").exists()


def test_disk_full_during_save_leaves_the_old_file_intact(path, monkeypatch):
    config = ConfigFile(path)
    config.save(b"old")

    def no_space(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(StoreFull, match=r"topics\.json"):
        config.save(b"new")
    monkeypatch.undo()
    assert path.read_bytes() == b"old"
    assert not path.with_name("topics.json.tmp").exists()
    assert config.load() == b"old"


def test_other_io_errors_during_save_raise_store_error(tmp_path):
    blocker = tmp_path / "config"
    blocker.write_bytes(b"a file where the directory should be")
    with pytest.raises(StoreError, match="cannot save config file"):
        ConfigFile(blocker / "topics.json").save(b"x")


def _fsync_that_parks_the_first_caller(monkeypatch):
    """os.fsync that blocks the first thread calling it (a save inside its .tmp write) until
    ``release`` is set; returns (parked, release) events."""
    import threading

    real_fsync = os.fsync
    parked, release = threading.Event(), threading.Event()
    first = threading.Lock()

    def fsync(fd):
        if first.acquire(blocking=False):
            parked.set()
            release.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return parked, release


def test_saves_from_two_threads_run_one_at_a_time(path, monkeypatch):
    import threading

    config = ConfigFile(path)
    config.save(b"v0")
    parked, release = _fsync_that_parks_the_first_caller(monkeypatch)
    errors: list[BaseException] = []

    def save(data: bytes) -> None:
        try:
            config.save(data)
        except BaseException as exc:  # the test reports any failure
            errors.append(exc)

    slow = threading.Thread(target=save, args=(b"periodic",))
    slow.start()
    assert parked.wait(10)
    final = threading.Thread(target=save, args=(b"final",))
    final.start()
    # The second save must wait for the first instead of writing the same .tmp meanwhile.
    final.join(0.2)
    assert final.is_alive()
    release.set()
    slow.join(10)
    final.join(10)
    assert errors == []
    assert path.read_bytes() == b"final"
    assert path.with_name("topics.json.bak").read_bytes() == b"periodic"
    assert not path.with_name("topics.json.tmp").exists()


def test_a_save_older_than_the_written_version_is_skipped(path):
    config = ConfigFile(path)
    assert config.save(b"v5", version=5)
    assert not config.save(b"v4", version=4)
    assert path.read_bytes() == b"v5"
    assert config.save(b"v5 again", version=5)
    assert config.save_json({"v": 6}, version=6)
    assert orjson.loads(path.read_bytes()) == {"v": 6}


def test_bak_is_the_previous_file_itself_not_a_copy(path):
    # A hard link: the save writes no second copy, and the file it replaced lives on as .bak.
    config = ConfigFile(path)
    config.save(b"v1")
    before = os.stat(path)
    config.save(b"v2")
    backup = os.stat(path.with_name("topics.json.bak"))
    assert (backup.st_ino, backup.st_dev) == (before.st_ino, before.st_dev)
    assert os.stat(path).st_ino != backup.st_ino  # the main file is a new one
    # Writing the main file in place afterwards leaves the backup alone.
    path.write_bytes(b"edited")
    assert path.with_name("topics.json.bak").read_bytes() == b"v1"


def test_bak_falls_back_to_a_copy_without_hard_links(path, monkeypatch):
    config = ConfigFile(path)
    config.save(b"v1")

    def no_links(source, target):
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "link", no_links)
    config.save(b"v2")
    config.save(b"v3")
    assert path.read_bytes() == b"v3"
    assert path.with_name("topics.json.bak").read_bytes() == b"v2"


def test_first_save_syncs_the_file_it_keeps_as_bak(path, monkeypatch):
    # Another process may have left the main file unsynced; linking it as .bak must not
    # keep a backup that a power cut could lose while a copy would have been synced.
    path.parent.mkdir(parents=True)
    path.write_bytes(b"written by someone else")
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    config = ConfigFile(path)
    config.save(b"mine")
    assert str(path) in synced
    synced.clear()
    config.save(b"mine again")
    assert str(path) not in synced  # written and synced by this object already


def test_a_save_of_pieces_writes_them_in_order(path):
    # A large table is saved from its cached entries, more pieces than one writev takes.
    pieces = [f"{i:05d},".encode() for i in range(3000)]
    pieces[-1] = memoryview(pieces[-1])[:-1]
    config = ConfigFile(path)
    assert config.save(pieces, version=1)
    assert path.read_bytes() == b"".join(pieces)
