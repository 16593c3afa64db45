"""Webhook URLs that must not be called (SSRF) are refused at registration: 422, nothing
stored. (The check at send time: test_sender.py.)"""

from __future__ import annotations

import httpx
import pytest

from tests.runs.helpers import new_session

REFUSED = [
    "http://127.0.0.1:9/hook",
    "http://localhost/hook",
    "http://[::1]/hook",
    "http://10.1.2.3/hook",
    "http://192.168.0.10/hook",
    "http://172.16.5.5/hook",
    "http://169.254.169.254/latest/meta-data",  # cloud metadata (link-local)
    "http://[fe80::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://0.0.0.0/hook",
    "ftp://93.184.216.34/hook",
    "http://user:pw@93.184.216.34/hook",
    "http://no-such-host.invalid/hook",
]


@pytest.mark.parametrize("url", REFUSED)
async def test_registration_refuses_internal_addresses(api: httpx.AsyncClient, url: str) -> None:
    answer = await api.post("/webhooks", json={"url": url, "events": ["run.completed"]})
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"][0]["loc"] == ["body", "url"]
    assert url not in [h["url"] for h in (await api.get("/webhooks")).json()["data"]]


async def test_public_address_registers_and_bad_events_are_refused(api: httpx.AsyncClient) -> None:
    ok = await api.post(
        "/webhooks", json={"url": "https://93.184.216.34/hook", "events": ["run.failed"]}
    )
    assert ok.status_code == 201, ok.text
    bad = await api.post(
        "/webhooks", json={"url": "https://93.184.216.34/hook", "events": ["run.started"]}
    )
    assert bad.status_code == 422
    assert (
        await api.post("/webhooks", json={"url": "https://93.184.216.34/", "events": []})
    ).status_code == 422
    # Another tenant sees none of it.
    other = await api.delete(
        f"/webhooks/{ok.json()['id']}", headers={"Authorization": "Bearer tenant-b-key-0123456789"}
    )
    assert other.status_code == 404


async def test_turn_webhook_url_is_checked(api: httpx.AsyncClient) -> None:
    sid = await new_session(api)
    answer = await api.post(
        f"/sessions/{sid}/messages",
        json={"content": "hi", "webhook_url": "http://127.0.0.1:9/x", "background": True},
    )
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["loc"] == ["body", "webhook_url"]
    runs = (await api.get(f"/sessions/{sid}/runs")).json()["data"]
    assert runs == []
