"""Transcripts: export in Claude Code's JSONL shape, import of real and synthetic files
(merging streamed responses, re-attaching under skipped lines, line-numbered errors)."""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncConnection, async_sessionmaker

from app.context.normalize import validate_api_messages
from app.main import create_app
from tests.api.seed import add, new_session, text
from tests.conftest import TEST_KEY, make_settings

DATA = Path(__file__).parents[1] / "data" / "transcripts"  # provenance in SOURCES.md there
COMPACTED = DATA / "entireio-compacted.jsonl"  # 1.3 MB, one compact boundary
PARALLEL = DATA / "copilot-parallel-tools.jsonl"  # four parallel tool calls
SUBAGENT = DATA / "copilot-subagent.jsonl"
# A larger corpus (the layout of Entire's checkpoint branch) when PARLEY_TRANSCRIPTS names one.
CORPUS = os.environ.get("PARLEY_TRANSCRIPTS")
BIG = Path(CORPUS or "missing") / "entireio-cli/bc/cb77bb88fa/1/full.jsonl"  # 4 MB, two boundaries

NDJSON = {"Content-Type": "application/x-ndjson"}
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def needs(path: Path) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not path.is_file(), reason=f"{path} is not available")


# --- helpers ----------------------------------------------------------------------------


async def seed_compacted(conn: AsyncConnection, sid: str) -> list[uuid.UUID]:
    """user, assistant (tool use), user (result), assistant, boundary, summary, user,
    meta user, attachment: the full chain in order."""
    u1 = await add(conn, sid, None, **text("user", "hello"))
    use = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "a"}}
    a1 = await add(
        conn,
        sid,
        u1,
        type="assistant",
        role="assistant",
        content=[{"type": "thinking", "thinking": "hm", "signature": "sig"}, use],
        model="claude-sonnet-4-5",
        stop_reason="tool_use",
        usage={"input_tokens": 10, "output_tokens": 5},
    )
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "file a"}
    u2 = await add(conn, sid, a1, type="user", role="user", content=[result])
    a2 = await add(conn, sid, u2, **text("assistant", "done", model="claude-sonnet-4-5"))
    boundary = await add(
        conn,
        sid,
        None,
        type="system",
        subtype="compact_boundary",
        role=None,
        content=[],
        logical_parent_uuid=a2,
        metadata={"trigger": "manual", "pre_tokens": 1234, "post_tokens": 100},
    )
    summary = await add(
        conn, sid, boundary, **text("user", "the summary", subtype="compact_summary")
    )
    u3 = await add(conn, sid, summary, **text("user", "go on"))
    meta = await add(conn, sid, u3, **text("user", "a reminder", is_meta=True))
    attached = await add(
        conn,
        sid,
        meta,
        type="attachment",
        subtype="file",
        role="user",
        content=[{"type": "text", "text": "contents of a"}],
        is_meta=True,
    )
    return [u1, a1, u2, a2, boundary, summary, u3, meta, attached]


async def export(api: httpx.AsyncClient, sid: str) -> bytes:
    response = await api.get(f"/sessions/{sid}/transcript")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    return response.content


def parse(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in body.decode().splitlines()]


async def import_file(api: httpx.AsyncClient, body: Any, **params: Any) -> httpx.Response:
    return await api.post("/sessions/import", content=body, headers=NDJSON, params=params)


async def imported(api: httpx.AsyncClient, body: Any, **params: Any) -> dict[str, Any]:
    response = await import_file(api, body, **params)
    assert response.status_code == 201, response.text
    return dict(response.json())


async def chain(api: httpx.AsyncClient, sid: str, view: str = "full") -> list[dict[str, Any]]:
    response = await api.get(f"/sessions/{sid}/messages", params={"view": view, "limit": 1000})
    assert response.status_code == 200, response.text
    return list(response.json()["data"])


