"""Compaction that tells the truth about tokens (issue 10), end to end against the fake
API (which counts what Parley really sends): fresh estimates after every compaction, no
compaction that grows the context, the cost of compaction counted, imported sessions
handled as themselves, prompts carried forward, the newest round kept, previews the API
accepts.

Sessions here use a model without the newer tokenizer's factor, so Parley's estimates
and the fake's counts are in the same tokens."""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from typing import Any

import httpx

from app.context.summary_prompt import SUMMARY_MARKER, quoted_user_messages
from app.engine.compaction.collapse import COLLAPSE_INSTRUCTION
from tests.conftest import LiveServer
from tests.fake_anthropic import FakeAnthropic, items, sign_thinking
from tests.fake_anthropic.tokens import count_tokens
from tests.fake_anthropic.validate import validate_messages_request
from tests.runs.helpers import all_accepted, messages, names, new_session, post_stream

MODEL = "claude-sonnet-4-5"
SUMMARY = (
    "<analysis>notes</analysis>\n<summary>\n1. Primary Request and Intent: read files\n"
    "2. Key Technical Concepts: none\n3. Files and Code Sections: f0.txt\n"
    "4. Errors and fixes: none\n5. Problem Solving: n/a\n6. All user messages: some\n"
    "7. Pending Tasks: none\n8. Current Work: reading\n9. Optional Next Step: go on\n</summary>"
)


def text_of(body: dict[str, Any]) -> str:
    return "\n".join(
        str(b.get("text", ""))
        for m in body["messages"]
        for b in (m["content"] if isinstance(m["content"], list) else [])
        if b.get("type") == "text"
    )


def is_summary(body: dict[str, Any]) -> bool:
    return SUMMARY_MARKER in text_of(body)


def reader(body: dict[str, Any]) -> dict[str, Any]:
    """Summaries when asked; a Read for a prompt that asks to read, then a short answer;
    a short answer to anything else."""
    if is_summary(body):
        return items.message(SUMMARY)
    last = body["messages"][-1]["content"]
    if any(b.get("type") == "tool_result" for b in last):
        return items.message("I read it.")
    said = " ".join(str(b.get("text", "")) for b in last if b.get("type") == "text")
    if "big one" in said:
        return items.message(items.tool_use("Read", {"file_path": "big.txt"}))
    if "read" in said:
        path = f"f{len(body['messages']) % 3}.txt"
        return items.message(items.tool_use("Read", {"file_path": path}))
    return items.message("OK.")


def real(usage: dict[str, Any]) -> int:
    return int(
        usage["input_tokens"]
        + usage["cache_read_input_tokens"]
        + usage["cache_creation_input_tokens"]
    )


