"""Planning a compaction: where to cut, what to keep verbatim, which of the user's own
words to quote, and whether it is worth doing at all.

Pure: the engine loads the view, asks for the summary and writes the rows; everything
decided about the conversation itself is decided here (and property-tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.context.blocks import is_clean_user_turn
from app.context.cut import Cut, find_cut, newest_round_cut, no_cut_reason
from app.context.estimates import view_estimate
from app.context.micro import MicroPlan, apply_micro, plan_micro
from app.context.models import model_info
from app.context.projection import CollapseSpan
from app.context.session import SessionConfig
from app.context.shrink import shrink_results
from app.context.summary_prompt import quoted_user_messages, summary_message
from app.context.tokens import chars_to_tokens, estimate_content, estimate_messages
from app.context.types import COLLAPSED, COMPACT_SUMMARY, USER, Block, Node

# Budgets after a compaction, as shares of the threshold and of the view being compacted
# (whichever is smaller, so compacting a short conversation early still shrinks it):
KEEP_SHARE = (0.10, 0.30)  # the newest messages, kept verbatim
FILES_SHARE = (0.08, 0.20)  # re-attached files
FILE_TOKENS = 5_000
# The user's newest prompts quoted verbatim in the summary message: at most this many,
# within RECENT_USER_TOKENS and PROMPTS_SHARE of what is compacted (a short
# conversation is not replaced by quotes of itself).
RECENT_USER_TOKENS = 2_000
RECENT_USER_MESSAGES = 3
PROMPTS_SHARE = 0.10
# The least a summary takes (nine section headings and a line each): what the check
# before the summary request assumes, so only compactions that cannot gain are
# refused before paying for it.
MIN_SUMMARY_TOKENS = 150


class NothingToCompact(Exception):
    """No cut point can compact anything (the message says why)."""


class NothingToGain(Exception):
    """The compaction would not make the request smaller by the minimum share."""

    def __init__(self, pre_tokens: int, post_tokens: int, min_saving: float) -> None:
        self.pre_tokens = pre_tokens
        self.post_tokens = post_tokens
        self.min_saving = min_saving
        super().__init__(
            f"Compacting would not make the context smaller: the next request is about "
            f"{pre_tokens} tokens now and would be about {post_tokens} after compacting "
            f"(at least {min_saving:.0%} less is required)"
        )


def gains(pre_tokens: int, post_tokens: int, min_saving: float) -> bool:
    """Whether `post_tokens` is smaller than `pre_tokens` by at least `min_saving` (a
    share); a compaction that would not is refused."""
    return post_tokens < pre_tokens and post_tokens <= pre_tokens * (1 - min_saving)


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    projected: list[Node]  # the view as the model last saw it
    cut: Cut
    kept_from: int  # index in the stored chain of the first message kept verbatim
    # projected[cut.index:], each node as it will be copied: the same, or (the newest
    # round when it alone exceeds the kept budget) with its tool results shrunk
    kept: list[Node]
    shrunk: frozenset[str]  # uuids of the kept nodes whose results were shrunk

    @property
    def compacted(self) -> list[Node]:
        return self.projected[: self.cut.index]


def budget(shares: tuple[float, float], threshold: int, view_tokens: int) -> int:
    return int(min(shares[0] * threshold, shares[1] * view_tokens))


def raw_budget(
    config: SessionConfig, shares: tuple[float, float], threshold: int, view_tokens: int
) -> int:
    """`budget` (in the model's tokens, like the threshold) in calibration tokens, the
    unit of the stored estimates it is compared with."""
    factor = model_info(config.model).tokens_per_char_factor
    return int(budget(shares, threshold, view_tokens) / factor)


def plan_compaction(
    config: SessionConfig,
    projected: list[Node],
    stored: Sequence[Node],
    collapses: Sequence[CollapseSpan],
    threshold: int,
    view_tokens: int | None = None,
) -> CompactionPlan:
    """Cut `projected` (the view as projected over the `stored` chain) where the kept
    newest messages fit their budget (a share of `view_tokens`, the figure of the
    request now; estimated when not given). When nothing but the newest API round could stay
    and it alone is over the budget, that round is kept with its tool results shrunk
    instead of being summarised away (a round without tool results is summarised, unless
    nothing else can be cut). Raises NothingToCompact with the reason."""
    keep = raw_budget(
        config, KEEP_SHARE, threshold, view_tokens or view_estimate(config, projected)
    )
    cut = find_cut(projected, keep)
    kept = projected[cut.index :] if cut is not None else []
    if cut is None or cut.index == len(projected):
        newest = newest_round_cut(projected)
        if newest is not None:
            originals = projected[newest.index :]
            shrunk = shrink_results(originals, keep)
            # Kept when its tool results could be cut (what the model needs next), or
            # when nothing else can be cut at all; a round of text alone is summarised.
            if cut is None or any(a is not b for a, b in zip(shrunk, originals, strict=True)):
                cut, kept = newest, shrunk
    if cut is None:
        raise NothingToCompact(no_cut_reason(projected))
    index = {node.uuid: i for i, node in enumerate(stored)}
    if cut.index >= len(projected):
        kept_from = len(stored)
    else:
        first = projected[cut.index]
        if first.subtype == COLLAPSED:  # a collapsed span stands for its first message on
            span = next(s for s in collapses if str(s.id) == first.uuid)
            kept_from = index[str(span.start_uuid)]
        else:
            kept_from = index[first.uuid]
    changed = frozenset(
        new.uuid for new, old in zip(kept, projected[cut.index :], strict=True) if new is not old
    )
    return CompactionPlan(projected, cut, kept_from, kept, changed)


def human_prompts(nodes: Sequence[Node]) -> list[str]:
    """The user's own prompts in `nodes`, oldest first: the text of each clean user
    turn, and the prompts an earlier compaction's summary quotes verbatim, so the newest
    prompts carry forward through any number of compactions."""
    prompts: list[str] = []
    for node in nodes:
        if node.subtype == COMPACT_SUMMARY:
            for block in node.content:
                if block.get("type") == "text":
                    prompts.extend(quoted_user_messages(str(block.get("text") or "")))
        elif is_clean_user_turn(node) and not node.subtype:
            text = "\n".join(b.get("text", "") for b in node.content if b.get("type") == "text")
            if text.strip():
                prompts.append(text)
    return prompts


def prompts_budget(compacted_tokens: int) -> int:
    """Tokens of verbatim prompts the summary message may quote."""
    return min(RECENT_USER_TOKENS, int(PROMPTS_SHARE * compacted_tokens))


def recent_user_messages(prompts: Sequence[str], budget_tokens: int) -> list[str]:
    """The newest of `prompts` (oldest first) to quote verbatim, oldest first: at most
    RECENT_USER_MESSAGES, within `budget_tokens`, except that the newest prompt of at
    most RECENT_USER_TOKENS is quoted whatever the budget (the user's latest words
    survive every compaction, however small)."""
    picked: list[str] = []
    remaining = budget_tokens
    for text in reversed(prompts):
        if len(picked) >= RECENT_USER_MESSAGES:
            break
        cost = chars_to_tokens(len(text))
        newest = not picked and cost <= RECENT_USER_TOKENS
        if (cost > remaining and not newest) or text in picked:
            continue
        remaining -= cost
        picked.append(text)
    return list(reversed(picked))


def quoted_prompts(stored: Sequence[Node], plan: CompactionPlan) -> tuple[list[str], list[str]]:
    """Every prompt of the compacted part of the `stored` chain (collapsed spans
    included), and the newest of them to quote verbatim in the summary message."""
    prompts = human_prompts(stored[: plan.kept_from])
    return prompts, recent_user_messages(prompts, prompts_budget(estimate_messages(plan.compacted)))


def settle_kept(
    config: SessionConfig, kept: list[Node], *, cold: bool
) -> tuple[list[Node], MicroPlan | None]:
    """The kept messages as the next request will show them. A compaction starts a new
    prompt prefix; when the session's cache is cold as well (expired, or never written:
    an imported session), micro-compaction would clear the kept part's older results on
    the next request, so the compaction does it (the plan: its watermark, an index into
    `kept`), and its figures are the next request's."""
    settings = config.compaction
    if not settings.micro or not cold:
        return kept, None
    micro = plan_micro(
        kept,
        watermark=None,
        compactable=config.compactable,
        keep_recent=settings.keep_recent_tool_results,
        batch_tokens=settings.micro_batch_tokens,
        cache_cold=True,
    )
    if micro is None:
        return kept, None
    return apply_micro(kept, micro.watermark, config.compactable), micro


def text_node(text: str, uuid: str = "") -> Node:
    """A user message of one text block, as the estimates see it."""
    content: list[Block] = [{"type": "text", "text": text}]
    return Node(
        uuid=uuid, type=USER, role=USER, content=content, token_estimate=estimate_content(content)
    )


def compacted_view(summary_text: str, files: Sequence[str], kept: Sequence[Node]) -> list[Node]:
    """The view a compaction leaves: its summary message, the re-attached files, the
    kept messages."""
    return [text_node(summary_text), *(text_node(text) for text in files), *kept]


def post_floor(
    config: SessionConfig,
    kept: Sequence[Node],
    quoted: list[str],
    files: Sequence[str],
    *,
    continue_work: bool,
) -> int:
    """The least the next request could take after a compaction keeping `kept`:
    everything but the summary as it will be, the summary at its least
    (`MIN_SUMMARY_TOKENS`)."""
    factor = model_info(config.model).tokens_per_char_factor
    frame = summary_message("", quoted, continue_work=continue_work)
    view = compacted_view(frame, files, kept)
    return view_estimate(config, view) + int(MIN_SUMMARY_TOKENS * factor)
