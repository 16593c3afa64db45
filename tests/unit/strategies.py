"""Hypothesis strategies for stored histories (lists of `Node`), shaped like real agent
sessions and like the damage real sessions carry: parallel tool calls, results missing
(an interrupted run), partial, duplicated or orphaned, error results, thinking blocks
with signatures, empty replies, meta messages, boundary and api_error rows, whitespace
text, views that start with an assistant message."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import strategies as st

from app.context.tokens import estimate_content
from app.context.types import (
    API_ERROR,
    ASSISTANT,
    COMPACT_BOUNDARY,
    COMPACT_SUMMARY,
    SYSTEM,
    USER,
    Block,
    Node,
)

COMPACTABLE_NAMES = ["Read", "Glob", "Grep", "Write", "Edit"]
OTHER_NAMES = ["Bash", "lookup_order", "send_email"]
TOOL_NAMES = COMPACTABLE_NAMES + OTHER_NAMES


def node(uuid: str, role: str | None, content: list[Block], **kw: Any) -> Node:
    """A Node with its token estimate filled in, as the store does on insert."""
    kind = kw.pop("type", role or SYSTEM)
    return Node(
        uuid=uuid,
        type=kind,
        role=role,
        content=content,
        token_estimate=estimate_content(content),
        **kw,
    )


def text(value: str, **kw: Any) -> Block:
    return {"type": "text", "text": value, **kw}


def tool_use(use_id: str, name: str, **input_: Any) -> Block:
    return {"type": "tool_use", "id": use_id, "name": name, "input": input_}


def tool_result(use_id: str, content: Any = "ok", *, is_error: bool = False) -> Block:
    block: Block = {"type": "tool_result", "tool_use_id": use_id, "content": content}
    if is_error:
        block["is_error"] = True
    return block


def thinking(value: str = "hmm", signature: str = "sig") -> Block:
    return {"type": "thinking", "thinking": value, "signature": signature}


IMAGE: Block = {
    "type": "image",
    "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
}
_LETTERS = "abcdefghij klmnop\n"


class _History:
    """Mutable state while one history is drawn. Each step draws its kind and one seed;
    the details of the step come from a `random.Random` on that seed (a few draws per
    message keep generation fast; shrinking still simplifies kinds and seeds)."""

    def __init__(self, draw: st.DrawFn, *, corrupt: bool = True) -> None:
        self.draw = draw
        self.corrupt = corrupt  # False: unique tool ids, every call answered
        self.rng = random.Random(0)
        self.nodes: list[Node] = []
        self.count = 0
        self.open_uses: list[str] = []  # tool uses of the last assistant message
        self.all_uses: list[str] = []

    def reseed(self) -> None:
        self.rng = random.Random(self.draw(st.integers(0, 2**16)))

    def chance(self, one_in: int) -> bool:
        return self.rng.randrange(one_in) == 0

    def words(self) -> str:
        value = "".join(self.rng.choices(_LETTERS, k=self.rng.randint(1, 40)))
        return value if value.strip() else value + "x"

    def uid(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def add(self, role: str | None, content: list[Block], **kw: Any) -> None:
        self.nodes.append(node(self.uid("n"), role, content, **kw))

    def result_content(self) -> Any:
        kind = self.rng.choice(["text", "text", "text", "blocks", "empty", "big"])
        if kind == "text":
            return self.words()
        if kind == "big":
            return "x" * self.rng.randint(500, 6000)
        if kind == "empty":
            return self.rng.choice(["", [], [text(" ")]])
        return [text(self.words()), IMAGE]

    def user_text(self) -> None:
        blocks = [text(self.words())]
        if self.chance(10):
            blocks.append(IMAGE)
        if self.corrupt and self.chance(10):
            blocks.insert(0, text(self.rng.choice(["", " ", "\n", "  \n\t"])))
        if self.corrupt and self.chance(20):
            blocks[0] = {**blocks[0], "cache_control": {"type": "ephemeral"}}
        self.add(USER, blocks)
        self.open_uses = []

    def assistant(self) -> None:
        rng = self.rng
        blocks: list[Block] = []
        if rng.random() < 0.5:
            blocks.append(thinking(self.words(), signature=self.uid("sig")))
        if rng.random() < 0.75:
            value = self.words()
            if self.chance(8):
                value += rng.choice([" ", "\n\n"])
            blocks.append(text(value))
        uses: list[str] = []
        for _ in range(rng.randint(0, 4)):
            if self.corrupt and self.all_uses and self.chance(30):
                use_id = rng.choice(self.all_uses)  # a reused id (corrupt data)
            else:
                use_id = self.uid("toolu_")
            blocks.append(tool_use(use_id, rng.choice(TOOL_NAMES), file_path=f"f{self.count}.py"))
            uses.append(use_id)
        if not blocks:
            blocks.append(text(self.words()))
        self.add(ASSISTANT, blocks)
        self.open_uses = uses
        self.all_uses.extend(uses)

    def answer_all(self) -> None:
        """Every open call answered once, in order, in one row."""
        self.add(USER, [tool_result(u, self.result_content()) for u in self.open_uses])
        self.open_uses = []

    def results(self) -> None:
        rng = self.rng
        uses = list(self.open_uses)
        mode = rng.choice(["all", "all", "all", "partial", "shuffled", "dupes"])
        if mode == "partial" and uses:
            uses = rng.sample(uses, rng.randint(0, len(uses)))
        elif mode == "shuffled":
            rng.shuffle(uses)
        elif mode == "dupes" and uses:
            uses.append(rng.choice(uses))
        blocks = [tool_result(u, self.result_content(), is_error=self.chance(6)) for u in uses]
        if self.chance(10):
            orphan = rng.choice(self.all_uses) if self.all_uses else "toolu_ghost"
            blocks.append(tool_result(orphan, "late"))
        if self.chance(10):
            blocks.append(text(self.words()))  # the user typed while the tools ran
        if not blocks:
            blocks.append(tool_result("toolu_ghost", "orphan"))
        # Results sometimes come in two rows (one per finished tool).
        if len(blocks) > 1 and self.chance(5):
            split = rng.randint(1, len(blocks) - 1)
            self.add(USER, blocks[:split])
            self.add(USER, blocks[split:])
        else:
            self.add(USER, blocks)
        self.open_uses = []

    def step(self) -> None:
        kind = self.draw(st.sampled_from(STEPS))
        self.reseed()
        if self.open_uses and self.rng.random() < 0.8:
            kind = "results"
        if kind == "user":
            self.user_text()
        elif kind == "assistant":
            self.assistant()
        elif kind == "results":
            self.results()
        elif kind == "empty_reply":
            self.add(ASSISTANT, self.rng.choice([[], [text("")], [text("  ")]]))
        elif kind == "meta":
            self.add(USER, [text(self.words())], is_meta=True)
        elif kind == "boundary":
            self.add(None, [], type=SYSTEM, subtype=COMPACT_BOUNDARY)
        elif kind == "api_error":
            self.add(ASSISTANT, [text("API Error: overloaded")], subtype=API_ERROR)
        elif kind == "blank_user":
            self.add(USER, [text(self.rng.choice(["", " ", "\n"]))])
        elif kind == "summary":
            self.add(USER, [text("This session is being continued...")], subtype=COMPACT_SUMMARY)


STEPS = [
    "user",
    "assistant",
    "assistant",
    "assistant",
    "user",
    "results",
    "empty_reply",
    "meta",
    "boundary",
    "api_error",
    "blank_user",
    "summary",
]


@st.composite
def histories(draw: st.DrawFn, min_size: int = 0, max_size: int = 40) -> list[Node]:
    """A stored view: mostly well-formed agent turns, with the damage listed above."""
    history = _History(draw)
    history.reseed()
    start = draw(st.sampled_from(["user", "user", "user", "assistant", "summary", "any"]))
    if start == "user":
        history.user_text()
    elif start == "assistant":
        history.assistant()
    elif start == "summary":
        history.add(USER, [text("Summary of before.")], subtype=COMPACT_SUMMARY)
    size = draw(st.integers(min_size, max_size))
    while len(history.nodes) < size:
        history.step()
    return history.nodes


@st.composite
def agent_histories(draw: st.DrawFn, max_turns: int = 6) -> list[Node]:
    """Well-formed sessions only: user prompts, each followed by a tool loop with
    parallel calls, every call answered once, unique ids, no blank text. For
    properties about a healthy history."""
    history = _History(draw, corrupt=False)
    for _ in range(draw(st.integers(1, max_turns))):
        history.reseed()
        history.user_text()
        for _ in range(draw(st.integers(0, 5))):
            history.reseed()
            history.assistant()
            if not history.open_uses:
                break  # that reply was the answer
            history.answer_all()
        else:
            history.add(ASSISTANT, [text(history.words())])
    return history.nodes
