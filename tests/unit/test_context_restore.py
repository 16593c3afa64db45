"""What a compaction re-attaches when the workspace lacks a file: its content as the
conversation last showed it (the last Write input or Read result, later Edits
applied), in Parley's and Claude Code's Read formats."""

from __future__ import annotations

from typing import Any

from app.context.restore import file_from_history, files_to_reattach
from app.context.types import ASSISTANT, USER, Node
from tests.unit.strategies import node, text, tool_result, tool_use

_ids = iter(range(1_000_000))


def call(name: str, result: Any, *, is_error: bool = False, **tool_input: Any) -> list[Node]:
    use = f"toolu_{next(_ids)}"
    return [
        node(f"a-{use}", ASSISTANT, [tool_use(use, name, **tool_input)]),
        node(f"r-{use}", USER, [tool_result(use, result, is_error=is_error)]),
    ]


def numbered(text_: str, arrow: bool = False, start: int = 1) -> str:
    sep = "\u2192" if arrow else "\t"
    return "\n".join(f"{n:>6}{sep}{line}" for n, line in enumerate(text_.splitlines(), start))


def test_a_claude_code_read_is_restored_without_line_numbers_or_reminders() -> None:
    result = (
        numbered("package main\n\nfunc main() {}", arrow=True)
        + "\n\n<system-reminder>\nWhatever it says.\n</system-reminder>\n"
    )
    history = call("Read", result, file_path="/Users/dev/proj/main.go")
    assert file_from_history(history, "Users/dev/proj/main.go") == (
        "package main\n\nfunc main() {}"
    )
    assert file_from_history(history, "/Users/dev/proj/main.go") == (
        "package main\n\nfunc main() {}"
    )


def test_the_newest_write_or_read_wins_and_later_edits_apply() -> None:
    history = [
        *call("Read", numbered("a = 1\nb = 2"), file_path="f.py"),
        *call("Write", "File created", file_path="f.py", content="x = 1\ny = 2\n"),
        *call("Edit", "updated", file_path="f.py", old_string="y = 2", new_string="y = 3"),
        *call("Edit", "failed", is_error=True, file_path="f.py", old_string="x", new_string="z"),
    ]
    assert file_from_history(history, "f.py") == "x = 1\ny = 3\n"
    history += call("Read", numbered("fresh\ncontent"), file_path="f.py")
    assert file_from_history(history, "f.py") == "fresh\ncontent"


def test_pieces_read_with_an_offset_are_merged_and_gaps_marked() -> None:
    history = [
        *call("Read", numbered("one\ntwo"), file_path="big.txt", limit=2),
        *call("Read", numbered("five\nsix", start=5), file_path="big.txt", offset=5),
    ]
    assert file_from_history(history, "big.txt") == (
        "one\ntwo\n[... lines 3-4 not shown in the conversation ...]\nfive\nsix"
    )


def test_unknown_errors_and_other_files_give_nothing() -> None:
    history = [
        *call("Read", "No such file", is_error=True, file_path="gone.txt"),
        *call("Read", numbered("other"), file_path="other.txt"),
        node("u", USER, [text("thanks")]),
    ]
    assert file_from_history(history, "gone.txt") is None
    assert file_from_history(history, "never.txt") is None
    # An edit of a file never shown does not invent it.
    edits = call("Edit", "ok", file_path="e.txt", old_string="a", new_string="b")
    assert file_from_history(edits, "e.txt") is None


def test_files_to_reattach_are_the_newest_reads_not_still_in_view() -> None:
    compacted = [
        *call("Read", numbered("1"), file_path="/abs/a.txt"),
        *call("Read", numbered("2"), file_path="b.txt"),
        *call("Read", numbered("3"), file_path="c.txt"),
    ]
    kept = call("Read", numbered("4"), file_path="c.txt")
    assert files_to_reattach(compacted, kept) == ["b.txt", "abs/a.txt"]
