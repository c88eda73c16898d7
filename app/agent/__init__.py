"""The agent and its checkpoint policy: no face (CLI, TUI, ACP, Python API) is imported from here.

`loop` runs turns (model requests and tool calls) and emits events; `policy` is the only place that chooses where the
durability barriers go (before each request, before each tool body, between steps, at the end of a turn) — the
coordinator in `cairn.persistence.coordinator` performs them. `transcript` derives what the model is sent from the
events, `compaction` shortens it, `approval` and `previews` ask the operator, `hooks` is the seam the policy and the
`failpoints` (crash tests) plug into.
"""
