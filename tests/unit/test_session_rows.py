"""The per-process cache of session rows: exact values with their version, bounded in
bytes, least recently used out first."""

from __future__ import annotations

import uuid

from app.conversation.session_rows import SessionRows
from app.models import AgentSession


def row(system: str | None = None) -> AgentSession:
    return AgentSession(
        id=uuid.uuid4(),
        tenant="t",
        model="m",
        system=system,
        tools=[],
        meta={},
        compaction={},
        message_seq=0,
        token_budget=None,
    )


def test_a_kept_row_is_its_values_with_the_changes_and_their_version() -> None:
    rows = SessionRows()
    session = row("Be brief.")
    head = uuid.uuid4()
    rows.keep(session, "100", message_seq=3, head_uuid=head)
    kept = rows.get(session.id)
    assert kept is not None
    assert kept.version == "100"
    assert kept.values["system"] == "Be brief."
    assert (kept.values["message_seq"], kept.values["head_uuid"]) == (3, head)
    assert session.message_seq == 0, "the instance itself is not changed"
    rows.forget(session.id)
    assert rows.get(session.id) is None
    assert rows.size == 0


def test_rows_are_bounded_in_bytes_least_recently_used_out_first() -> None:
    small = [row() for _ in range(3)]
    rows = SessionRows()
    rows.keep(small[0], "1")
    one = rows.size
    rows = SessionRows(max_bytes=3 * one)
    for session in small:
        rows.keep(session, "1")
    assert rows.get(small[0].id) is not None  # used: now the most recent
    rows.keep(row(), "1")
    assert rows.get(small[1].id) is None, "the least recently used left"
    assert rows.get(small[0].id) is not None
    assert rows.size == sum(kept.size for kept in rows.entries.values()) <= rows.max_bytes

    large = row("x" * 10 * one)  # one long system prompt weighs more than many rows
    rows.keep(large, "1")
    assert rows.get(large.id) is None, "larger than the whole cache: not kept"
    assert rows.size == sum(kept.size for kept in rows.entries.values())


def test_keeping_a_row_again_counts_its_size_once() -> None:
    rows = SessionRows()
    session = row("y" * 5_000)
    rows.keep(session, "1")
    first = rows.size
    for version in ("2", "3"):
        rows.keep(session, version, message_seq=int(version))
    assert rows.size == first
    session.system = "z" * 50_000  # another prompt: weighed again
    rows.keep(session, "4")
    assert rows.size > first + 40_000
