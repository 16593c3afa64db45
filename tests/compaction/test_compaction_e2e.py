"""Compaction end to end against the fake model: micro-compaction in requests, automatic
compaction crossing a small threshold repeatedly, manual and reactive compaction."""

from __future__ import annotations

import itertools
from typing import Any

from app.context.summary_prompt import SUMMARY_MARKER
from app.context.types import CLEARED_TOOL_RESULT
from tests.conftest import LiveServer
from tests.fake_anthropic import FakeAnthropic, items
from tests.runs.helpers import (
    all_accepted,
    assert_next_request_valid,
    messages,
    names,
    new_session,
    post_stream,
)

SUMMARY = (
    "<analysis>scratch thoughts</analysis>\n<summary>\n1. Primary Request and Intent: read files\n"
    "2. Key Technical Concepts: none\n3. Files and Code Sections: f.txt\n"
    "4. Errors and fixes: none\n"
    "5. Problem Solving: n/a\n6. All user messages: many\n7. Pending Tasks: none\n"
    "8. Current Work: reading\n9. Optional Next Step: continue\n</summary>"
)


def last_user_text(body: dict[str, Any]) -> str:
    content = body["messages"][-1]["content"]
    return " ".join(b.get("text", "") for b in content if b.get("type") == "text")


def is_summary_request(body: dict[str, Any]) -> bool:
    return SUMMARY_MARKER in last_user_text(body)


def agent_responder(body: dict[str, Any]) -> dict[str, Any]:
    """Summaries when asked; otherwise read a file, then answer."""
    if is_summary_request(body):
        return items.message(SUMMARY)
    last = body["messages"][-1]["content"]
    if any(b.get("type") == "tool_result" for b in last):
        return items.message("I read it.")
    n = len(body["messages"])
    return items.message(items.tool_use("Read", {"file_path": f"f{n % 3}.txt"}))