async def seed_files(client: httpx.AsyncClient, sid: str, size: int = 6_000) -> None:
    for i in range(3):
        body = (f"line {i} " + "x" * 60 + "\n") * (size // 70)
        response = await client.put(f"/sessions/{sid}/files/f{i}.txt", content=body.encode())
        assert response.status_code == 201


async def context(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    return dict((await client.get(f"/sessions/{sid}/context")).json())


async def turn(client: httpx.AsyncClient, sid: str, content: str) -> dict[str, Any]:
    body = (await client.post(f"/sessions/{sid}/messages", json={"content": content})).json()
    assert body["run"]["status"] == "completed", body["run"]
    return dict(body)


async def test_the_estimate_after_compaction_is_the_new_view(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    """After a compaction GET /context, the session and the boundary agree on the new
    view's figure, which is the next request's real size (not the pre-compaction one);
    four successive compactions each report the request they replaced."""
    fake.responder = reader
    async with live_fake.client() as client:
        sid = await new_session(
            client, model=MODEL, builtin_tools=["Read"], compaction={"auto": False}
        )
        await seed_files(client, sid)
        for i in range(6):
            await turn(client, sid, f"please read file number {i}")
        outcomes = []
        for k in range(4):
            before = real(fake.usages[-1])
            response = await client.post(f"/sessions/{sid}/compact", json={})
            if response.status_code == 422:
                assert response.json()["type"] == "nothing_to_gain"
                break
            assert response.status_code == 200, response.text
            outcome = response.json()
            outcomes.append(outcome)
            # pre: the request that would have been sent (the last one, plus its reply)
            assert abs(outcome["pre_tokens"] - before) <= 0.1 * before + 50
            assert outcome["tokens_saved"] == outcome["pre_tokens"] - outcome["post_tokens"]
            assert outcome["post_tokens"] <= 0.8 * outcome["pre_tokens"]
            estimate = (await context(client, sid))["estimated_tokens"]
            assert estimate == outcome["post_tokens"]
            session = (await client.get(f"/sessions/{sid}")).json()
            assert session["context"]["estimated_tokens"] == estimate
            await turn(client, sid, f"continue {k}")
            first = next(
                r["usage"]
                for r in reversed(fake.records)
                if r["path"] == "/v1/messages"
                and r["usage"]
                and f"continue {k}" in text_of(r["body"])
                and not any(
                    b.get("type") == "tool_result" for b in r["body"]["messages"][-1]["content"]
                )
            )
            assert abs(estimate - real(first)) <= 0.1 * real(first), (estimate, real(first), k)
        assert len(outcomes) >= 2
        pres = [o["pre_tokens"] for o in outcomes]
        assert len(set(pres)) == len(pres)  # each its own, not the first one's stale figure
        exported = (await client.get(f"/sessions/{sid}/transcript")).text.splitlines()
        boundaries = [json.loads(line) for line in exported if "compact_boundary" in line]
        assert [b["compactMetadata"]["preTokens"] for b in boundaries] == pres
    all_accepted(fake)


async def test_no_needless_compaction_after_an_auto_compaction(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    """Compacted under the threshold, a short next turn does not compact again."""
    fake.responder = reader
    async with live_fake.client() as client:
        sid = await new_session(
            client,
            model=MODEL,
            builtin_tools=["Read"],
            compaction={"threshold_tokens": 9_000, "micro": False},
        )
        await seed_files(client, sid, size=9_000)
        compacted = 0
        for i in range(8):
            events = await post_stream(client, sid, f"read file {i}")
            compacted += names(events).count("compaction.completed")
            if compacted:
                break
        assert compacted == 1
        assert (await context(client, sid))["estimated_tokens"] < 9_000
        summaries = sum(1 for r in fake.requests if is_summary(r))
        events = await post_stream(client, sid, "continue")
        assert "compaction.started" not in names(events)
        assert sum(1 for r in fake.requests if is_summary(r)) == summaries
    all_accepted(fake)


async def test_a_compaction_that_would_not_gain_is_refused(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    """Two short turns: 422 nothing_to_gain with both figures, before any summary is
    asked for; nothing changes."""
    async with live_fake.client() as client:
        sid = await new_session(client, model=MODEL)
        for i in range(2):
            await turn(client, sid, f"hello {i}")
        before = await messages(client, sid)
        calls = len(fake.requests)
        response = await client.post(f"/sessions/{sid}/compact", json={})
        assert response.status_code == 422
        problem = response.json()
        assert problem["type"] == "nothing_to_gain"
        assert problem["post_tokens"] >= 0.8 * problem["pre_tokens"]
        assert problem["min_saving"] == 0.2
        assert "would not make the context smaller" in problem["detail"]
        assert len(fake.requests) == calls  # no summary paid for
        assert await messages(client, sid) == before
        background = await client.post(f"/sessions/{sid}/compact", json={"background": True})
        assert background.status_code == 422  # checked before a run is started


async def test_a_summary_too_long_to_gain_is_thrown_away_and_auto_waits(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    """The model's summary turns out too long: the compaction is refused after it (its
    cost counted), and auto-compaction does not ask again on every turn, only once the
    conversation has grown by the minimum saving."""
    long_summary = "<summary>" + "a very long summary " * 2_000 + "</summary>"

    def responder(body: dict[str, Any]) -> dict[str, Any]:
        if is_summary(body) or COLLAPSE_INSTRUCTION in text_of(body):
            return items.message(long_summary)  # (a collapse that long is not kept either)
        return items.message("noted " * 40)

    fake.responder = responder
    async with live_fake.client() as client:
        sid = await new_session(
            client, model=MODEL, compaction={"threshold_tokens": 3_000, "micro": False}
        )
        attempted: list[bool] = []
        for i in range(16):
            before = sum(1 for r in fake.requests if is_summary(r))
            await turn(client, sid, f"note {i}: " + "remember this " * 60)
            attempted.append(sum(1 for r in fake.requests if is_summary(r)) > before)
        assert sum(attempted) >= 2
        assert not any(a and b for a, b in itertools.pairwise(attempted))
        tree = (await client.get(f"/sessions/{sid}/tree", params={"limit": 1000})).json()
        assert not [n for n in tree["data"] if n["subtype"] == "compact_boundary"]
        # Every call counted on the session, the background collapse requests too.
        for _ in range(50):
            session = (await client.get(f"/sessions/{sid}")).json()
            paid = sum(u["output_tokens"] for u in fake.usages)
            if session["usage"]["output_tokens"] == paid:
                break
            await asyncio.sleep(0.1)
        assert session["usage"]["output_tokens"] == paid


async def test_the_cost_of_compaction_is_counted(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    fake.responder = reader
    async with live_fake.client() as client:
        sid = await new_session(
            client, model=MODEL, builtin_tools=["Read"], compaction={"auto": False}
        )
        await seed_files(client, sid)
        for i in range(5):
            await turn(client, sid, f"read {i}")
        before = (await client.get(f"/sessions/{sid}")).json()["usage"]
        metrics_before = (await client.get("/metrics")).text
        result = (await client.post(f"/sessions/{sid}/compact", json={})).json()
        summary_usage = fake.usages[-1]
        run = result["run"]
        assert real(run["usage"]) == real(summary_usage) > 0
        assert run["usage"]["output_tokens"] == summary_usage["output_tokens"] > 0
        after = (await client.get(f"/sessions/{sid}")).json()["usage"]
        assert after["output_tokens"] == before["output_tokens"] + summary_usage["output_tokens"]
        stored = (await client.get(f"/sessions/{sid}/runs/{run['id']}")).json()
        assert stored["usage"]["output_tokens"] == summary_usage["output_tokens"]
        assert (
            metric(await client.get("/metrics"), "output_tokens")
            - metric_text(metrics_before, "output_tokens")
            >= summary_usage["output_tokens"]
        )


def metric_text(text: str, kind: str) -> float:
    for line in text.splitlines():
        if line.startswith(f'parley_model_tokens_total{{kind="{kind}"}}'):
            return float(line.split()[-1])
    return 0.0


def metric(response: httpx.Response, kind: str) -> float:
    return metric_text(response.text, kind)


# --- imported sessions ------------------------------------------------------------------


def transcript(*, thinking_last: bool = True) -> bytes:
    """A small Claude Code transcript: a prompt, Reads of source-machine paths with big
    results, usage that includes Claude Code's own 40k-token system prompt and tools,
    and a final reply with thinking."""
    lines: list[dict[str, Any]] = []
    parent: str | None = None
    session = str(uuid.uuid4())

    def add(kind: str, message: dict[str, Any]) -> None:
        nonlocal parent
        line_uuid = str(uuid.uuid4())
        lines.append(
            {
                "type": kind,
                "uuid": line_uuid,
                "parentUuid": parent,
                "sessionId": session,
                "timestamp": "2026-01-02T03:04:05.678Z",
                "isSidechain": False,
                "message": message,
            }
        )
        parent = line_uuid

    def reply(content: list[dict[str, Any]], n: int) -> dict[str, Any]:
        return {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": content,
            "stop_reason": "tool_use" if content[-1]["type"] == "tool_use" else "end_turn",
            "usage": {"input_tokens": 3, "cache_read_input_tokens": 40_000 + 2_000 * n},
        }

    add("user", {"role": "user", "content": "Look at the project and explain main.go"})
    for n in range(6):
        use = f"toolu_{n:02d}abcdefghijklmnop"
        path = f"/Users/someone/project/src/file{n}.go"
        add(
            "assistant",
            reply(
                [{"type": "tool_use", "id": use, "name": "Read", "input": {"file_path": path}}], n
            ),
        )
        body = "\n".join(f"{k:>6}\u2192func f{n}_{k}() {{ return {k} }}" for k in range(1, 120))
        add(
            "user",
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use, "content": body}],
            },
        )
    final: list[dict[str, Any]] = [{"type": "text", "text": "main.go wires everything up."}]
    if thinking_last:
        thought = "The user wants an explanation."
        final.insert(
            0, {"type": "thinking", "thinking": thought, "signature": sign_thinking(thought)}
        )
    add("assistant", reply(final, 7))
    return ("\n".join(json.dumps(line) for line in lines) + "\n").encode()


async def import_transcript(client: httpx.AsyncClient, body: bytes) -> str:
    response = await client.post(
        "/sessions/import", content=body, headers={"Content-Type": "application/x-ndjson"}
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def test_an_imported_session_is_estimated_as_parley_sends_it(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    """Not the source's usage (it counted Claude Code's own 40k of system and tools):
    the request Parley builds, as the fake counts it, within 10%; and that body is one
    the API accepts although the transcript ends in a reply with thinking."""
    async with live_fake.client() as client:
        sid = await import_transcript(client, transcript())
        estimate = (await context(client, sid))["estimated_tokens"]
        body = (await client.get(f"/sessions/{sid}/context/request")).json()
        validate_messages_request(body)
        counted = count_tokens(body)
        assert abs(estimate - counted) <= 0.1 * counted, (estimate, counted)
        assert estimate < 40_000
        # Still accepted with thinking on: the final reply is a prefill without thinking.
        await client.patch(
            f"/sessions/{sid}",
            json={"thinking": {"type": "enabled", "budget_tokens": 2_048}, "max_tokens": 8_000},
        )
        body = (await client.get(f"/sessions/{sid}/context/request")).json()
        validate_messages_request(body)
        assert "thinking" not in body
        assert body["messages"][-1]["role"] == "assistant"
        empty = await new_session(client, model=MODEL)
        assert (await client.get(f"/sessions/{empty}/context/request")).status_code == 409


async def test_an_imported_session_compacts_as_itself(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    """Never sent by Parley, its cache is cold: the summary request is rendered to text.
    The files it read are on the source machine: re-attached from the conversation."""
    fake.responder = lambda body: items.message(SUMMARY) if is_summary(body) else None
    async with live_fake.client() as client:
        sid = await import_transcript(client, transcript())
        response = await client.post(f"/sessions/{sid}/compact", json={})
        assert response.status_code == 200, response.text
        summary_request = next(r for r in fake.requests if is_summary(r))
        assert "<transcript>" in text_of(summary_request)
        view = await messages(client, sid, view="api")
        files = [m for m in view if m["subtype"] == "file"]
        assert files
        attached = files[0]["content"][0]["text"]
        assert "Users/someone/project/src/file" in attached
        assert "as the conversation last showed it" in attached
        assert "func f" in attached
        assert "\u2192" not in attached
        await turn(client, sid, "thanks, go on")
    all_accepted(fake)


# --- prompts carried forward and the newest round --------------------------------------


async def test_prompts_carry_forward_through_compactions(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    """compact -> turn -> compact within one tool loop: the user's prompt, quoted by the
    first summary, is in the second summary request and quoted by the second summary."""
    prompt = "Please read every file, one after the other, and then report on all of them."
    state = {"reads": 0}

    def responder(body: dict[str, Any]) -> dict[str, Any]:
        if is_summary(body):
            return items.message(SUMMARY)
        state["reads"] += 1
        if state["reads"] > 14:
            return items.message("All read.")
        return items.message(items.tool_use("Read", {"file_path": f"f{state['reads'] % 3}.txt"}))

    fake.responder = responder
    async with live_fake.client() as client:
        sid = await new_session(
            client,
            model=MODEL,
            builtin_tools=["Read"],
            compaction={"threshold_tokens": 7_000, "micro": False},
        )
        await seed_files(client, sid)
        events = await post_stream(client, sid, prompt)
        assert names(events)[-1] == "run.completed", events[-1].data
        summaries = [r for r in fake.requests if is_summary(r)]
        assert len(summaries) >= 2
        for request in summaries:
            assert prompt in text_of(request)
        view = await messages(client, sid, view="api")
        summary_text = view[0]["content"][0]["text"]
        assert prompt in quoted_user_messages(summary_text)
    all_accepted(fake)


async def test_a_final_round_larger_than_the_budget_is_kept_shrunk(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    """Auto-compaction right after a Read whose result alone is over the kept budget: the
    round is kept with its result cut to head and tail (not summarised away), and the
    request goes on with the call still paired with its result."""
    fake.responder = reader
    async with live_fake.client() as client:
        sid = await new_session(
            client,
            model=MODEL,
            builtin_tools=["Read"],
            compaction={"threshold_tokens": 12_000, "micro": False},
        )
        await seed_files(client, sid, size=1_500)
        for i in range(4):
            await turn(client, sid, f"read file {i}")
        big = "".join(f"line {k}: " + "y" * 80 + "\n" for k in range(500))
        await client.put(f"/sessions/{sid}/files/big.txt", content=big.encode())
        events = await post_stream(client, sid, "now read the big one")
        assert names(events)[-1] == "run.completed", events[-1].data
        assert "compaction.completed" in names(events)
        after = [r for r in fake.requests if not is_summary(r)][-1]
        results = [
            b for m in after["messages"] for b in m["content"] if b.get("type") == "tool_result"
        ]
        assert results
        shown = str(results[-1]["content"])
        assert "characters of this tool result were left out" in shown
        assert shown.startswith("     1\tline 0:")
        assert "line 499:" in shown
        view = await messages(client, sid, view="api")
        assert any(m["metadata"] and m["metadata"].get("shrunk") for m in view)
    all_accepted(fake)


async def test_nothing_to_compact_says_the_true_reason(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    line = {
        "type": "user",
        "uuid": str(uuid.uuid4()),
        "parentUuid": None,
        "sessionId": "s",
        "timestamp": "2026-01-02T03:04:05.678Z",
        "message": {"role": "user", "content": "just one prompt"},
    }
    async with live_fake.client() as client:
        sid = await import_transcript(client, (json.dumps(line) + "\n").encode())
        response = await client.post(f"/sessions/{sid}/compact", json={})
        assert response.status_code == 422
        assert response.json()["detail"] == (
            "Nothing to compact: the conversation holds only 1 message"
        )
