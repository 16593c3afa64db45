"""Write and Edit within the limits: one file's size (Edit's replace_all included), the
workspace's bytes and files; a refused call is an error result and changes nothing."""

from __future__ import annotations

from app.conversation.workspace import Limits, MemoryWorkspace
from app.engine.tools import run_builtin

LIMITS = Limits(max_file_bytes=1000, max_bytes=2500, max_files=3)


async def call(ws: MemoryWorkspace, name: str, **tool_input: object) -> tuple[str, bool]:
    outcome = await run_builtin(name, dict(tool_input), ws)
    return outcome.content, outcome.is_error


async def test_write_obeys_the_file_size_limit() -> None:
    ws = MemoryWorkspace(limits=LIMITS)
    assert not (await call(ws, "Write", file_path="a", content="x" * 1000))[1]
    text, is_error = await call(ws, "Write", file_path="b", content="x" * 1001)
    assert is_error
    assert "over the limit of 1000 bytes" in text
    assert await ws.list_paths() == ["a"]


async def test_edit_replace_all_cannot_grow_past_the_limit() -> None:
    ws = MemoryWorkspace({"f": "ab" * 100}, limits=LIMITS)
    text, is_error = await call(
        ws, "Edit", file_path="f", old_string="a", new_string="a" * 100, replace_all=True
    )
    assert is_error
    assert "would be 10100 bytes" in text
    assert ws.files["f"] == b"ab" * 100
    # within the limit it works
    _, is_error = await call(
        ws, "Edit", file_path="f", old_string="a", new_string="aaaa", replace_all=True
    )
    assert not is_error
    assert len(ws.files["f"]) == 500


async def test_the_workspace_quota_counts_bytes_and_files() -> None:
    ws = MemoryWorkspace(limits=LIMITS)
    for name in ("a", "b"):
        assert not (await call(ws, "Write", file_path=name, content="x" * 1000))[1]
    text, is_error = await call(ws, "Write", file_path="c", content="x" * 501)
    assert is_error
    assert "quota of 2500 bytes" in text
    # replacing a file counts its new size, not both
    assert not (await call(ws, "Write", file_path="b", content="y" * 1000))[1]
    assert not (await call(ws, "Write", file_path="c", content="x" * 500))[1]
    text, is_error = await call(ws, "Write", file_path="d", content="")
    assert is_error
    assert "holds 3 files" in text
    assert await ws.list_paths() == ["a", "b", "c"]
