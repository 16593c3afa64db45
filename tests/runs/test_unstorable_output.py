"""Model output Postgres cannot store as is (NUL, lone surrogates) in text, thinking and
tool input: the run completes, and the live stream, the stored event log and the message
rows all hold the same replaced text."""

from __future__ import annotations

import json

from tests.conftest import LiveServer
from tests.fake_anthropic import FakeAnthropic, items
from tests.runs.helpers import (
    all_accepted,
    assert_next_request_valid,
    messages,
    names,
    new_session,
    post_stream,
    stream,
)

WEATHER = {"name": "get_weather", "input_schema": {"type": "object"}}
BAD = "a\x00b\ud800c\udfffd"
STORED = "a\ufffdb\ufffdc\ufffdd"


def deltas(events: list) -> str:
    return "".join(e.json["text"] for e in events if e.event == "text.delta")


async def test_nul_and_lone_surrogates_are_replaced_everywhere(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    fake.script(
        items.message(
            "Looking " + BAD * 3,
            items.tool_use("get_weather", {"city": BAD, BAD: [BAD]}, id="toolu_bad"),
        ),
        items.message("Done: " + BAD),
    )
    async with live_fake.client() as client:
        sid = await new_session(client, tools=[WEATHER])
        live = await post_stream(client, sid, "go")
        assert names(live)[-1] == "run.requires_action", names(live)
        run = live[-1].json
        assert run["required_action"]["tool_uses"][0]["input"] == {
            "city": STORED,
            STORED: [STORED],
        }
        rest = await stream(
            client,
            "POST",
            f"/sessions/{sid}/runs/{run['id']}/tool_results",
            json={"results": [{"tool_use_id": "toolu_bad", "content": "ok"}], "stream": True},
        )
        assert names(rest)[-1] == "run.completed", names(rest)
        logged = await stream(client, "GET", f"/sessions/{sid}/runs/{run['id']}/events")
        assert names(logged)[-1] == "run.completed"
        # The stored log replays what was sent, byte for byte.
        sent = {e.id: e.data for e in live + rest}
        assert all(sent[e.id] == e.data for e in logged if e.id in sent)
        stored = await messages(client, sid)
        first, second = stored[1], stored[3]
        assert first["content"][0]["text"] == "Looking " + STORED * 3
        assert first["content"][1]["input"] == {"city": STORED, STORED: [STORED]}
        assert second["content"][0]["text"] == "Done: " + STORED
        texts = deltas(logged)
        assert texts == deltas(live + rest) == "Looking " + STORED * 3 + "Done: " + STORED
        assert "\x00" not in json.dumps(stored)
        body = await assert_next_request_valid(client, sid)
        assert body["messages"][1]["content"][0]["text"] == "Looking " + STORED * 3
    all_accepted(fake)
