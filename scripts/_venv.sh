# Sourced by scripts/run and scripts/test: make .venv and install tidemq into it.
# Idempotent: pip runs again only when pyproject.toml (or the extras asked for) changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
extras="${1:-}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
stamp="$venv/.tidemq-installed-${extras:-base}"
want="$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "installing tidemq${extras:+[$extras]} into $venv (first run or pyproject.toml changed)..." >&2
    log="$venv/pip-install.log"
    # compat editable mode keeps the top-level pyspark_tidemq module importable by path,
    # which Spark's data-source discovery needs (a plain editable install breaks it).
    if ! { "$venv/bin/python" -m pip install --disable-pip-version-check --upgrade pip &&
           "$venv/bin/python" -m pip install --disable-pip-version-check \
               --config-settings editable_mode=compat -e "$root${extras:+[$extras]}"; } >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "pip install failed; the whole log is in $log" >&2
        exit 1
    fi
    echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
