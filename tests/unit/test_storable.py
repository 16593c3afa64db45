"""`storable`: what Postgres and UTF-8 cannot hold is replaced, everything else kept."""

from __future__ import annotations

from app.engine.llm.assembler import MessageAssembler
from app.engine.llm.events import MessageDone, TextDelta
from app.engine.llm.storable import storable, storable_text


def test_storable_text_replaces_only_what_cannot_be_stored() -> None:
    assert storable_text("plain ascii") == "plain ascii"
    assert storable_text("émoji 😀 ok") == "émoji 😀 ok"
    assert storable_text("a\x00b") == "a\ufffdb"
    assert storable_text("x\ud83dy\ude00z") == "x\ufffdy\ufffdz"
    assert storable({"k\x00": ["v\ud800", 1, None, {"n": True}]}) == {
        "k\ufffd": ["v\ufffd", 1, None, {"n": True}]
    }


def test_assembler_deltas_and_message_agree() -> None:
    assembler = MessageAssembler()
    assembler.feed({"type": "message_start", "message": {"id": "m", "model": "x"}})
    assembler.feed(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    )
    sent = []
    for piece in ("a\x00", "\ud800b"):
        out = assembler.feed(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": piece},
            }
        )
        assert isinstance(out, TextDelta)
        sent.append(out.text)
    assembler.feed({"type": "content_block_stop", "index": 0})
    [done] = assembler.feed({"type": "message_stop"})  # type: ignore[misc]
    assert isinstance(done, MessageDone)
    assert done.content[0]["text"] == "".join(sent) == "a\ufffd\ufffdb"
