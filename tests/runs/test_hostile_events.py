"""Replaying a run's events from a hostile position: ids that are not event ids, or
lie past a finished run's end, are a 422 naming the header or parameter."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import LiveServer

BAD_IDS = [b"\xb2", b"9" * 5000, b"9223372036854775808", b"-1", b"1e3", b"\x00"]


async def test_event_positions_are_range_checked(live: LiveServer) -> None:
    async with live.client() as client:
        session = (await client.post("/sessions", json={})).json()
        turn = await client.post(f"/sessions/{session['id']}/messages", json={"content": "hi"})
        assert turn.status_code == 200, turn.text
        events = f"/sessions/{session['id']}/runs/{turn.json()['run']['id']}/events"

        full = await client.get(events)
        assert full.status_code == 200
        assert "id: 1" in full.text

        for raw in BAD_IDS:
            if raw == b"\x00":
                continue  # no HTTP/1.1 server accepts a NUL in a header
            response = await client.get(events, headers={"Last-Event-ID": raw})
            assert response.status_code == 422, (raw[:20], response.text)
            assert response.json()["errors"][0]["loc"] == ["header", "Last-Event-ID"]

        for after in ("9223372036854775808", "9" * 5000, "-1", "\u00b2"):
            response = await client.get(events, params={"after": after})
            assert response.status_code == 422, response.text
            assert response.json()["errors"][0]["loc"] == ["query", "after"]

        for position in ("9223372036854775807", "1000000"):
            past = await client.get(events, headers={"Last-Event-ID": position})
            assert past.status_code == 422, past.text  # the run has ended before it
            assert past.json()["errors"][0]["loc"] == ["header", "Last-Event-ID"]


@pytest.mark.parametrize("key", ["a\u00b2", "k" * 256])
async def test_idempotency_key_is_checked(live: LiveServer, key: str) -> None:
    async with live.client() as client:
        session = (await client.post("/sessions", json={})).json()
        response = await client.post(
            f"/sessions/{session['id']}/messages",
            json={"content": "hi"},
            headers={"Idempotency-Key": key.encode("latin-1")},
        )
        assert response.status_code in (200, 422), response.text


async def test_racing_requests_with_one_idempotency_key_never_fail(live: LiveServer) -> None:
    async with live.client() as client:
        session = (await client.post("/sessions", json={})).json()
        url = f"/sessions/{session['id']}/messages"
        body = {"content": "hi", "background": True}
        headers = {"Idempotency-Key": "race-1"}
        answers = await asyncio.gather(
            *(client.post(url, json=body, headers=headers) for _ in range(6))
        )
    statuses = [answer.status_code for answer in answers]
    assert set(statuses) <= {202, 409}, [a.text for a in answers]
    assert 202 in statuses
    runs = {a.json()["id"] for a in answers if a.status_code == 202}
    assert len(runs) == 1  # every accepted one is the same run
