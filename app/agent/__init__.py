"""The agent and its checkpoint policy: no face (CLI, TUI, ACP, Python API) is imported from here.

`loop` runs turns and steps and emits events; `exchange` is each step's model request (retries, the context window,
compaction triggering) and `tool_calls` how the model's calls are recorded; `turn_state` is what a running turn holds.
`notices` is what faces hear from the loop besides the session's events (a queued turn's result, transient states).
`policy` is the only place that chooses where the durability barriers go (before each request, before each tool
body, between steps, at the end of a turn) — the coordinator in `cairn.persistence.coordinator` performs them;
`evidence` records what the workspace was around tool calls (fingerprints, before-images, snapshots). `transcript`
derives what the model is sent from the events, `compaction` shortens it, `approval` and `previews` ask the operator,
`hooks` is the seam the policy and the `failpoints` (crash tests) plug into.
"""
