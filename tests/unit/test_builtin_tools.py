"""The built-in workspace tools against a MemoryWorkspace, and the path rule."""

from __future__ import annotations

import posixpath
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.context.tools import BUILTIN_TOOLS, READ_ONLY_TOOLS
from app.conversation.workspace import MAX_PATH_CHARS
from app.engine.tools import (
    MemoryWorkspace,
    PathError,
    ToolOutcome,
    normalize_dir,
    normalize_path,
    run_builtin,
    truncate_middle,
)
from app.engine.tools.builtin import TRUNCATION_MARKER
from app.engine.tools.globs import compile_glob


async def run(ws: MemoryWorkspace, name: str, **tool_input: Any) -> ToolOutcome:
    return await run_builtin(name, tool_input, ws)


async def ok(ws: MemoryWorkspace, name: str, **tool_input: Any) -> str:
    outcome = await run(ws, name, **tool_input)
    assert not outcome.is_error, outcome.content
    return outcome.content


async def err(ws: MemoryWorkspace, name: str, **tool_input: Any) -> str:
    outcome = await run(ws, name, **tool_input)
    assert outcome.is_error, outcome.content
    return outcome.content


# --- normalize_path -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("a.txt", "a.txt"),
        ("/a.txt", "a.txt"),
        ("//src///a.py", "src/a.py"),
        ("./a/../b", "b"),
        ("a/./b/", "a/b"),
        ("a/b/../../c", "c"),
        ("/x/../y/z", "y/z"),
        ("...", "..."),
        ("a..b/.c", "a..b/.c"),
        ("dir name/ü.txt", "dir name/ü.txt"),
    ],
)
def test_normalize_path_resolves(raw: str, expected: str) -> None:
    assert normalize_path(raw) == expected


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("", "empty"),
        ("/", "root"),
        (".", "root"),
        ("a/..", "root"),
        ("..", "leaves the workspace root"),
        ("../etc/passwd", "leaves the workspace root"),
        ("/../a", "leaves the workspace root"),
        ("a/../../b", "leaves the workspace root"),
        ("a\\b", "backslash"),
        ("a\x00b", "control character"),
        ("a\nb", "control character"),
        ("\ud800", "not valid Unicode"),
        ("a" * (MAX_PATH_CHARS + 1), "too long"),
    ],
)
def test_normalize_path_rejects(raw: str, reason: str) -> None:
    with pytest.raises(PathError, match=reason):
        normalize_path(raw)


def test_normalize_path_length_limit_is_inclusive() -> None:
    assert normalize_path("a" * MAX_PATH_CHARS) == "a" * MAX_PATH_CHARS


def test_path_error_is_a_value_error() -> None:
    assert issubclass(PathError, ValueError)


@pytest.mark.parametrize(
    ("raw", "expected"), [("", ""), ("/", ""), ("./a/..", ""), ("a/b/", "a/b")]
)
def test_normalize_dir_allows_the_root(raw: str, expected: str) -> None:
    assert normalize_dir(raw) == expected


def test_normalize_dir_still_refuses_escapes() -> None:
    with pytest.raises(PathError):
        normalize_dir("..")


_path_like = st.lists(st.sampled_from(["", ".", "..", "a", "b", "..a", "/"]), max_size=8).map(
    "/".join
)


@given(st.one_of(st.text(max_size=60), _path_like))
def test_normalize_path_never_escapes(raw: str) -> None:
    try:
        result = normalize_path(raw)
    except PathError:
        return
    segments = result.split("/")
    assert result
    assert not result.startswith("/")
    assert all(segment not in ("", ".", "..") for segment in segments)
    assert "\\" not in result
    assert "\x00" not in result
    assert len(result) <= MAX_PATH_CHARS
    assert normalize_path(result) == result
    # Where it succeeds, it agrees with POSIX resolution from a root.
    assert posixpath.normpath("/" + raw.lstrip("/")) == "/" + result


