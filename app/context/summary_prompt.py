"""The compaction summary: the instruction that asks for it, reading the answer, and the
user message that carries it into the compacted conversation.

The summary request is usually the conversation exactly as the model last saw it plus
this instruction as a final user message, so it is read from the prompt cache; the
same tool definitions are sent (changing them would miss the cache), which is why the
instruction opens and closes with a blunt "no tools": a tool call would waste the only
turn the summariser gets. The fixed sections follow Claude Code's compaction prompt,
whose summaries let a session carry on after most of it is forgotten: the user's own
words and the exact point where work stopped matter most, so both are asked for
verbatim. `SUMMARY_MARKER` is a fixed phrase of the instruction, by which a stand-in
model (the offline provider, the tests' fake API) recognises a summary request.
"""

from __future__ import annotations

import re

SUMMARY_MARKER = "Your task is to create a detailed summary of the conversation so far"

NO_TOOLS_PREAMBLE = """\
CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.

- Do NOT use Read, Write, Edit, Glob, Grep, Bash or ANY other tool, built-in or not.
- Everything you need is already in the conversation above.
- A tool call will be rejected and will waste your only turn: the summary will be lost.
- Your whole answer must be plain text: an <analysis> block, then a <summary> block.
"""

_SECTIONS = """\
Your summary must have exactly these sections:

1. Primary Request and Intent: every explicit request and intent of the user, in detail.
2. Key Technical Concepts: the technologies, frameworks, conventions and ideas discussed.
3. Files and Code Sections: each file read, changed or created, why it matters, a
   summary of the changes, and the important code snippets in full.
4. Errors and fixes: every error met and how it was fixed, with any feedback the user
   gave about it.
5. Problem Solving: problems solved and troubleshooting still under way.
6. All user messages: every message the user wrote (not tool results), in order; they
   show how the user's wishes changed.
7. Pending Tasks: tasks the user asked for that are not done yet.
8. Current Work: precisely what was being worked on immediately before this request,
   with file names and code snippets.
9. Optional Next Step: the next step, only if it follows directly from the user's most
   recent request and the current work. Quote the most recent conversation verbatim to
   show exactly which task was in progress and where it stopped, so the work resumes
   without drift. Leave this out if the last task was finished.
"""

_INSTRUCTION = f"""\
{SUMMARY_MARKER}, paying close attention to the user's explicit requests and to your \
own previous actions. It will replace the conversation, so it must be thorough about \
the technical details, code and decisions needed to carry on the work without losing \
context.

First, inside <analysis> tags, go through the conversation in order and note for each \
part: the user's requests and intents, your approach, the decisions taken, file names, \
code snippets, function signatures and edits, the errors met and their fixes, and what \
the user said about your work (especially corrections). Check that nothing technical is \
missing or wrong. This analysis is a scratchpad and will be thrown away.

Then write the summary inside <summary> tags.

{_SECTIONS}
The answer looks like this:

<analysis>
[your notes]
</analysis>

<summary>
1. Primary Request and Intent:
   [details]

2. Key Technical Concepts:
   - [concept]

...

9. Optional Next Step:
   [the next step, with verbatim quotes]
</summary>
"""

_REMINDER = "REMINDER: answer with plain text only (<analysis> then <summary>); call no tools."


def summary_instruction(custom: str | None = None) -> str:
    """The final user message of a summary request. `custom`: the caller's extra
    instructions (a manual compaction's "focus on ..."), appended."""
    parts = [NO_TOOLS_PREAMBLE, _INSTRUCTION]
    if custom and custom.strip():
        parts.append(f"Additional instructions for this summary:\n{custom.strip()}\n")
    parts.append(_REMINDER)
    return "\n".join(parts)


def transcript_request(transcript: str, custom: str | None = None, prompts: str = "") -> str:
    """A summary request for a conversation given as text (render_for_summary), for
    when it cannot be sent as the cached message prefix. `prompts`: a `prompts_section`
    placed between the transcript and the instruction."""
    between = f"{prompts}\n\n" if prompts else ""
    return (
        "The conversation so far, as a transcript:\n\n"
        f"<transcript>\n{transcript}\n</transcript>\n\n{between}{summary_instruction(custom)}"
    )


_ANALYSIS = re.compile(r"<analysis>.*?</analysis>", re.DOTALL)
_SUMMARY = re.compile(r"<summary>(.*?)(?:</summary>|\Z)", re.DOTALL)


def extract_summary(text: str) -> str:
    """The summary from a summariser's answer: the `<analysis>` scratchpad removed, the
    content of `<summary>` returned (up to the end when its closing tag is missing, as
    in an answer cut off by max_tokens); without tags, the whole answer trimmed."""
    without_analysis = _ANALYSIS.sub("", text)
    match = _SUMMARY.search(without_analysis)
    if match:
        return match.group(1).strip()
    if "<analysis>" in without_analysis:  # an unclosed scratchpad: nothing after it
        without_analysis = without_analysis.split("<analysis>", 1)[0]
    return without_analysis.strip()


CONTINUATION_HEADER = (
    "This session is being continued from a previous conversation that ran out of "
    "context. The summary below covers the earlier portion of the conversation."
)
CONTINUE_INSTRUCTION = (
    "Please continue the conversation from where we left it off without asking the "
    "user any further questions. Continue with the last task that you were asked to "
    "work on."
)


def summary_message(
    summary: str, recent_user_messages: list[str], *, continue_work: bool = False
) -> str:
    """The text of the compact_summary user message. `recent_user_messages` (oldest
    first) are quoted verbatim, each in `<user_message>` tags, since a summary
    paraphrases; `continue_work` adds the instruction to carry on without asking (for
    an automatic compaction in the middle of a run)."""
    parts = [CONTINUATION_HEADER, "", summary.strip()]
    if recent_user_messages:
        parts += ["", "The user's most recent messages, verbatim (oldest first):"]
        parts += [f"<user_message>\n{m}\n</user_message>" for m in recent_user_messages]
    if continue_work:
        parts += ["", CONTINUE_INSTRUCTION]
    return "\n".join(parts)


_QUOTED = re.compile(r"<user_message>\n(.*?)\n</user_message>", re.DOTALL)


def quoted_user_messages(summary_text: str) -> list[str]:
    """The user's messages a compact_summary message quotes verbatim (oldest first):
    the inverse of what `summary_message` writes."""
    return _QUOTED.findall(summary_text)


PROMPTS_HEADER = (
    "The user's messages in the part of the conversation being summarised that the "
    "conversation above does not show word for word (they are in collapsed spans or in "
    "parts left out), verbatim, oldest first. Section 6 must cover them too:"
)


def prompts_section(prompts: list[str]) -> str:
    """A block listing user messages verbatim, for a summary request whose input would
    otherwise not show them (empty when there are none)."""
    if not prompts:
        return ""
    quoted = "\n".join(f"<user_message>\n{p}\n</user_message>" for p in prompts)
    return f"{PROMPTS_HEADER}\n{quoted}"
