"""Where the Java side of the tests is, and how a JVM of it is started.

scripts/test (through scripts/_java.sh) builds tests/interop/java with Maven: the official
RocketMQ 4.9.8 client's scenarios (``target/classes`` and the class path Maven resolved in
``target/classpath.txt``), and in its ``reference/`` folder the class path of Apache's name
server and broker 4.9.7 (the newest 4.9.x server published on Maven Central) used as the
reference broker by tests/differential and benchmarks/.
"""

from __future__ import annotations

import shutil
from pathlib import Path

JAVA_DIR = Path(__file__).resolve().parent / "interop" / "java"
CLIENT_CLASSES = JAVA_DIR / "target" / "classes"
CLIENT_CLASSPATH_FILE = JAVA_DIR / "target" / "classpath.txt"
REFERENCE_CLASSPATH_FILE = JAVA_DIR / "reference" / "target" / "classpath.txt"

# RocketMQ 4.9.x reaches into java.nio internals (direct buffers, mmap cleaning) that Java 17
# hides unless opened; the client runs without them, the broker and name server need them.
JAVA17_OPENS = (
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-exports=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-exports=java.base/jdk.internal.ref=ALL-UNNAMED",
)

# The client's rebalance and orderly lock renewal run every 20 s by default; tests want the
# members of a group to settle in a second or two (both are the client's own system
# properties, not broker behaviour).
CLIENT_PROPERTIES = (
    "-Drocketmq.client.rebalance.waitInterval=1000",
    "-Drocketmq.client.rebalance.lockInterval=1000",
)


def _built(path: Path) -> str:
    if not path.exists():
        raise AssertionError(
            f"{path} is missing: the Java module is not built; scripts/test builds it "
            f"(or run: bash scripts/_java.sh)")
    return path.read_text().strip()


def java() -> str:
    """The ``java`` executable (AssertionError naming the fix when there is none)."""
    found = shutil.which("java")
    if found is None:
        raise AssertionError("java is not on PATH; scripts/test installs a JDK with Maven")
    return found


def client_classpath() -> str:
    """The scenarios' classes and the 4.9.8 client, tools and acl jars."""
    return f"{CLIENT_CLASSES}:{_built(CLIENT_CLASSPATH_FILE)}"


def reference_classpath() -> str:
    """Apache's name server and broker jars (and their dependencies)."""
    return _built(REFERENCE_CLASSPATH_FILE)


def client_command(main_args: list[str], workdir: Path, serialize_type: str = "JSON",
                   heap_mb: int = 256) -> list[str]:
    """``java ... tidemq.interop.Main <main_args>`` with the client's home in ``workdir``.

    ``user.home`` is set to ``workdir`` because the client keeps its logs and broadcasting
    offsets under the home directory.
    """
    return [java(), f"-Xmx{heap_mb}m", "-XX:+UseSerialGC", f"-Duser.home={workdir}",
            f"-Drocketmq.client.localOffsetStoreDir={workdir}/offsets",
            f"-Drocketmq.serialize.type={serialize_type}", *CLIENT_PROPERTIES,
            "-cp", client_classpath(), "tidemq.interop.Main", *main_args]
