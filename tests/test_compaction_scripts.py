"""Issue 44: compaction never gets stuck on a session's own history, whatever its script. Chinese, emoji and code
histories on a 2,048-token window, against the real local OpenAI-compatible server taught two tokenizers that are
not Cairn's estimate: one counting like Gemma's (a token per CJK character or emoji; other text about 4
characters a token), where the estimate must hold (no refusal at all), and a byte-fallback one (a token per UTF-8
byte of anything outside ASCII, 3 per CJK character), where it cannot: then each refused summary request is retried
with half the piece, and every turn still completes."""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

import pytest
from openai_server import OpenAIServer, RecordedRequest, error, text, tool_calls

from cairn.app.agent import compaction
from cairn.app.agent.compaction import SUMMARY_SYSTEM, halve_piece, summary_pieces
from cairn.app.agent.token_estimate import text_tokens
from cairn.app.compose import open_agent
from cairn.app.config.resolver import resolve_config
from cairn.persistence.events import ContextCompaction

WINDOW = 2048
CJK = re.compile(r"[\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uff00-\uffef]")
ASTRAL = re.compile(r"[\U00010000-\U0010ffff]")

CHINESE = ("压缩按每个词元四个字符来估算摘要片段的大小；在分词器中，中文文本大约每个字符一个词元。"
           "会话越长，摘要请求越大，服务器拒绝之后，每一轮都会重复同样的错误。")
EMOJI = "部署完成 ✅ 🚀🎉 测试通过 👍🏽 日志 📄📄 警告 ⚠️ 🔥 "
CODE = inspect.getsource(compaction)


def gemma_like(content: str) -> int:
    """Tokens as Gemma's tokenizer (262k entries) roughly counts them: a CJK character or an emoji is one, other text
    (prose, code, the tools' JSON) about 4 characters a token."""
    wide = len(CJK.findall(content)) + len(ASTRAL.findall(content))
    rest = CJK.sub("", ASTRAL.sub("", content))
    return wide + len(rest) // 4 + 1


def byte_fallback(content: str) -> int:
    """Tokens of a tokenizer with no CJK or emoji in its vocabulary: one per UTF-8 byte of every non-ASCII
    character (3 for a CJK character, 4 for an emoji), ASCII about 4 characters a token."""
    wide = sum(len(ch.encode()) for ch in content if not ch.isascii())
    ascii_part = "".join(ch for ch in content if ch.isascii())
    return wide + len(ascii_part) // 4 + 1


class ScriptModel:
    """A model with a 2,048-token window counted by `tokenize`: requests past it get llama.cpp's refusal, summary
    requests a short summary, turns a short answer."""

    def __init__(self, tokenize: Any) -> None:
        self.tokenize = tokenize
        self.refused: list[tuple[str, int]] = []  # (purpose, tokens) of each refused request
        self.accepted: list[tuple[str, int]] = []

    def size(self, req: RecordedRequest) -> int:
        """The prompt as a chat template renders it: every message's content, and the tools' JSON."""
        messages = req.body.get("messages", [])
        calls = json.dumps([m.get("tool_calls") for m in messages if m.get("tool_calls")], ensure_ascii=False)
        tools = json.dumps(req.body.get("tools") or [], ensure_ascii=False)
        return (sum(4 + self.tokenize(str(m.get("content") or "")) for m in messages) + self.tokenize(calls)
                + self.tokenize(tools))

    def __call__(self, req: RecordedRequest) -> Any:
        messages = req.body.get("messages", [])
        purpose = "compaction" if messages and messages[0].get("content") == SUMMARY_SYSTEM else "turn"
        tokens = self.size(req)
        if tokens > WINDOW:
            self.refused.append((purpose, tokens))
            return error(400, f"request ({tokens} tokens) exceeds the available context size ({WINDOW} tokens), "
                              "try increasing it", type="exceed_context_size_error")
        self.accepted.append((purpose, tokens))
        if purpose == "compaction":
            return text(f"Summary {len(self.accepted)}: the user sent long notes; each was acknowledged.")
        return text("Noted.")