@given(_path_like)
def test_normalize_path_raises_exactly_when_dotdot_climbs_above_root(raw: str) -> None:
    depth, escapes = 0, False
    for segment in raw.split("/"):
        if segment == "..":
            escapes = escapes or depth == 0
            depth = max(depth - 1, 0)
        elif segment not in ("", "."):
            depth += 1
    if escapes:
        with pytest.raises(PathError, match="leaves"):
            normalize_path(raw)


# --- specs ----------------------------------------------------------------------------


def test_specs_are_anthropic_tools_and_agree_on_read_only() -> None:
    assert set(BUILTIN_TOOLS) == {"Read", "Write", "Edit", "Glob", "Grep"}
    assert {name for name, spec in BUILTIN_TOOLS.items() if spec.read_only} == READ_ONLY_TOOLS
    for name, spec in BUILTIN_TOOLS.items():
        api = spec.to_api()
        assert api["name"] == name
        assert api["description"]
        schema = api["input_schema"]
        assert schema["type"] == "object"
        assert set(schema["required"]) <= set(schema["properties"])


# --- input validation -----------------------------------------------------------------


async def test_unknown_tool_is_an_error_outcome() -> None:
    content = await err(MemoryWorkspace(), "Bash", command="ls")
    assert "Unknown built-in tool 'Bash'" in content
    assert "Read" in content


@pytest.mark.parametrize(
    ("name", "tool_input", "message"),
    [
        ("Read", {}, "'file_path' is missing"),
        ("Read", {"file_path": 3}, "'file_path' must be a string, not an integer"),
        ("Read", {"file_path": "a", "offset": "2"}, "'offset' must be an integer"),
        ("Read", {"file_path": "a", "limit": True}, "'limit' must be an integer, not a boolean"),
        ("Read", {"file_path": "a", "limit": 0}, "'limit' must be at least 1"),
        ("Read", {"file_path": "a", "offset": -1}, "'offset' must be at least 0"),
        ("Read", {"file_path": "a", "bogus": 1}, "unknown parameter(s) ['bogus']"),
        (
            "Edit",
            {"file_path": "a", "old_string": "x", "new_string": "y", "replace_all": "yes"},
            "boolean",
        ),
        ("Grep", {"pattern": "x", "output_mode": "lines"}, "'output_mode' must be one of"),
        ("Write", {"file_path": "a", "content": ["x"]}, "'content' must be a string, not an array"),
    ],
)
async def test_invalid_input_is_an_error_outcome(
    name: str, tool_input: dict[str, Any], message: str
) -> None:
    ws = MemoryWorkspace({"a": "x\n"})
    outcome = await run_builtin(name, tool_input, ws)
    assert outcome.is_error
    assert outcome.content.startswith(f"Invalid input for {name}: ")
    assert message in outcome.content
    assert ws.files == {"a": b"x\n"}


async def test_non_object_input_is_an_error_outcome() -> None:
    outcome = await run_builtin("Read", ["a"], MemoryWorkspace())  # type: ignore[arg-type]
    assert outcome.is_error
    assert "JSON object" in outcome.content


async def test_null_optional_parameters_count_as_absent() -> None:
    ws = MemoryWorkspace({"a": "one\n"})
    assert await ok(ws, "Read", file_path="a", offset=None, limit=None) == "     1\tone"


async def test_bad_path_is_an_error_outcome() -> None:
    content = await err(MemoryWorkspace(), "Write", file_path="../x", content="y")
    assert "leaves the workspace root" in content


# --- Read -----------------------------------------------------------------------------


async def test_read_numbers_lines_like_cat_n() -> None:
    ws = MemoryWorkspace({"/src/a.py": "import os\n\n    x = 1\n"})
    assert await ok(ws, "Read", file_path="/src/a.py") == (
        "     1\timport os\n     2\t\n     3\t    x = 1"
    )


async def test_read_offset_and_limit_keep_file_line_numbers() -> None:
    ws = MemoryWorkspace({"a": "".join(f"line {n}\n" for n in range(1, 11))})
    content = await ok(ws, "Read", file_path="a", offset=4, limit=3)
    body, note = content.split("\n\n")
    assert body.splitlines() == ["     4\tline 4", "     5\tline 5", "     6\tline 6"]
    assert "lines 4-6 of 10" in note
    assert "offset=7" in note


