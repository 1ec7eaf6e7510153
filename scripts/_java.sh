# Sourced by scripts/test (and runnable alone: bash scripts/_java.sh): build the Java side of
# the tests -- the official RocketMQ 4.9.8 client's scenarios (tests/interop/java) and the
# class path of Apache's name server and broker used as a reference (its reference/ folder).
# Maven keeps what it fetched in ~/.m2; a build runs again only when a pom or a Java source
# changed (a stamp, like the npm one), and it tries offline first, so once fetched no network
# is needed.
set -euo pipefail
java_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/interop/java"
if ! command -v mvn >/dev/null 2>&1 || ! command -v javac >/dev/null 2>&1; then
    echo "installing Maven and a JDK from Debian (mvn or javac missing)..." >&2
    { apt-get update && apt-get install -y maven default-jdk-headless; } >/tmp/tidemq-apt-java.log 2>&1 || {
        tail -n 20 /tmp/tidemq-apt-java.log >&2
        echo "apt-get install maven failed; the whole log is in /tmp/tidemq-apt-java.log" >&2
        exit 1
    }
fi
java_want="$(cat "$java_root/pom.xml" "$java_root/reference/pom.xml" \
    $(find "$java_root/src" -name '*.java' | sort) | sha256sum | cut -d' ' -f1)"
java_stamp="$java_root/target/.tidemq-built"
if [ ! -f "$java_stamp" ] || [ "$(cat "$java_stamp")" != "$java_want" ]; then
    echo "building the Java interop module in $java_root (first run or sources changed)..." >&2
    mkdir -p "$java_root/target"
    java_log="$java_root/target/maven-build.log"
    for module in "$java_root/reference" "$java_root"; do
        if ! mvn -B -q -o -f "$module/pom.xml" compile >"$java_log" 2>&1 &&
           ! mvn -B -q -f "$module/pom.xml" compile >"$java_log" 2>&1; then
            tail -n 40 "$java_log" >&2
            echo "mvn compile failed in $module; the whole log is in $java_log" >&2
            exit 1
        fi
    done
    echo "$java_want" > "$java_stamp"
fi
