"""Cairn's face for editors: an Agent Client Protocol agent over stdio (`cairn acp`).

`serve` runs the connection, `agent` answers the protocol's methods, `session` hosts one Cairn session per ACP session,
`updates` turns session events into what the editor shows. Only `cairn acp` imports this package (it needs the `acp`
package and pydantic, which headless commands never load).
"""