async def test_read_offset_zero_reads_from_the_start_and_to_the_end_has_no_note() -> None:
    ws = MemoryWorkspace({"a": "a\nb"})
    assert await ok(ws, "Read", file_path="a", offset=0) == "     1\ta\n     2\tb"
    assert await ok(ws, "Read", file_path="a", offset=2, limit=5) == "     2\tb"


async def test_read_defaults_to_2000_lines() -> None:
    ws = MemoryWorkspace({"a": "x\n" * 2001})
    content = await ok(ws, "Read", file_path="a")
    assert "  2000\tx\n\n(Showing lines 1-2000 of 2001; use offset=2001" in content
    assert "  2001\t" not in content


async def test_read_truncates_long_lines_and_hides_carriage_returns() -> None:
    ws = MemoryWorkspace({"a": "y" * 2005 + "\r\nshort\r\n"})
    first, second = (await ok(ws, "Read", file_path="a")).split("\n")
    assert first == "     1\t" + "y" * 2000 + " [... line truncated, 5 more characters]"
    assert second == "     2\tshort"


async def test_read_empty_file_says_so() -> None:
    assert "is empty" in await ok(MemoryWorkspace({"e": b""}), "Read", file_path="e")


async def test_read_errors() -> None:
    ws = MemoryWorkspace({"dir/a": "one\n", "bin": b"\xff\xfe\x00"})
    assert "File not found: nope" in await err(ws, "Read", file_path="nope")
    assert "dir is a directory" in await err(ws, "Read", file_path="/dir")
    assert "binary" in await err(ws, "Read", file_path="bin")
    assert "has 1 line; offset 2 is past its end" in await err(
        ws, "Read", file_path="dir/a", offset=2
    )


# --- Write ----------------------------------------------------------------------------


async def test_write_creates_then_overwrites() -> None:
    ws = MemoryWorkspace()
    assert await ok(ws, "Write", file_path="/new/dir/f.txt", content="héllo") == (
        "Created new/dir/f.txt (6 bytes)."
    )
    assert await ok(ws, "Write", file_path="new/dir/f.txt", content="") == (
        "Updated new/dir/f.txt (0 bytes)."
    )
    assert ws.files == {"new/dir/f.txt": b""}


async def test_write_refuses_to_clash_with_directories_and_files() -> None:
    ws = MemoryWorkspace({"a/b": "x"})
    assert "a is a directory" in await err(ws, "Write", file_path="a", content="y")
    assert "a/b is a file" in await err(ws, "Write", file_path="a/b/c", content="y")
    assert "surrogate" in await err(ws, "Write", file_path="c", content="\ud800")
    assert ws.files == {"a/b": b"x"}


# --- Edit -----------------------------------------------------------------------------


async def test_edit_replaces_a_unique_string() -> None:
    ws = MemoryWorkspace({"a.py": "def f():\n    return 1\n"})
    content = await ok(ws, "Edit", file_path="/a.py", old_string="return 1", new_string="return 2")
    assert content == "Edited a.py: 1 replacement at line 2."
    assert ws.files["a.py"] == b"def f():\n    return 2\n"


async def test_edit_needs_uniqueness_unless_replace_all() -> None:
    ws = MemoryWorkspace({"a": "x = 1\ny = 1\nx = 1\n"})
    content = await err(ws, "Edit", file_path="a", old_string="x = 1", new_string="x = 2")
    assert "occurs 2 times" in content
    assert "replace_all" in content
    assert ws.files["a"] == b"x = 1\ny = 1\nx = 1\n"

    content = await ok(
        ws, "Edit", file_path="a", old_string="x = 1", new_string="x = 2", replace_all=True
    )
    assert content == "Edited a: 2 replacements (the first at line 1)."
    assert ws.files["a"] == b"x = 2\ny = 1\nx = 2\n"


async def test_edit_matches_multiline_text_in_crlf_files() -> None:
    ws = MemoryWorkspace({"w": "a\r\nb\r\nc\r\n"})
    await ok(ws, "Edit", file_path="w", old_string="a\nb", new_string="A\nB")
    assert ws.files["w"] == b"A\r\nB\r\nc\r\n"


