"""Where the tests' fixtures live: inside the repository, never beside it."""

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"

# Request frames captured from real third-party RocketMQ 4.x clients (see frames/README.md).
CLIENT_FRAMES_DIR = DATA_DIR / "frames"
