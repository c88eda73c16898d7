"""The status bar: session, provider/model, backend, turn state and durability ("durable through seq N")."""

from __future__ import annotations

from textual.reactive import reactive
from textual.widgets import Static


class StatusBar(Static):
    DEFAULT_CSS = """
    StatusBar { height: 1; background: $panel; color: $text-muted; padding: 0 1; }
    StatusBar.-failed { background: $error; color: $text; }
    """

    session_id: reactive[str] = reactive("")
    provider: reactive[str] = reactive("")
    backend: reactive[str] = reactive("")
    activity: reactive[str] = reactive("idle")
    durability: reactive[str] = reactive("")
    failed: reactive[bool] = reactive(False)

    def render(self) -> str:
        parts = [self.session_id, self.provider, self.backend, self.activity, self.durability]
        return "  │  ".join(p for p in parts if p)

    def watch_failed(self, failed: bool) -> None:
        self.set_class(failed, "-failed")

    def show_durability(self, state: str, durable_seq: int, error: str | None = None) -> None:
        if state == "failed":
            self.failed = True
            self.durability = f"CHECKPOINT FAILED: {error}" if error else "CHECKPOINT FAILED"
        elif state == "writing":
            self.durability = "writing…"
        elif state == "closed":
            self.durability = f"closed, durable through seq {durable_seq}"
        else:
            self.failed = False
            self.durability = f"durable through seq {durable_seq}" if durable_seq >= 0 else "nothing written yet"
