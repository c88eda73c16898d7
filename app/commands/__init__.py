"""Small commands that read or tidy sessions and settings: `rm` and `export` (`housekeeping`), `cairn config`."""
