"""``python -m tidemq``: the ``tidemq`` command."""

from tidemq.cli.main import main

if __name__ == "__main__":
    main(prog_name="tidemq")