def history_turn(kind: str, turn: int) -> str:
    if kind == "chinese":
        return f"第{turn}轮：" + CHINESE * 2
    if kind == "emoji":
        return f"Turn {turn}: " + EMOJI * 5
    start = (turn * 600) % max(1, len(CODE) - 600)
    return f"Turn {turn}, review this code:\n" + CODE[start:start + 600]


async def run_session(tmp_path, model: ScriptModel, kind: str, turns: int = 8) -> list[Any]:
    """`turns` turns of `kind` history; the first one also reads a file of it (twelve turns' worth), as a session
    that looks at a long document does: a tool result longer than a summary piece."""
    (tmp_path / "notes.txt").write_text("".join(history_turn(kind, n) for n in range(12)))
    read = tool_calls([{"id": "call_read", "name": "read_file", "arguments": {"path": "notes.txt"}}])
    with OpenAIServer([read], default=model) as server:
        config = resolve_config(home=str(tmp_path / "home"), provider="openai", model="gemma3-local",
                                base_url=server.base_url, workspace=str(tmp_path), env={"CAIRN_API_KEY": "sk-local"})
        async with open_agent(config) as agent:
            agent.loop.context_window = WINDOW
            for turn in range(turns):
                result = await agent.run(history_turn(kind, turn))
                assert result.reason == "completed", (turn, result.error)  # never stuck on its own history
            return list(agent.session.events)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["chinese", "emoji", "code"])
async def test_the_estimate_holds_for_every_script_on_a_2048_window(tmp_path, kind):
    model = ScriptModel(gemma_like)
    events = await run_session(tmp_path, model, kind)
    assert any(isinstance(e, ContextCompaction) for e in events)
    assert model.refused == []  # sized right: the server never had to refuse a request, summary or turn
    assert max(tokens for _, tokens in model.accepted) <= WINDOW


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["chinese", "emoji"])
async def test_a_summary_refused_for_length_is_retried_with_half_the_piece(tmp_path, kind):
    """A tokenizer that spends 3-4 tokens on every CJK character or emoji makes the estimate 2-3× too small: the
    server refuses summary requests, Cairn halves the piece until it fits, and no turn fails."""
    model = ScriptModel(byte_fallback)
    events = await run_session(tmp_path, model, kind)
    assert any(purpose == "compaction" for purpose, _ in model.refused), "the tokenizer did refuse a summary"
    assert any(isinstance(e, ContextCompaction) for e in events)
    summaries = [tokens for purpose, tokens in model.accepted if purpose == "compaction"]
    assert summaries and max(summaries) <= WINDOW
    # each refused summary request was followed by smaller ones: the halves of its piece
    refused_sizes = [tokens for purpose, tokens in model.refused if purpose == "compaction"]
    assert min(summaries) < min(refused_sizes) / 1.5


def test_the_pieces_are_sized_by_script_not_by_characters():
    """4,000 Chinese characters are about 4,000 tokens, 4,000 characters of prose about 1,000: the pieces of a 1,000
    token budget differ accordingly, and every piece fits the budget by the estimate."""
    chinese = [{"role": "user", "content": CHINESE * 60}]
    prose = [{"role": "user", "content": "The operator asked for a long report about the cairn. " * 75}]
    for messages in (chinese, prose):
        for piece in summary_pieces(messages, 1000):
            assert sum(text_tokens(line) + 1 for line in piece) <= 1000
    assert len(summary_pieces(chinese, 1000)) >= 3 * len(summary_pieces(prose, 1000))


def test_halving_stops_at_the_floor():
    piece = ["a line of history " * 40, "another line " * 40, "a third " * 40]
    halves = halve_piece(piece)
    assert halves is not None and [line for half in halves for line in half] == piece and all(halves)
    single = halve_piece(["长" * 400])
    assert single is not None and "".join(single[0] + single[1]) == "长" * 400
    assert halve_piece(["short"]) is None  # at the floor: the compaction fails with a clear error instead