@pytest.mark.parametrize(
    ("tool_input", "message"),
    [
        ({"file_path": "missing", "old_string": "a", "new_string": "b"}, "File not found"),
        ({"file_path": "f", "old_string": "zzz", "new_string": "b"}, "was not found in f"),
        ({"file_path": "f", "old_string": "abc", "new_string": "abc"}, "identical"),
        ({"file_path": "f", "old_string": "", "new_string": "b"}, "use Write"),
        ({"file_path": "bin", "old_string": "a", "new_string": "b"}, "binary"),
        ({"file_path": "f", "old_string": "abc", "new_string": "\ud800"}, "surrogate"),
    ],
)
async def test_edit_errors_leave_files_unchanged(tool_input: dict[str, Any], message: str) -> None:
    ws = MemoryWorkspace({"f": "abc\n", "bin": b"a\xff"})
    outcome = await run_builtin("Edit", tool_input, ws)
    assert outcome.is_error
    assert message in outcome.content
    assert ws.files == {"f": b"abc\n", "bin": b"a\xff"}


# --- Glob -----------------------------------------------------------------------------

GLOB_FILES: dict[str, bytes | str] = {
    "README.md": "",
    "setup.py": "",
    "src/app.py": "",
    "src/app.ts": "",
    "src/deep/er/mod.py": "",
    "src/ui/view.tsx": "",
    "tests/test_app.py": "",
}


@pytest.mark.parametrize(
    ("tool_input", "expected"),
    [
        ({"pattern": "*.py"}, ["setup.py"]),
        (
            {"pattern": "**/*.py"},
            ["setup.py", "src/app.py", "src/deep/er/mod.py", "tests/test_app.py"],
        ),
        ({"pattern": "src/**/*.py"}, ["src/app.py", "src/deep/er/mod.py"]),
        (
            {"pattern": "src/**"},
            ["src/app.py", "src/app.ts", "src/deep/er/mod.py", "src/ui/view.tsx"],
        ),
        ({"pattern": "**/*.{ts,tsx}"}, ["src/app.ts", "src/ui/view.tsx"]),
        ({"pattern": "*.py", "path": "/src"}, ["src/app.py"]),
        ({"pattern": "**/m?d.py", "path": "src/deep"}, ["src/deep/er/mod.py"]),
        ({"pattern": "[!s]*/*_app.py"}, ["tests/test_app.py"]),
        ({"pattern": "/src/*.ts", "path": "tests"}, ["src/app.ts"]),
        ({"pattern": "**"}, sorted(GLOB_FILES)),
    ],
)
async def test_glob_matches(tool_input: dict[str, Any], expected: list[str]) -> None:
    content = await run_builtin("Glob", tool_input, MemoryWorkspace(GLOB_FILES))
    assert not content.is_error
    assert content.content.split("\n") == expected


async def test_glob_says_when_nothing_matched() -> None:
    ws = MemoryWorkspace(GLOB_FILES)
    assert await ok(ws, "Glob", pattern="*.rs") == "No files found matching '*.rs'"
    assert (
        await ok(ws, "Glob", pattern="*.rs", path="src") == "No files found matching '*.rs' in src"
    )


async def test_glob_errors() -> None:
    ws = MemoryWorkspace(GLOB_FILES)
    assert "Directory not found: nope" in await err(ws, "Glob", pattern="*", path="nope")
    assert "setup.py is a file" in await err(ws, "Glob", pattern="*", path="setup.py")
    assert "contains '..'" in await err(ws, "Glob", pattern="../*")
    assert "too many" in await err(ws, "Glob", pattern="{a,b}" * 9)


def test_glob_star_never_crosses_a_slash() -> None:
    assert compile_glob("a*b").fullmatch("a/b") is None
    assert compile_glob("a?b").fullmatch("a/b") is None
    assert compile_glob("a[!x]b").fullmatch("a/b") is None
    assert compile_glob("[ab]*").fullmatch("b.c")
    assert compile_glob("a[").fullmatch("a[")


# --- Grep -----------------------------------------------------------------------------

