"""Helpers for tests that drive runs over HTTP and read their SSE streams."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from app.context.normalize import validate_api_messages


@dataclass
class Event:
    id: str
    event: str
    data: str

    @property
    def json(self) -> Any:
        return json.loads(self.data)


async def stream(
    client: httpx.AsyncClient, method: str, url: str, *, limit: int | None = None, **kwargs: Any
) -> list[Event]:
    """Read an SSE response (to its end, or `limit` events) as a list of events."""
    events: list[Event] = []
    async with aconnect_sse(client, method, url, **kwargs) as source:
        assert source.response.status_code == 200, await source.response.aread()
        async for sse in source.aiter_sse():
            if sse.event == "message" and not sse.data:
                # A keep-alive ping (an SSE comment): httpx-sse reports one that follows
                # an event with an id as an empty "message" event.
                continue
            events.append(Event(sse.id, sse.event, sse.data))
            if limit is not None and len(events) >= limit:
                break
    return events


def names(events: list[Event]) -> list[str]:
    return [e.event for e in events]


def assert_gap_free(events: list[Event], start: int = 1) -> None:
    assert [int(e.id) for e in events] == list(range(start, start + len(events)))


async def new_session(client: httpx.AsyncClient, **body: Any) -> str:
    response = await client.post("/sessions", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def post_stream(
    client: httpx.AsyncClient, sid: str, content: Any, **body: Any
) -> list[Event]:
    return await stream(
        client,
        "POST",
        f"/sessions/{sid}/messages",
        json={"content": content, "stream": True, **body},
    )


async def messages(client: httpx.AsyncClient, sid: str, view: str = "full") -> list[dict[str, Any]]:
    response = await client.get(f"/sessions/{sid}/messages", params={"view": view, "limit": 1000})
    assert response.status_code == 200, response.text
    return list(response.json()["data"])


async def assert_next_request_valid(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    body = (await client.get(f"/sessions/{sid}/context/request")).json()
    messages_ = body["messages"]
    # A request built right now may end with the assistant (no new user turn yet).
    assert validate_api_messages(messages_) == [], messages_
    return dict(body)


def all_accepted(fake: Any) -> None:
    assert fake.rejections == [], fake.rejections
