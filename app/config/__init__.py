"""Resolving settings: flags beat environment variables, which beat the config file's profile, which beats defaults.

`resolver` turns them into one `Config` (and builds the provider it names); `file` reads and checks the TOML config
file; `checks` holds the error type and URL checks both of them apply.
"""
