"""Small commands that read or tidy sessions and settings: `sessions` and `show` (`sessions`), `rm` and `export`
(`housekeeping`), `rewind` and `fork`, `cairn config`."""
