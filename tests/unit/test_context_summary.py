"""Rendering for the summariser, the summary prompt, reading the answer."""

from __future__ import annotations

from app.context.render import render_for_summary, shorten
from app.context.summary_prompt import (
    CONTINUATION_HEADER,
    CONTINUE_INSTRUCTION,
    NO_TOOLS_PREAMBLE,
    SUMMARY_MARKER,
    extract_summary,
    summary_instruction,
    summary_message,
    transcript_request,
)
from app.context.types import ASSISTANT, COMPACT_BOUNDARY, COMPACT_SUMMARY, SYSTEM, USER
from tests.unit.strategies import IMAGE, node, text, thinking, tool_result, tool_use


def test_render_for_summary_exact() -> None:
    h = [
        node("s", USER, [text("Earlier: set up the repo.")], subtype=COMPACT_SUMMARY),
        node("b", None, [], type=SYSTEM, subtype=COMPACT_BOUNDARY),
        node("q", USER, [text("Fix login in foo.py"), IMAGE]),
        node(
            "a",
            ASSISTANT,
            [
                thinking("secret reasoning"),
                text("Reading it."),
                tool_use("t1", "Read", file_path="foo.py"),
            ],
        ),
        node("r", USER, [tool_result("t1", "x" * 600)]),
        node("a2", ASSISTANT, [tool_use("t2", "Bash", command="pytest")]),
        node("r2", USER, [tool_result("t2", [text("1 failed")], is_error=True)]),
        node("err", ASSISTANT, [text("API Error")], subtype="api_error"),
    ]
    assert render_for_summary(h) == "\n\n".join(
        [
            "Summary of the conversation before this: Earlier: set up the repo.",
            "User: Fix login in foo.py\n[image]",
            'Assistant: Reading it.\n[called Read({"file_path": "foo.py"})]',
            f"User: [result: {'x' * 500}… [100 more characters]]",
            'Assistant: [called Bash({"command": "pytest"})]',
            "User: [result (error): 1 failed]",
        ]
    )


def test_render_shortens_tool_input() -> None:
    h = [node("a", ASSISTANT, [tool_use("t", "Write", file_path="a", content="y" * 500)])]
    line = render_for_summary(h, max_input_chars=30)
    expected = '[called Write({"file_path": "a", "content": … [503 more characters])]'
    assert line == f"Assistant: {expected}"


def test_shorten() -> None:
    assert shorten("abc", 3) == "abc"
    assert shorten("abcd", 3) == "abc… [1 more characters]"


def test_extract_summary_strips_analysis() -> None:
    answer = (
        "<analysis>\nLet me think about <summary> tags and the files.\n</analysis>\n\n"
        "<summary>\n1. Primary Request and Intent:\n   Fix login.\n</summary>\n"
    )
    assert extract_summary(answer) == "1. Primary Request and Intent:\n   Fix login."


def test_extract_summary_without_tags_or_closing_tag() -> None:
    assert extract_summary("  just a summary \n") == "just a summary"
    assert (
        extract_summary("<analysis>x</analysis><summary>cut off by max_tok") == "cut off by max_tok"
    )
    assert extract_summary("<analysis>only thinking, cut off") == ""


def test_summary_instruction_has_the_sections_and_custom_text() -> None:
    prompt = summary_instruction("Focus on the database schema.")
    assert prompt.startswith(NO_TOOLS_PREAMBLE)
    assert SUMMARY_MARKER in prompt
    sections = [
        "1. Primary Request and Intent",
        "2. Key Technical Concepts",
        "3. Files and Code Sections",
        "4. Errors and fixes",
        "5. Problem Solving",
        "6. All user messages",
        "7. Pending Tasks",
        "8. Current Work",
        "9. Optional Next Step",
    ]
    positions = [prompt.index(s) for s in sections]
    assert positions == sorted(positions)
    assert "verbatim" in prompt[positions[-1] :]
    assert "<analysis>" in prompt
    assert "<summary>" in prompt
    assert prompt.index("Focus on the database schema.") > positions[-1]
    assert "Additional instructions" not in summary_instruction()
    assert "Additional instructions" not in summary_instruction("   ")


def test_transcript_request_wraps_the_rendered_text() -> None:
    request = transcript_request("User: hi")
    assert "<transcript>\nUser: hi\n</transcript>" in request
    assert SUMMARY_MARKER in request


def test_summary_message() -> None:
    assert summary_message(" S ", []) == f"{CONTINUATION_HEADER}\n\nS"
    message = summary_message("S", ["first  ", "second\nline"], continue_work=True)
    assert message == "\n".join(
        [
            CONTINUATION_HEADER,
            "",
            "S",
            "",
            "The user's most recent messages, verbatim (oldest first):",
            "<user_message>\nfirst  \n</user_message>",
            "<user_message>\nsecond\nline\n</user_message>",
            "",
            CONTINUE_INSTRUCTION,
        ]
    )
