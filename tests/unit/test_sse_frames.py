"""`delivery.encoded`: every event's SSE frame is byte for byte what sse-starlette's
encoder writes, whether the data is one line (written straight out) or not."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from sse_starlette import ServerSentEvent

from app.api.delivery import encoded
from app.engine.events import SHUTDOWN, StoredEvent, dumps

NAMES = st.sampled_from(["run.started", "text.delta", "message.completed", "error"])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def sse_starlette(event: StoredEvent) -> bytes:
    return ServerSentEvent(id=str(event.seq), event=event.event, data=event.data).encode()


@given(st.integers(1, 2**63 - 1), NAMES, JSON_VALUES)
def test_stored_json_is_framed_as_sse_starlette_frames_it(
    seq: int, name: str, value: object
) -> None:
    event = StoredEvent(seq, name, dumps(value))
    assert encoded(event) == sse_starlette(event)


@given(st.integers(1, 2**63 - 1), NAMES, st.text())
def test_any_data_is_framed_as_sse_starlette_frames_it(seq: int, name: str, data: str) -> None:
    event = StoredEvent(seq, name, data)  # line breaks of any kind included
    assert encoded(event) == sse_starlette(event)


def test_the_shutdown_notice_has_no_id() -> None:
    frame = encoded(SHUTDOWN).decode()
    assert frame.startswith("event: error\r\n")
    assert "id:" not in frame
    assert json.loads(frame.split("data: ", 1)[1])["status"] == 503