GREP_FILES: dict[str, bytes | str] = {
    "a.py": "import os\nTODO: fix\nprint('todo')\n",
    "lib/b.py": "todo = 1\n",
    "lib/c.txt": "TODO later\nTODO sooner\n",
    "img.bin": b"TODO\xff\xfe",
}


async def test_grep_lists_files_with_matches_by_default() -> None:
    ws = MemoryWorkspace(GREP_FILES)
    assert await ok(ws, "Grep", pattern="TODO") == "a.py\nlib/c.txt"


async def test_grep_content_and_count_modes() -> None:
    ws = MemoryWorkspace(GREP_FILES)
    assert await ok(ws, "Grep", pattern="TODO", output_mode="content") == (
        "a.py:2:TODO: fix\nlib/c.txt:1:TODO later\nlib/c.txt:2:TODO sooner"
    )
    assert await ok(ws, "Grep", pattern="TODO", output_mode="count") == "a.py:1\nlib/c.txt:2"


async def test_grep_case_insensitive() -> None:
    ws = MemoryWorkspace(GREP_FILES)
    assert await ok(ws, "Grep", pattern="todo", **{"-i": True}) == "a.py\nlib/b.py\nlib/c.txt"
    assert await ok(ws, "Grep", pattern="todo", **{"-i": False}) == "a.py\nlib/b.py"


async def test_grep_narrows_by_path_and_glob() -> None:
    ws = MemoryWorkspace(GREP_FILES)
    assert await ok(ws, "Grep", pattern="(?i)todo", glob="*.py") == "a.py\nlib/b.py"
    assert await ok(ws, "Grep", pattern="(?i)todo", glob="lib/*.py") == "lib/b.py"
    assert await ok(ws, "Grep", pattern="(?i)todo", path="/lib") == "lib/b.py\nlib/c.txt"
    assert await ok(ws, "Grep", pattern="T", path="lib/c.txt", output_mode="count") == "lib/c.txt:2"


async def test_grep_without_matches_and_errors() -> None:
    ws = MemoryWorkspace(GREP_FILES)
    assert await ok(ws, "Grep", pattern="nothing here") == "No matches found."
    assert "invalid regular expression '('" in await err(ws, "Grep", pattern="(")
    assert "invalid regular expression" in await err(ws, "Grep", pattern="a{1001}")
    assert "look-around" in await err(ws, "Grep", pattern="(?=a)")
    assert "back-references" in await err(ws, "Grep", pattern=r"(a)\1")
    assert "Directory not found: zzz" in await err(ws, "Grep", pattern="x", path="zzz")
    assert "leaves the workspace root" in await err(ws, "Grep", pattern="x", path="../..")


# --- truncate_middle ------------------------------------------------------------------


def test_truncate_middle_leaves_text_at_the_limit_alone() -> None:
    assert truncate_middle("x" * 100, 100) == "x" * 100
    assert truncate_middle("", 0) == ""


def test_truncate_middle_one_over_the_limit() -> None:
    text = "h" * 70 + "m" + "t" * 30
    assert truncate_middle(text, 100) == "h" * 70 + TRUNCATION_MARKER.format(1) + "t" * 30


def test_truncate_middle_keeps_70_percent_head_and_30_percent_tail() -> None:
    text = "".join(chr(ord("a") + n % 26) for n in range(12_345))
    result = truncate_middle(text, 1000)
    marker = TRUNCATION_MARKER.format(12_345 - 1000)
    assert marker == "\n\n[... 11345 characters truncated ...]\n\n"
    assert result == text[:700] + marker + text[-300:]
    assert len(result) == 1000 + len(marker)


@pytest.mark.parametrize("max_chars", [0, 1, 3, 9])
def test_truncate_middle_small_limits(max_chars: int) -> None:
    text = "0123456789ab"
    result = truncate_middle(text, max_chars)
    head = max_chars * 7 // 10
    marker = TRUNCATION_MARKER.format(len(text) - max_chars)
    assert result == text[:head] + marker + text[len(text) - (max_chars - head) :]


def test_truncate_middle_refuses_a_negative_limit() -> None:
    with pytest.raises(ValueError, match="negative"):
        truncate_middle("x", -1)
