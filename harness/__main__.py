"""``python -m harness`` is the ``harness`` command."""

from harness.cli.main import main

if __name__ == "__main__":
    main()
