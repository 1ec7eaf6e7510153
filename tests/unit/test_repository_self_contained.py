"""The repository stands alone: nothing in it reaches outside (absolute paths of the machine it
was written on, sibling folders), and the protocol sections the code cites exist."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Where the project was developed, and the notes kept beside it: neither exists in a clone.
OUTSIDE = re.compile(r"/work/|\.\./shared|shared/(protocol|spark)-notes|protocol-notes|spark-notes"
                     r"|/root/|/home/\w+/")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".sh", ".cfg", ".ini", ".txt", ".yml", ".yaml", ".json",
                 ".js", ".java", ".xml", ".properties", ""}


def tracked_files() -> list[Path]:
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode()
    return [ROOT / name for name in listing.split("\0") if name]


def test_no_file_reaches_outside_the_repository():
    offenders = []
    for path in tracked_files():
        if path.suffix not in TEXT_SUFFIXES or not path.is_file():
            continue
        if "node_modules" in path.parts or path.stat().st_size > 2_000_000:
            continue
        if path == Path(__file__).resolve():  # the patterns themselves
            continue
        text = path.read_text(errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert offenders == [], "\n".join(offenders)


def test_every_cited_protocol_section_exists():
    headings = set(re.findall(r"^#+ (§[0-9]+(?:\.[0-9]+)?)\b",
                              (ROOT / "docs" / "protocol.md").read_text(), re.M))
    cited: dict[str, str] = {}
    for path in tracked_files():
        if path.suffix != ".py" or not path.is_file():
            continue
        for match in re.finditer(r"docs/protocol\.md[^\n]{0,60}", path.read_text()):
            for section in re.findall(r"§[0-9]+(?:\.[0-9]+)?", match.group(0)):
                cited.setdefault(section, str(path.relative_to(ROOT)))
    missing = {section: where for section, where in cited.items() if section not in headings}
    assert missing == {}, f"cited but not in docs/protocol.md: {missing}"
