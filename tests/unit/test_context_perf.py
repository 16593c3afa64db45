"""A turn over a 10,000-message view must cost little more than sending it: every
function on the request path is linear. The bounds are generous (a quadratic step on
10,000 messages takes seconds, the linear path tens of milliseconds)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

from app.context.cache import add_cache_breakpoints
from app.context.collapse import plan_collapse_spans
from app.context.cut import api_rounds, find_cut
from app.context.micro import COMPACTABLE_BUILTINS, apply_micro, plan_micro
from app.context.normalize import normalize_for_api, validate_api_messages
from app.context.tokens import estimate_messages
from app.context.types import ASSISTANT, USER, Node
from tests.unit.strategies import node, text, thinking, tool_result, tool_use


def long_session(messages: int) -> list[Node]:
    """A user prompt every 60 messages, parallel tool calls in between."""
    out: list[Node] = []
    k = 0
    while len(out) < messages:
        if len(out) % 60 == 0:
            out.append(node(f"q{k}", USER, [text(f"task {k}")]))
        uses = [f"t{k}_{j}" for j in range(1 + k % 3)]
        out.append(
            node(
                f"a{k}",
                ASSISTANT,
                [thinking("plan", f"s{k}"), text("next")]
                + [tool_use(u, "Read", file_path=f"f{u}") for u in uses],
            )
        )
        out.append(node(f"r{k}", USER, [tool_result(u, "x" * 2000) for u in uses]))
        k += 1
    return out[:messages]


def best_of(runs: int, fn: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def test_request_path_on_ten_thousand_messages_is_fast() -> None:
    h = long_session(10_000)
    plan = plan_micro(
        h,
        watermark=None,
        compactable=COMPACTABLE_BUILTINS,
        keep_recent=5,
        batch_tokens=1,
        cache_cold=False,
    )
    assert plan is not None

    def turn() -> None:
        view = apply_micro(h, plan.watermark, COMPACTABLE_BUILTINS)
        estimate_messages(view)
        messages = normalize_for_api(view)
        add_cache_breakpoints([text("system")], [{"name": "Read"}], messages)

    assert best_of(3, turn) < 0.5
    messages = normalize_for_api(h)
    assert validate_api_messages(messages) == []
    for fn in (
        lambda: plan_micro(
            h,
            watermark=None,
            compactable=COMPACTABLE_BUILTINS,
            keep_recent=5,
            batch_tokens=1,
            cache_cold=False,
        ),
        lambda: find_cut(h, 40_000),
        lambda: api_rounds(h),
        lambda: plan_collapse_spans(h),
        lambda: validate_api_messages(messages),
    ):
        assert best_of(2, fn) < 0.5


def test_normalize_scales_linearly() -> None:
    """Garbage collection is paused while timing: full collections walk the whole heap
    and would make any loop look superlinear on a big enough heap."""
    small, large = long_session(1_000), long_session(8_000)
    gc.disable()
    try:
        ratio = best_of(3, lambda: normalize_for_api(large)) / best_of(
            3, lambda: normalize_for_api(small)
        )
    finally:
        gc.enable()
    assert ratio < 24  # 8x the messages; quadratic work would be ~64x
