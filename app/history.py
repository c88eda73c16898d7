"""Prompt history for ↑/↓, one file per workspace under CAIRN_HOME (`history/<hash of the workspace>.jsonl`).

Secrets never reach it: the configured key and anything shaped like a credential (`sk-…`, `Bearer …`,
`password=…`, a URL's `user:pass@`) are replaced by `***` before a prompt is stored, the way events are redacted. The
file is private (0600 in a 0700 directory), append-only, and a damaged line is skipped rather than failing the TUI.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

MAX_ENTRIES = 1000

SECRET_SHAPES = [
    re.compile(r"\b(sk|pk|rk|ghp|gho|github_pat|xox[abprs]|AKIA)[-_A-Za-z0-9]{12,}"),
    re.compile(r"(?i)\b(bearer)\s+[-._~+/A-Za-z0-9]{12,}=*"),
    re.compile(r"(?i)\b((?:api[_-]?key|token|secret|password|passwd|pwd)\s*[=:]\s*)\S+"),
    re.compile(r"(?<=://)[^/\s:@]+:[^/\s@]+(?=@)"),
]


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    for shape in SECRET_SHAPES:
        text = shape.sub(_masked, text)
    return text


def _masked(match: re.Match[str]) -> str:
    """Keep a `password=` label so the prompt still reads; mask the rest."""
    label = match.group(1) if match.re.groups else ""
    return f"{label}***" if label and label.rstrip().endswith(("=", ":")) else "***"


def history_path(home: Path, workspace: Path) -> Path:
    digest = hashlib.sha256(str(Path(workspace).resolve()).encode("utf-8", "surrogatepass")).hexdigest()[:20]
    return Path(home) / "history" / f"{digest}.jsonl"


class PromptHistory:
    """Entries oldest first; `add` appends to memory and disk (a disk failure loses only the disk copy)."""

    def __init__(self, path: Path | None, secrets: tuple[str, ...] = ()) -> None:
        self.path = path
        self.secrets = secrets
        self.entries: list[str] = self._load()

    def _load(self) -> list[str]:
        if self.path is None:
            return []
        try:
            raw = self.path.read_bytes()
        except OSError:
            return []
        entries = []
        for line in raw.decode("utf-8", errors="replace").splitlines():
            try:
                text = json.loads(line).get("text")
            except (ValueError, AttributeError):
                continue
            if isinstance(text, str) and text:
                entries.append(text)
        return entries[-MAX_ENTRIES:]

    def add(self, text: str) -> None:
        text = redact(text, self.secrets)
        if not text.strip() or (self.entries and self.entries[-1] == text):
            return
        self.entries.append(text)
        del self.entries[:-MAX_ENTRIES]
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
        except OSError:
            pass  # history is a convenience: never worth failing a prompt over