async def tree(api: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 1000, **({"after": after} if after else {})}
        page = (await api.get(f"/sessions/{sid}/tree", params=params)).json()
        nodes += page["data"]
        after = page["next_cursor"]
        if after is None:
            return nodes


async def next_request_problems(api: httpx.AsyncClient, sid: str) -> list[str]:
    response = await api.get(f"/sessions/{sid}/context/request")
    assert response.status_code == 200, response.text
    return validate_api_messages(response.json()["messages"])


async def session_count(api: httpx.AsyncClient) -> int:
    return len((await api.get("/sessions", params={"limit": 500})).json()["data"])


def jsonl(*lines: dict[str, Any]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def user(uid: str, parent: Any, content: Any, **extra: Any) -> dict[str, Any]:
    return {
        "type": "user",
        "uuid": uid,
        "parentUuid": parent,
        "isSidechain": False,
        "timestamp": "2026-01-02T03:04:05.678Z",
        "message": {"role": "user", "content": content},
        **extra,
    }


def assistant(
    uid: str, parent: str | None, msg_id: str, *blocks: Any, **extra: Any
) -> dict[str, Any]:
    return {
        "type": "assistant",
        "uuid": uid,
        "parentUuid": parent,
        "isSidechain": False,
        "timestamp": "2026-01-02T03:04:06.000Z",
        "message": {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": "claude-opus-4-5-20251101",
            "content": list(blocks),
            "stop_reason": None,
            "usage": {"input_tokens": 3, "output_tokens": 1, "service_tier": "standard"},
        },
        **extra,
    }


def tool_use(use_id: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": use_id, "name": "Bash", "input": {"command": "ls"}}


def tool_result(use_id: str) -> list[dict[str, Any]]:
    return [{"type": "tool_result", "tool_use_id": use_id, "content": f"out {use_id}"}]


def file_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def boundaries_in(path: Path) -> list[dict[str, Any]]:
    return [
        line
        for line in file_lines(path)
        if line.get("type") == "system" and line.get("subtype") == "compact_boundary"
    ]


async def chunked(body: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


# --- export -----------------------------------------------------------------------------


async def test_export_shape(api: httpx.AsyncClient, conn: AsyncConnection) -> None:
    sid = await new_session(api)
    ids = await seed_compacted(conn, sid)
    lines = parse(await export(api, sid))

    assert [line["uuid"] for line in lines] == [str(i) for i in ids]
    for line, parent in zip(lines, [None, *ids[:-1]], strict=True):
        assert line["sessionId"] == sid
        assert line["isSidechain"] is False
        assert TIMESTAMP.match(line["timestamp"])
        if line["uuid"] != str(ids[4]):
            assert line["parentUuid"] == (str(parent) if parent else None)
    first, use, _, _, boundary, summary, after, meta, attached = lines
    assert first["type"] == "user"
    assert first["message"] == {"role": "user", "content": [{"type": "text", "text": "hello"}]}
    assert use["type"] == "assistant"
    message = use["message"]
    assert message["role"] == "assistant"
    assert message["type"] == "message"
    assert message["id"].startswith("msg_")
    assert message["model"] == "claude-sonnet-4-5"
    assert message["stop_reason"] == "tool_use"
    assert message["usage"] == {"input_tokens": 10, "output_tokens": 5}
    assert message["content"][0]["signature"] == "sig"
    assert boundary["type"] == "system"
    assert boundary["subtype"] == "compact_boundary"
    assert boundary["parentUuid"] is None
    assert boundary["logicalParentUuid"] == str(ids[3])
    assert boundary["content"] == "Conversation compacted"
    assert boundary["compactMetadata"] == {"trigger": "manual", "preTokens": 1234}
    assert "message" not in boundary
    assert summary["isCompactSummary"] is True
    assert summary["type"] == "user"
    assert "isCompactSummary" not in after
    assert "isMeta" not in after
    assert meta["isMeta"] is True
    assert attached["type"] == "attachment"
    assert attached["subtype"] == "file"  # Parley's own, read back on import
    assert attached["message"]["role"] == "user"


async def test_export_of_an_empty_and_an_unknown_session(api: httpx.AsyncClient) -> None:
    sid = await new_session(api)
    assert await export(api, sid) == b""
    missing = await api.get(f"/sessions/{uuid.uuid4()}/transcript")
    assert missing.status_code == 404


# --- round trips ------------------------------------------------------------------------


def shape(messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(m["type"], m["subtype"], m["role"], m["content"], m["is_meta"]) for m in messages]


async def test_export_import_round_trip(api: httpx.AsyncClient, conn: AsyncConnection) -> None:
    sid = await new_session(api)
    await seed_compacted(conn, sid)
    body = await export(api, sid)
    session = await imported(api, body, title="copy")
    assert session["title"] == "copy"
    assert session["model"] == "claude-sonnet-4-5"
    assert session["status"] == "idle"

    original, copy = await chain(api, sid), await chain(api, session["id"])
    assert shape(copy) == shape(original)
    assert session["head_uuid"] == copy[-1]["uuid"]
    assert {m["uuid"] for m in copy}.isdisjoint(m["uuid"] for m in original)
    assert [m["metadata"]["source_uuid"] for m in copy] == [m["uuid"] for m in original]
    boundary = copy[4]
    assert boundary["parent_uuid"] is None
    assert boundary["logical_parent_uuid"] == copy[3]["uuid"]
    assert boundary["metadata"]["trigger"] == "manual"
    assert boundary["metadata"]["pre_tokens"] == 1234
    parents = [m["parent_uuid"] for m in copy]
    assert parents == [None, *(m["uuid"] for m in copy[:3]), None, *(m["uuid"] for m in copy[4:-1])]
    api_view = await chain(api, session["id"], view="api")
    assert api_view[0]["subtype"] == "compact_summary"
    assert await next_request_problems(api, session["id"]) == []
    # And back out again: the same conversation, in the same shape.
    again = parse(await export(api, session["id"]))
    assert [(x["type"], x.get("message")) for x in again] == [
        (x["type"], x.get("message")) for x in parse(body)
    ]


async def test_importing_twice_makes_two_independent_sessions(
    api: httpx.AsyncClient, conn: AsyncConnection
) -> None:
    sid = await new_session(api)
    await seed_compacted(conn, sid)
    body = await export(api, sid)
    one, two = await imported(api, body), await imported(api, body)
    assert one["id"] != two["id"]
    first, second = await chain(api, one["id"]), await chain(api, two["id"])
    assert shape(first) == shape(second)
    assert {m["uuid"] for m in first}.isdisjoint(m["uuid"] for m in second)
    assert [m["metadata"]["source_uuid"] for m in first] == [
        m["metadata"]["source_uuid"] for m in second
    ]
    deleted = await api.delete(f"/sessions/{one['id']}")
    assert deleted.status_code == 204
    assert len(await chain(api, two["id"])) == len(second)


# --- real Claude Code files -------------------------------------------------------------


@needs(COMPACTED)
async def test_real_transcript_with_compact_boundary(api: httpx.AsyncClient) -> None:
    lines = file_lines(COMPACTED)
    session = await imported(api, COMPACTED.read_bytes())
    sid = session["id"]
    models = [
        x["message"]["model"]
        for x in lines
        if x.get("type") == "assistant" and x["message"]["model"] != "<synthetic>"
    ]
    assert session["model"] == models[-1]

    full = await chain(api, sid)
    assert full[0]["parent_uuid"] is None
    found = [m for m in full if m["subtype"] == "compact_boundary"]
    assert len(found) == len(boundaries_in(COMPACTED)) == 1
    assert found[0]["metadata"]["trigger"] == "auto"
    assert found[0]["logical_parent_uuid"] is not None
    summaries = [x for x in lines if x.get("isCompactSummary")]
    api_view = await chain(api, sid, view="api")
    assert api_view[0]["subtype"] == "compact_summary"
    assert api_view[0]["metadata"]["source_uuid"] == summaries[-1]["uuid"]
    assert api_view[0]["content"][0]["text"] == summaries[-1]["message"]["content"]
    assert await next_request_problems(api, sid) == []

    # One message per streamed response; sources are found again by their uuids.
    nodes = await tree(api, sid)
    responses = {x["message"]["id"] for x in lines if x.get("type") == "assistant"}
    assert sum(1 for n in nodes if n["type"] == "assistant") == len(responses)
    kept = [x for x in lines if x.get("type") in ("user", "assistant")]
    sources = {s for m in full for s in m["metadata"].get("source_uuids", [])}
    sources |= {m["metadata"]["source_uuid"] for m in full}
    assert kept[-1]["uuid"] in sources  # the head is the file's last message


@needs(PARALLEL)
async def test_parallel_tool_calls_merge_and_keep_every_result(api: httpx.AsyncClient) -> None:
    """Claude Code writes each parallel tool_use on its own line and each result under
    the line of its own tool_use: one message, then all four results, on one chain."""
    session = await imported(api, PARALLEL.read_bytes())
    full = await chain(api, session["id"])
    assert [m["role"] for m in full] == ["user", "assistant", *["user"] * 4, "assistant"]
    uses = [b["id"] for b in full[1]["content"] if b["type"] == "tool_use"]
    results = [m["content"][0]["tool_use_id"] for m in full[2:6]]
    assert len(uses) == 4
    assert results == uses
    assert len(full[1]["metadata"]["source_uuids"]) == 5  # thinking + four tool uses
    assert await next_request_problems(api, session["id"]) == []


@needs(BIG)
async def test_biggest_file_keeps_both_boundaries(api: httpx.AsyncClient) -> None:
    session = await imported(api, BIG.read_bytes())
    full = await chain(api, session["id"])
    assert sum(m["subtype"] == "compact_boundary" for m in full) == len(boundaries_in(BIG))
    assert (await chain(api, session["id"], view="api"))[0]["subtype"] == "compact_summary"
    assert session["context"]["estimated_tokens"] > 0
    assert await next_request_problems(api, session["id"]) == []


@needs(SUBAGENT)
async def test_a_subagent_file_alone_has_nothing_to_import(api: httpx.AsyncClient) -> None:
    before = await session_count(api)
    response = await import_file(api, SUBAGENT.read_bytes())
    assert response.status_code == 422
    assert response.json()["type"] == "invalid_request"
    assert await session_count(api) == before


# --- synthetic files: the rules one by one ----------------------------------------------


async def test_lines_sharing_a_message_id_merge(api: httpx.AsyncClient) -> None:
    """Blocks concatenate in order, usage and stop_reason come from the last line, and a
    result written between two block lines of the response stays on the chain."""
    last = assistant("a3", "r1", "msg_1", tool_use("t2"))
    last["message"].update(stop_reason="tool_use", usage={"input_tokens": 7, "output_tokens": 9})
    body = jsonl(
        user("u1", None, "list files"),
        assistant("a1", "u1", "msg_1", {"type": "thinking", "thinking": "x", "signature": "s"}),
        assistant("a2", "a1", "msg_1", tool_use("t1")),
        user("r1", "a2", tool_result("t1")),
        last,
        user("r2", "a3", tool_result("t2")),
        assistant("a4", "r2", "msg_2", {"type": "text", "text": "two files"}),
    )
    session = await imported(api, body)
    full = await chain(api, session["id"])
    assert [m["role"] for m in full] == ["user", "assistant", "user", "user", "assistant"]
    merged = full[1]
    assert [b["type"] for b in merged["content"]] == ["thinking", "tool_use", "tool_use"]
    assert merged["stop_reason"] == "tool_use"
    assert merged["usage"] == {"input_tokens": 7, "output_tokens": 9}
    assert merged["metadata"]["source_uuids"] == ["a1", "a2", "a3"]
    assert merged["metadata"]["source_message_id"] == "msg_1"
    assert [m["metadata"]["source_uuid"] for m in full] == ["u1", "a1", "r1", "r2", "a4"]
    assert full[0]["content"] == [{"type": "text", "text": "list files"}]
    assert full[0]["created_at"].startswith("2026-01-02T03:04:05.678")
    assert session["head_uuid"] == full[-1]["uuid"]
    assert await next_request_problems(api, session["id"]) == []


async def test_a_parent_that_was_skipped_is_bridged(api: httpx.AsyncClient) -> None:
    progress = {"type": "progress", "uuid": "p1", "parentUuid": "u1", "data": {}}
    hook = {"type": "system", "subtype": "stop_hook_summary", "uuid": "s1", "parentUuid": "p1"}
    snapshot = {"type": "file-history-snapshot", "messageId": "u1", "snapshot": {}}
    title = {"type": "summary", "summary": "A short chat", "leafUuid": "a1"}
    body = jsonl(
        title,
        snapshot,
        user("u1", None, "hi"),
        progress,
        hook,
        assistant("a1", "s1", "msg_1", {"type": "text", "text": "hello"}),
    )
    session = await imported(api, body)
    assert session["title"] == "A short chat"
    full = await chain(api, session["id"])
    assert [m["metadata"]["source_uuid"] for m in full] == ["u1", "a1"]
    assert full[1]["parent_uuid"] == full[0]["uuid"]
    assert len(await tree(api, session["id"])) == 2


async def test_sidechain_lines_are_skipped(api: httpx.AsyncClient) -> None:
    body = jsonl(
        user("u1", None, "review this"),
        user("s1", None, "subagent prompt", isSidechain=True, agentId="a1"),
        assistant("s2", "s1", "msg_s", {"type": "text", "text": "sub"}, isSidechain=True),
        assistant("a1", "u1", "msg_1", {"type": "text", "text": "reviewed"}),
    )
    session = await imported(api, body, model="claude-haiku-4-5")
    assert session["model"] == "claude-haiku-4-5"
    nodes = await tree(api, session["id"])
    assert [n["preview"] for n in nodes] == ["review this", "reviewed"]


async def test_blank_lines_crlf_and_small_chunks(api: httpx.AsyncClient) -> None:
    body = b"\r\n" + jsonl(user("u1", None, "hi")).replace(b"\n", b"\r\n") + b"\n\n"
    body += json.dumps(assistant("a1", "u1", "m", {"type": "text", "text": "yo"})).encode()
    session = await imported(api, chunked(body, 7))
    full = await chain(api, session["id"])
    assert [m["content"][0]["text"] for m in full] == ["hi", "yo"]


MALFORMED = [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "not a JSON object"),
    (json.dumps({"type": "user", "message": {"role": "user", "content": "x"}}), "uuid"),
    (json.dumps({"type": "user", "uuid": "x"}), "message"),
    (json.dumps(user("x", None, 5)), "message.content"),
    (json.dumps(user("x", None, [{"text": "no type"}])), "content[0]"),
    (json.dumps(user("x", 7, "hi")), "parentUuid"),
]


@pytest.mark.parametrize(("bad", "reason"), MALFORMED)
async def test_a_malformed_line_is_named_and_nothing_is_stored(
    api: httpx.AsyncClient, bad: bytes | str, reason: str
) -> None:
    bad_line = bad.encode() if isinstance(bad, str) else bad
    good = jsonl(user("u1", None, "hi"), assistant("a1", "u1", "m", {"type": "text", "text": "y"}))
    body = good + b"\n" + bad_line + b"\n" + jsonl(user("u2", "a1", "more"))
    before = await session_count(api)
    response = await import_file(api, chunked(body, 5))
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["type"] == "invalid_request"
    assert problem["detail"].startswith("line 4: ")  # two lines, a blank one, then it
    assert reason in problem["detail"]
    assert problem["errors"][0]["loc"] == ["body", "line", 4]
    assert await session_count(api) == before


@pytest.mark.parametrize("body", [b"", b"\n\n", jsonl({"type": "summary", "summary": "x"})])
async def test_a_file_without_messages_is_refused(api: httpx.AsyncClient, body: bytes) -> None:
    before = await session_count(api)
    response = await import_file(api, body)
    assert response.status_code == 422
    assert await session_count(api) == before


async def test_import_checks_its_query(api: httpx.AsyncClient) -> None:
    body = jsonl(user("u1", None, "hi"))
    response = await import_file(api, body, title="x" * 501)
    assert response.status_code == 422
    session = await imported(api, body)
    assert session["title"] is None
    default = (await api.post("/sessions", json={})).json()["model"]
    assert session["model"] == default  # no model in the file


async def test_a_parent_written_after_its_child(api: httpx.AsyncClient) -> None:
    body = jsonl(
        assistant("a1", "u1", "msg_1", {"type": "text", "text": "answer"}),
        user("u1", None, "question"),
    )
    session = await imported(api, body)
    full = await chain(api, session["id"])
    assert [m["metadata"]["source_uuid"] for m in full] == ["u1", "a1"]
    assert session["head_uuid"] == full[-1]["uuid"]
    # seq follows the file: the tree lists the child first.
    assert [n["preview"] for n in await tree(api, session["id"])] == ["answer", "question"]


async def test_a_parent_cycle_does_not_hang(api: httpx.AsyncClient) -> None:
    body = jsonl(
        user("u1", "a1", "question"), assistant("a1", "u1", "m", {"type": "text", "text": "x"})
    )
    session = await imported(api, body)
    nodes = await tree(api, session["id"])
    assert len(nodes) == 2
    assert sum(n["parent_uuid"] is None for n in nodes) == 1


async def test_a_boundary_naming_an_unwritten_message_covers_what_precedes_it(
    api: httpx.AsyncClient,
) -> None:
    """Seen in real files: the logicalParentUuid of a boundary is in no line."""
    boundary = {
        "type": "system",
        "subtype": "compact_boundary",
        "uuid": "b1",
        "parentUuid": None,
        "logicalParentUuid": "never-written",
        "content": "Conversation compacted",
        "compactMetadata": {"trigger": "auto", "preTokens": 170000},
    }
    body = jsonl(
        user("u1", None, "question"),
        assistant("a1", "u1", "msg_1", {"type": "text", "text": "answer"}),
        boundary,
        user("s1", "b1", "summary text", isCompactSummary=True),
        user("u2", "s1", "next"),
    )
    session = await imported(api, body)
    full = await chain(api, session["id"])
    assert [m["metadata"]["source_uuid"] for m in full] == ["u1", "a1", "b1", "s1", "u2"]
    assert full[2]["metadata"]["pre_tokens"] == 170000
    assert [m["subtype"] for m in await chain(api, session["id"], view="api")] == [
        "compact_summary",
        None,
    ]


async def test_the_import_limit_counts_streamed_bytes(
    database_url: str, conn: AsyncConnection
) -> None:
    app = create_app(make_settings(database_url, max_import_bytes=4096))
    app.state.runtime.db.sessionmaker = async_sessionmaker(
        bind=conn, expire_on_commit=False, join_transaction_mode="create_savepoint"
    )
    body = jsonl(*(user(f"u{i}", f"u{i - 1}" if i else None, "x" * 100) for i in range(100)))
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {TEST_KEY}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=headers) as c:
        before = await session_count(c)
        for content in (body, chunked(body, 1000)):  # declared length, then none
            response = await import_file(c, content)
            assert response.status_code == 413
            assert response.json()["type"] == "payload_too_large"
        assert (await import_file(c, body[:2000].rsplit(b"\n", 1)[0])).status_code == 201
        assert await session_count(c) == before + 1
    await app.state.runtime.db.engine.dispose()
