"""`python -m cairn` behaves like the `cairn` command."""

from .app.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
