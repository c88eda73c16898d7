"""Resolving settings: flags beat environment variables, which beat the config file's profile, which beats defaults.

`resolver` turns them into one `Config` (`settings`: the value, its defaults and the API key), adjusted for a resumed
session by `resumed`; `provider` builds the provider it names. `file` reads and checks the TOML config file, its
`[mcp_servers.NAME]` tables through `mcp_servers`, with the value checks in `values`; `checks` holds the error type
and URL checks the resolver and the file reader both apply.
"""
