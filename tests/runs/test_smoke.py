from __future__ import annotations

from tests.conftest import LiveServer


async def test_offline_turn_wait_mode(live: LiveServer) -> None:
    async with live.client() as client:
        session = (await client.post("/sessions", json={"builtin_tools": ["Read", "Write"]})).json()
        response = await client.post(
            f"/sessions/{session['id']}/messages", json={"content": "hello"}
        )
        assert response.status_code == 200, response.text
        body = response.json()
        print(body)
        assert body["run"]["status"] == "completed"
        assert [m["role"] for m in body["messages"]] == ["user", "assistant"]
