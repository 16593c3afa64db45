"""A replica killed (SIGKILL) in the middle of sending a webhook: its claim lapses and
another replica delivers it. The receiver sees the same `webhook-id` twice (the request
that died with the process, then the one it accepts) and accepts it once."""

from __future__ import annotations

import asyncio
import signal

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import live_server
from tests.e2e.test_process import Service
from tests.webhooks.receiver import Receiver
from tests.webhooks.test_delivery import WEBHOOK_SETTINGS, until

pytestmark = pytest.mark.e2e


async def test_a_send_cut_by_sigkill_is_delivered_by_another_replica(
    database_url: str, engine: AsyncEngine
) -> None:
    receiver = Receiver(hold_first=True)
    await receiver.start()
    key = "webhook-fault-key-0123456789"  # a tenant of its own: its endpoint is its own
    env = {
        "PARLEY_API_KEYS": f"fault:{key}",
        "PARLEY_MODEL_PROVIDER": "offline",
        "PARLEY_WEBHOOK_ALLOW_NETWORKS": "127.0.0.0/8",
        "PARLEY_WEBHOOK_TIMEOUT_SECONDS": "1",
        "PARLEY_WEBHOOK_POLL_SECONDS": "0.05",
    }
    doomed = await asyncio.to_thread(Service, database_url, "http://127.0.0.1:9", **env)
    try:
        async with doomed.client() as a:
            a.headers["Authorization"] = f"Bearer {key}"
            hook = (
                await a.post(
                    "/webhooks", json={"url": receiver.url("hook"), "events": ["run.completed"]}
                )
            ).json()
            receiver.secrets["hook"] = hook["secret"]
            sid = (await a.post("/sessions", json={})).json()["id"]
            run = (await a.post(f"/sessions/{sid}/messages", json={"content": "hi"})).json()
            assert run["run"]["status"] == "completed"

            async def arrived() -> bool:
                return len(receiver.arrivals) == 1

            await until(arrived)
        doomed.stop(signal.SIGKILL)  # while the receiver holds its request
        settings = {
            **WEBHOOK_SETTINGS,
            "webhook_timeout_seconds": 1,
            "api_keys": [f"fault:{key}"],
        }
        async with (
            live_server(database_url, engine, **settings) as survivor,
            survivor.client(key) as b,
        ):

            async def delivered() -> bool:
                page = (await b.get(f"/webhooks/{hook['id']}/deliveries")).json()["data"]
                return [d["status"] for d in page] == ["delivered"]

            await until(delivered)
            [delivery] = (await b.get(f"/webhooks/{hook['id']}/deliveries")).json()["data"]
            assert delivery["attempts"] == 2
            assert (await b.delete(f"/webhooks/{hook['id']}")).status_code == 204
    finally:
        doomed.stop(signal.SIGKILL)
        await receiver.stop()
    assert receiver.arrivals == [delivery["id"], delivery["id"]]
    assert [r.msg_id for r in receiver.received] == [delivery["id"]]
    assert receiver.received[0].body["data"]["status"] == "completed"