async def seed_files(client: Any, sid: str, size: int = 6000) -> None:
    for i in range(3):
        line = f"line {i} " + "x" * 60 + "\n"
        body = (line * (size // len(line))).encode()
        assert (
            await client.put(f"/sessions/{sid}/files/f{i}.txt", content=body)
        ).status_code == 201


async def test_micro_compaction_clears_old_results_in_requests(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    fake.responder = agent_responder
    async with live_fake.client() as client:
        sid = await new_session(
            client,
            builtin_tools=["Read"],
            compaction={"keep_recent_tool_results": 2, "micro_batch_tokens": 1000, "auto": False},
        )
        await seed_files(client, sid)
        for i in range(6):
            body = (
                await client.post(f"/sessions/{sid}/messages", json={"content": f"turn {i}"})
            ).json()
            assert body["run"]["status"] == "completed"
        cleared = [
            [
                b.get("content") == CLEARED_TOOL_RESULT
                for m in r["messages"]
                for b in m["content"]
                if b.get("type") == "tool_result"
            ]
            for r in fake.requests
        ]
        assert not any(cleared[0])
        final = cleared[-1]
        assert final.count(False) >= 2
        assert final.count(True) >= 3
        # The newest two results are never cleared.
        assert final[-2:] == [False, False]
        # Monotone: once cleared in a request, a result stays cleared in later ones.
        for before, after in itertools.pairwise(cleared):
            assert all(a for b, a in zip(before, after, strict=False) if b)
        api_view = await messages(client, sid, view="api")
        shown = [
            b.get("content")
            for m in api_view
            for b in m["content"]
            if b.get("type") == "tool_result"
        ]
        assert CLEARED_TOOL_RESULT in shown
        full = await messages(client, sid, view="full")
        assert CLEARED_TOOL_RESULT not in [
            b.get("content") for m in full for b in m["content"] if b.get("type") == "tool_result"
        ]
    all_accepted(fake)


async def test_auto_compaction_repeatedly_keeps_the_session_working(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    fake.responder = agent_responder
    async with live_fake.client() as client:
        sid = await new_session(
            client, builtin_tools=["Read"], compaction={"threshold_tokens": 6000, "micro": False}
        )
        await seed_files(client, sid)
        compactions = 0
        for i in range(10):
            events = await post_stream(client, sid, f"please read file number {i}")
            assert names(events)[-1] == "run.completed", events[-1].data
            compactions += names(events).count("compaction.completed")
            done = [e.json for e in events if e.event == "compaction.completed"]
            for c in done:
                assert c["post_tokens"] < c["pre_tokens"]
        assert compactions >= 2
        tree = (await client.get(f"/sessions/{sid}/tree", params={"limit": 1000})).json()["data"]
        boundaries = [n for n in tree if n["subtype"] == "compact_boundary"]
        assert len(boundaries) == compactions
        api_view = await messages(client, sid, view="api")
        assert api_view[0]["subtype"] == "compact_summary"
        assert "scratch thoughts" not in api_view[0]["content"][0]["text"]
        assert "Primary Request and Intent" in api_view[0]["content"][0]["text"]
        full = await messages(client, sid, view="full")
        assert len([m for m in full if m["subtype"] == "compact_boundary"]) == compactions
        assert full[0]["content"][0]["text"] == "please read file number 0"
        context = (await client.get(f"/sessions/{sid}/context")).json()
        assert context["last_compaction"]["trigger"] == "auto"
        assert context["estimated_tokens"] < 6000 * 1.5
        await assert_next_request_valid(client, sid)
    all_accepted(fake)


async def test_manual_compaction(live_fake: LiveServer, fake: FakeAnthropic) -> None:
    fake.responder = agent_responder
    async with live_fake.client() as client:
        sid = await new_session(client, builtin_tools=["Read"])
        await seed_files(client, sid)
        nothing = await client.post(f"/sessions/{sid}/compact", json={})
        assert nothing.status_code == 422
        for i in range(8):
            await client.post(f"/sessions/{sid}/messages", json={"content": f"turn {i}"})
        response = await client.post(
            f"/sessions/{sid}/compact", json={"instructions": "focus on file names"}
        )
        assert response.status_code == 200, response.text
        result = response.json()
        assert result["run"]["kind"] == "compact"
        assert result["run"]["status"] == "completed"
        assert result["messages_compacted"] > 0
        assert result["post_tokens"] < result["pre_tokens"]
        assert result["tokens_saved"] == result["pre_tokens"] - result["post_tokens"]
        assert "Primary Request" in result["summary"]
        assert "focus on file names" in last_user_text(fake.requests[-1])
        boundary = (await client.get(f"/sessions/{sid}/messages/{result['boundary_uuid']}")).json()
        assert boundary["subtype"] == "compact_boundary"
        assert boundary["metadata"]["trigger"] == "manual"
        assert boundary["metadata"]["instructions"] == "focus on file names"
        after = await client.post(f"/sessions/{sid}/messages", json={"content": "go on"})
        assert after.json()["run"]["status"] == "completed"
        await assert_next_request_valid(client, sid)
    all_accepted(fake)


async def test_manual_compaction_conflicts_and_upstream_failure(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    async with live_fake.client() as client:
        sid = await new_session(client)
        for i in range(6):  # long enough that compacting would gain
            await client.post(f"/sessions/{sid}/messages", json={"content": f"turn {i} " * 600})
        before = await messages(client, sid)
        fake.script(items.error(400, "summary refused"))
        failed = await client.post(f"/sessions/{sid}/compact", json={})
        assert failed.status_code == 502
        assert failed.json()["type"] == "upstream_error"
        assert await messages(client, sid) == before
        fake.script(items.message("slow", delay=1.5))
        await client.post(f"/sessions/{sid}/messages", json={"content": "x", "background": True})
        busy = await client.post(f"/sessions/{sid}/compact", json={})
        assert busy.status_code == 409


async def test_reactive_compaction_after_prompt_too_long(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    fake.responder = agent_responder
    async with live_fake.client() as client:
        sid = await new_session(client, builtin_tools=["Read"], compaction={"auto": False})
        await seed_files(client, sid, size=9000)
        for i in range(4):
            await client.post(f"/sessions/{sid}/messages", json={"content": f"turn {i}"})
        fake.configure(max_context_tokens=6000)
        events = await post_stream(client, sid, "one more")
        assert names(events)[-1] == "run.completed", events[-1].data
        started = [e.json for e in events if e.event == "compaction.started"]
        assert [s["trigger"] for s in started] == ["reactive"]
        rejected = [r for r in fake.rejections if "prompt is too long" in str(r)]
        assert rejected  # the one that triggered it
        await assert_next_request_valid(client, sid)


async def test_context_report(live_fake: LiveServer, fake: FakeAnthropic) -> None:
    fake.responder = agent_responder
    async with live_fake.client() as client:
        sid = await new_session(client, builtin_tools=["Read"], system="be brief")
        await seed_files(client, sid)
        await client.post(f"/sessions/{sid}/messages", json={"content": "read"})
        report = (await client.get(f"/sessions/{sid}/context")).json()
        assert report["context_window"] == 1_000_000
        assert report["auto_compact_threshold"] == 967_000
        assert report["breakdown"]["tool_results"] > report["breakdown"]["system"] > 0
        assert report["breakdown"]["tools"] > 0
        assert 0 < report["percent_used"] < 100
        assert report["estimated_tokens"] > 0
        assert report["last_compaction"] is None


async def test_context_collapse_projects_finished_spans(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    import asyncio

    from app.engine.compaction.collapse import COLLAPSE_INSTRUCTION

    def responder(body: dict[str, Any]) -> dict[str, Any]:
        if COLLAPSE_INSTRUCTION in last_user_text(body):
            return items.message("Read a file and reported on it.")
        return agent_responder(body)

    fake.responder = responder
    async with live_fake.client() as client:
        sid = await new_session(
            client,
            builtin_tools=["Read"],
            compaction={"threshold_tokens": 40_000, "collapse_at": 0.25, "micro": False},
        )
        await seed_files(client, sid)
        for i in range(8):
            body = (
                await client.post(f"/sessions/{sid}/messages", json={"content": f"turn {i}"})
            ).json()
            assert body["run"]["status"] == "completed"
            await asyncio.sleep(0.3)  # the collapse job runs after each run
        collapse_calls = [r for r in fake.requests if COLLAPSE_INSTRUCTION in last_user_text(r)]
        assert collapse_calls
        shown = [
            r
            for r in fake.requests
            if "[Summary of earlier work: Read a file" in str(r["messages"])
        ]
        assert shown, "a collapsed span should have been sent in place of its messages"
        api_view = await messages(client, sid, view="api")
        collapsed = [m for m in api_view if m["subtype"] == "collapsed"]
        assert collapsed
        assert collapsed[0]["content"][0]["text"].startswith("[Summary of earlier work")
        full = await messages(client, sid, view="full")
        assert not [m for m in full if m["subtype"] == "collapsed"]
        assert len(full) > len(api_view)
        tree = (await client.get(f"/sessions/{sid}/tree", params={"limit": 1000})).json()["data"]
        assert not [n for n in tree if n["subtype"] == "compact_boundary"]
        await assert_next_request_valid(client, sid)
    all_accepted(fake)


async def test_micro_compaction_applies_to_the_request_that_moves_it(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    """Every request keeps at most `keep_recent` compactable results uncleared: a
    watermark moved before a request is in that request, not the next one."""
    fake.responder = agent_responder
    async with live_fake.client() as client:
        sid = await new_session(
            client,
            builtin_tools=["Read"],
            compaction={"keep_recent_tool_results": 2, "micro_batch_tokens": 1, "auto": False},
        )
        await seed_files(client, sid)
        for i in range(5):
            await client.post(f"/sessions/{sid}/messages", json={"content": f"turn {i}"})
    for request in fake.requests:
        results = [
            b for m in request["messages"] for b in m["content"] if b.get("type") == "tool_result"
        ]
        uncleared = [b for b in results if b.get("content") != CLEARED_TOOL_RESULT]
        assert len(uncleared) <= 2, (len(results), len(uncleared))
    assert len(fake.requests) == 10


async def test_auto_compaction_pauses_after_three_failures(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    """Failed auto-compactions let the turn go on while the request fits; after three in
    a row the session stops trying until a compaction succeeds."""
    summaries_allowed = {"ok": False}

    def responder(body: dict[str, Any]) -> dict[str, Any]:
        if is_summary_request(body):
            if summaries_allowed["ok"]:
                return items.message(SUMMARY)
            return items.error(400, "summary refused for this test")
        return agent_responder(body)

    fake.responder = responder
    async with live_fake.client() as client:
        sid = await new_session(
            client, builtin_tools=["Read"], compaction={"threshold_tokens": 3000, "micro": False}
        )
        await seed_files(client, sid)
        for i in range(6):
            body = (
                await client.post(f"/sessions/{sid}/messages", json={"content": f"t{i}"})
            ).json()
            assert body["run"]["status"] == "completed"  # the 1M window still fits
        attempts = [r for r in fake.requests if is_summary_request(r)]
        assert len(attempts) == 3
        summaries_allowed["ok"] = True
        manual = await client.post(f"/sessions/{sid}/compact", json={})
        assert manual.status_code == 200
        await client.post(f"/sessions/{sid}/messages", json={"content": "again"})
        await client.post(f"/sessions/{sid}/messages", json={"content": "and again"})
        attempts = [r for r in fake.requests if is_summary_request(r)]
        assert len(attempts) > 4  # the manual one, and automatic ones again
