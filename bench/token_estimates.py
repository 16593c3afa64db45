"""How good is `app.context.tokens` against the token counts of real Claude Code sessions?

A Claude Code transcript stores, on every assistant line, the usage of the API response
it came from (the lines of one streamed response share `message.id`). The real prompt
size of response k is `input_tokens + cache_read_input_tokens +
cache_creation_input_tokens`; about 40k tokens of it (system prompt, tool definitions)
never appear in the transcript, so single prompts cannot be compared with an estimate.
Differences can: prompt(k+1) - prompt(k) is the real token count of what was added in
between, i.e. response k's own blocks (now part of the prompt) and the user lines
written after it (tool results, prompts). That is compared with
`estimate_content(those blocks)`.

The transcripts' `output_tokens` are not used: Claude Code writes the usage of the
`message_start` event on most lines (output_tokens 1..30 whatever the response's size),
so "difference minus output" cannot be computed from them; the response's blocks are
estimated instead, as the service estimates a stored assistant message.

Pairs left out: across a compact or microcompact boundary (the prompt shrinks), after a
locally made reply (`<synthetic>` model), when the model changes, and when the
difference is not positive (a request that dropped earlier thinking blocks, for one).

Reported over all pairs: real characters per token (median and spread), the
estimator's error (estimate/real: median, p10, p90, share within +-20%, and the
token-weighted total sum/sum), the same for plain chars/4, where the error sits (by
size and by tool), and the CHARS_PER_TOKEN and per-block overhead that minimise the
median absolute log error (each alone, both, and with a per-message term), with the
error they give. Nothing in app/ is changed: the figures are for whoever sets them.

    uv run python -m bench token_estimates [--data DIR] [--no-save]
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.context import tokens
from app.context.tokens import estimate_content
from app.context.types import Block
from bench.common import median, percentile, save_results, section, table, transcripts_folder

PATTERNS = (
    "entireio-cli/*/*/*/full.jsonl",
    "vscode-copilot-chat/fixtures/**/*.jsonl",
    "agentic-primer/logs/*.jsonl",
)
USAGE_KEYS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
RESET_SUBTYPES = frozenset({"compact_boundary", "microcompact_boundary"})
SYNTHETIC_MODEL = "<synthetic>"
WITHIN = 0.20  # "within +-20%"
CPT_GRID = [round(2.0 + 0.05 * i, 2) for i in range(41)]  # 2.00 .. 4.00
OVERHEAD_GRID = list(range(41))
# The three-term fit (ratio, per block, per message) on a narrower grid, to stay fast.
FINE_CPT_GRID = [round(2.6 + 0.05 * i, 2) for i in range(13)]  # 2.60 .. 3.20
FINE_OVERHEAD_GRID = list(range(0, 21, 2))
MESSAGE_GRID = list(range(0, 41, 2))
MIN_TOOL_PAIRS = 10
SIZE_BUCKETS = ((0, 200), (200, 2_000), (2_000, 10**9))


# --- reading transcripts -------------------------------------------------------------------


@dataclass
class Response:
    """One API response of a thread: its prompt size and what it and the lines after it
    (up to the next response) added to the conversation."""

    message_id: str
    model: str
    prompt_tokens: int
    blocks: list[Block] = field(default_factory=list)
    added: list[Block] = field(default_factory=list)
    broken: bool = False  # something between it and the next response changes the prompt


@dataclass(frozen=True)
class Pair:
    """Two consecutive responses: `real` tokens were added, made of `blocks`."""

    session: str
    real: int
    blocks: tuple[Block, ...]
    thinking: bool
    messages: int  # API messages added: the response, and the user message after it
    tool: str  # the tool the response called ("(none)", or "(several)")


def user_blocks(content: Any) -> list[Block]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict) and isinstance(b.get("type"), str)]
    return []


def prompt_tokens(usage: Any) -> int:
    if not isinstance(usage, dict):
        return 0
    return sum(int(usage.get(k) or 0) for k in USAGE_KEYS)


class Thread:
    """The main conversation of a file, or one subagent's (keyed by isSidechain/agentId)."""

    def __init__(self) -> None:
        self.responses: list[Response] = []
        self.by_id: dict[str, Response] = {}

    @property
    def current(self) -> Response | None:
        return self.responses[-1] if self.responses else None

    def feed(self, obj: dict[str, Any]) -> None:
        kind = obj.get("type")
        message = obj.get("message")
        if kind == "assistant" and isinstance(message, dict):
            self._assistant(message)
        elif kind == "user" and isinstance(message, dict) and self.current is not None:
            self.current.added.extend(user_blocks(message.get("content")))
        elif self.current is not None and (
            (kind == "system" and obj.get("subtype") in RESET_SUBTYPES) or kind == "attachment"
        ):
            self.current.broken = True

    def _assistant(self, message: dict[str, Any]) -> None:
        model = str(message.get("model") or "")
        if model == SYNTHETIC_MODEL:
            if self.current is not None:
                self.current.broken = True
            return
        message_id = str(message.get("id") or "")
        blocks = user_blocks(message.get("content"))
        known = self.by_id.get(message_id)
        if known is not None:
            known.blocks.extend(blocks)  # another block line of the same response
            return
        response = Response(message_id, model, prompt_tokens(message.get("usage")), blocks)
        self.responses.append(response)
        self.by_id[message_id] = response

    def pairs(self, session: str) -> Iterator[Pair | None]:
        """Each usable pair, or None for one left out."""
        for a, b in zip(self.responses, self.responses[1:], strict=False):
            real = b.prompt_tokens - a.prompt_tokens
            if a.broken or a.model != b.model or not a.prompt_tokens or real <= 0:
                yield None
                continue
            blocks = (*a.blocks, *a.added)
            thinking = any(x.get("type") == "thinking" for x in a.blocks)
            yield Pair(session, real, blocks, thinking, 2 if a.added else 1, tool_label(a.blocks))


def tool_label(blocks: Sequence[Block]) -> str:
    names = {str(b.get("name")) for b in blocks if b.get("type") == "tool_use"}
    if not names:
        return "(none)"
    return names.pop() if len(names) == 1 else "(several)"


def session_label(path: Path, data: Path) -> str:
    parts = path.relative_to(data).parts
    if parts[0] == "entireio-cli":
        return f"entireio {parts[1]}/{parts[2]}"
    return f"{parts[0]} {path.stem[:12]}"


def read_pairs(path: Path, data: Path) -> tuple[list[Pair], int]:
    """The usable pairs of one file and how many were left out."""
    threads: dict[tuple[bool, str], Thread] = {}
    with path.open(encoding="utf-8") as lines:
        for raw in lines:
            if not raw.strip():
                continue
            obj = json.loads(raw)
            if not isinstance(obj, dict):
                continue
            key = (obj.get("isSidechain") is True, str(obj.get("agentId") or ""))
            threads.setdefault(key, Thread()).feed(obj)
    label = session_label(path, data)
    kept: list[Pair] = []
    skipped = 0
    for thread in threads.values():
        for pair in thread.pairs(label):
            if pair is None:
                skipped += 1
            else:
                kept.append(pair)
    return kept, skipped


def transcript_files(data: Path) -> list[Path]:
    return sorted(p for pattern in PATTERNS for p in data.glob(pattern))


# --- estimating ---------------------------------------------------------------------------


def json_chars(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def block_chars(block: Block) -> int:
    """The characters `app.context.tokens.estimate_block` counts (0 for media)."""
    kind = block.get("type")
    if kind == "text":
        return len(block.get("text") or "")
    if kind == "tool_use":
        return len(block.get("name") or "") + json_chars(block.get("input"))
    if kind == "tool_result":
        content = block.get("content")
        if isinstance(content, str):
            return len(content)
        if isinstance(content, list):
            return sum(block_chars(b) for b in content if isinstance(b, dict))
        return 0 if content is None else len(str(content))
    if kind == "thinking":
        return len(block.get("thinking") or "")
    if kind == "redacted_thinking":
        return len(block.get("data") or "")
    if kind in ("image", "document"):
        return 0
    return json_chars(block)


def flat_blocks(blocks: Iterable[Block]) -> Iterator[Block]:
    """Blocks as the estimator sees them: a tool_result's nested blocks each count."""
    for block in blocks:
        content = block.get("content")
        if block.get("type") == "tool_result" and isinstance(content, list):
            yield {**block, "content": ""}
            yield from (b for b in content if isinstance(b, dict))
        else:
            yield block


@dataclass(frozen=True)
class Measured:
    """One pair reduced to what the estimators need."""

    real: int
    chars: int
    estimate: int  # app.context.tokens.estimate_content
    block_chars: tuple[int, ...]  # per (flattened) block; -1 for media
    thinking: bool
    session: str
    messages: int
    tool: str

    def fitted(self, chars_per_token: float, overhead: int, per_message: int = 0) -> int:
        total = per_message * self.messages
        for chars in self.block_chars:
            if chars < 0:
                total += tokens.MEDIA_TOKENS
            elif chars:
                total += math.ceil(chars / chars_per_token)
            total += overhead
        return total


def measure(pair: Pair) -> Measured:
    flat = list(flat_blocks(pair.blocks))
    per_block = tuple(
        -1 if b.get("type") in ("image", "document") else block_chars(b) for b in flat
    )
    return Measured(
        real=pair.real,
        chars=sum(block_chars(b) for b in pair.blocks),
        estimate=estimate_content(list(pair.blocks)),
        block_chars=per_block,
        thinking=pair.thinking,
        session=pair.session,
        messages=pair.messages,
        tool=pair.tool,
    )


# --- statistics ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorStats:
    n: int
    median: float
    p10: float
    p90: float
    within: float  # share of pairs with |estimate/real - 1| <= WITHIN
    weighted: float  # sum(estimate) / sum(real)
    median_abs_log: float

    def row(self, label: str) -> list[str]:
        return [
            label,
            str(self.n),
            f"{self.median:.3f}",
            f"{self.p10:.3f}",
            f"{self.p90:.3f}",
            f"{self.within:.1%}",
            f"{self.weighted:.3f}",
            f"{self.median_abs_log:.3f}",
        ]


ERROR_HEADERS = ["estimator", "pairs", "median", "p10", "p90", "within 20%", "sum/sum", "|log|"]


def error_stats(estimates: Sequence[float], reals: Sequence[int]) -> ErrorStats:
    ratios = [e / r for e, r in zip(estimates, reals, strict=True)]
    return ErrorStats(
        n=len(ratios),
        median=median(ratios),
        p10=percentile(ratios, 10),
        p90=percentile(ratios, 90),
        within=sum(abs(x - 1) <= WITHIN for x in ratios) / max(len(ratios), 1),
        weighted=sum(estimates) / max(sum(reals), 1),
        median_abs_log=median_abs_log(estimates, reals),
    )


def median_abs_log(estimates: Sequence[float], reals: Sequence[int]) -> float:
    return median([abs(math.log(max(e, 1e-9) / r)) for e, r in zip(estimates, reals, strict=True)])


def app_estimates(pairs: Sequence[Measured]) -> list[float]:
    return [float(p.estimate) for p in pairs]


def quarter_estimates(pairs: Sequence[Measured]) -> list[float]:
    return [p.chars / 4 for p in pairs]


@dataclass(frozen=True)
class Fit:
    chars_per_token: float
    overhead: int  # per block
    per_message: int
    stats: ErrorStats

    def label(self) -> str:
        text = f"CHARS_PER_TOKEN {self.chars_per_token}, +{self.overhead}/block"
        return text + (f", +{self.per_message}/message" if self.per_message else "")


def fit(
    pairs: Sequence[Measured],
    cpt_grid: Sequence[float],
    overhead_grid: Sequence[int],
    message_grid: Sequence[int] = (0,),
) -> Fit:
    """The grid point minimising the median absolute log error."""
    reals = [p.real for p in pairs]
    counts = [len(p.block_chars) for p in pairs]
    messages = [p.messages for p in pairs]
    best: tuple[float, float, int, int] | None = None
    for cpt in cpt_grid:
        base = [p.fitted(cpt, 0) for p in pairs]
        for overhead in overhead_grid:
            with_blocks = [b + overhead * c for b, c in zip(base, counts, strict=True)]
            for per_message in message_grid:
                estimates = [
                    e + per_message * m for e, m in zip(with_blocks, messages, strict=True)
                ]
                score = median_abs_log(estimates, reals)
                if best is None or score < best[0]:
                    best = (score, cpt, overhead, per_message)
    assert best is not None
    _, cpt, overhead, per_message = best
    fitted = [float(p.fitted(cpt, overhead, per_message)) for p in pairs]
    return Fit(cpt, overhead, per_message, error_stats(fitted, reals))


# --- report -------------------------------------------------------------------------------


def report_sessions(pairs: Sequence[Measured]) -> list[dict[str, Any]]:
    section("per session (consecutive-response differences)")
    by_session: dict[str, list[Measured]] = {}
    for p in pairs:
        by_session.setdefault(p.session, []).append(p)
    rows, out = [], []
    for name, group in by_session.items():
        cpt = median([p.chars / p.real for p in group])
        ratio = median([p.estimate / p.real for p in group])
        weighted = sum(p.estimate for p in group) / sum(p.real for p in group)
        real = sum(p.real for p in group)
        cells = [f"{real:,}", f"{cpt:.2f}", f"{ratio:.3f}", f"{weighted:.3f}"]
        rows.append([name, len(group), *cells])
        out.append({"session": name, "pairs": len(group), "real_tokens": real, "cpt": cpt})
    headers = ["session", "pairs", "real tokens", "chars/token", "est/real", "sum/sum"]
    print(table(headers, rows))
    return out


def report_chars_per_token(pairs: Sequence[Measured]) -> dict[str, float]:
    section("real characters per token (chars of the added blocks / real tokens)")
    cpt = [p.chars / p.real for p in pairs]
    weighted = sum(p.chars for p in pairs) / sum(p.real for p in pairs)
    figures = {
        "median": median(cpt),
        "p10": percentile(cpt, 10),
        "p25": percentile(cpt, 25),
        "p75": percentile(cpt, 75),
        "p90": percentile(cpt, 90),
        "weighted": weighted,
    }
    print(
        f"pairs {len(cpt)}: median {figures['median']:.2f}  p10 {figures['p10']:.2f}  "
        f"p25 {figures['p25']:.2f}  p75 {figures['p75']:.2f}  p90 {figures['p90']:.2f}  "
        f"(all chars / all tokens {weighted:.2f})"
    )
    return figures


def report_errors(pairs: Sequence[Measured]) -> dict[str, Any]:
    section("estimate / real, per pair")
    reals = [p.real for p in pairs]
    current = error_stats(app_estimates(pairs), reals)
    quarter = error_stats(quarter_estimates(pairs), reals)
    label = (
        f"app (CHARS_PER_TOKEN {tokens.CHARS_PER_TOKEN}, +{tokens.BLOCK_OVERHEAD_TOKENS}/block, "
        f"+{tokens.TOOL_ID_TOKENS}/tool id)"
    )
    print(table(ERROR_HEADERS, [current.row(label), quarter.row("plain chars/4")]))
    return {"app": current.__dict__, "chars4": quarter.__dict__}


def report_breakdown(pairs: Sequence[Measured]) -> None:
    section("app estimator by size of the difference and by kind")
    rows = []
    for low, high in SIZE_BUCKETS:
        group = [p for p in pairs if low <= p.real < high]
        if group:
            name = f"real {low:,}-{high:,}" if high < 10**9 else f"real >= {low:,}"
            rows.append(error_stats(app_estimates(group), [p.real for p in group]).row(name))
    for thinking in (True, False):
        group = [p for p in pairs if p.thinking is thinking]
        if group:
            name = "previous response has thinking" if thinking else "no thinking"
            rows.append(error_stats(app_estimates(group), [p.real for p in group]).row(name))
    print(table(ERROR_HEADERS, rows))
    report_by_tool(pairs)


def report_by_tool(pairs: Sequence[Measured]) -> None:
    """Where the error sits: real - estimate per pair, by the tool the response called."""
    section("app estimator by the tool called (real - estimate, tokens per pair)")
    groups: dict[str, list[Measured]] = {}
    for p in pairs:
        groups.setdefault(p.tool, []).append(p)
    rows = []
    for tool, group in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        if len(group) < MIN_TOOL_PAIRS:
            continue
        gap = [p.real - p.estimate for p in group]
        rows.append(
            [
                tool,
                len(group),
                f"{median(gap):.0f}",
                f"{percentile(gap, 25):.0f}",
                f"{percentile(gap, 75):.0f}",
                f"{median([p.estimate / p.real for p in group]):.3f}",
                f"{median([p.chars / p.real for p in group]):.2f}",
            ]
        )
    headers = ["tool", "pairs", "median gap", "p25", "p75", "est/real", "chars/token"]
    print(table(headers, rows))


def report_fits(pairs: Sequence[Measured]) -> dict[str, Any]:
    section("calibration: values minimising the median |log(estimate/real)|")
    fits = {
        "both": fit(pairs, CPT_GRID, OVERHEAD_GRID),
        "cpt_only": fit(pairs, CPT_GRID, [tokens.BLOCK_OVERHEAD_TOKENS]),
        "overhead_only": fit(pairs, [tokens.CHARS_PER_TOKEN], OVERHEAD_GRID),
        "with_message": fit(pairs, FINE_CPT_GRID, FINE_OVERHEAD_GRID, MESSAGE_GRID),
    }
    notes = {
        "both": "",
        "cpt_only": " (overhead kept)",
        "overhead_only": " (ratio kept)",
        "with_message": " (a per-message term)",
    }
    print(table(ERROR_HEADERS, [f.stats.row(f.label() + notes[k]) for k, f in fits.items()]))
    current = median_abs_log(app_estimates(pairs), [p.real for p in pairs])
    best = fits["both"]
    print(
        f"best CHARS_PER_TOKEN and per-block overhead: {best.chars_per_token} and "
        f"{best.overhead} (median |log error| {best.stats.median_abs_log:.3f} vs "
        f"{current:.3f} now)"
    )
    return {
        key: {
            "cpt": f.chars_per_token,
            "overhead": f.overhead,
            "per_message": f.per_message,
            **f.stats.__dict__,
        }
        for key, f in fits.items()
    }


def load(data: Path) -> tuple[list[Measured], int, int]:
    files = transcript_files(data)
    pairs: list[Measured] = []
    skipped = 0
    for path in files:
        kept, left_out = read_pairs(path, data)
        pairs.extend(measure(p) for p in kept)
        skipped += left_out
    return pairs, skipped, len(files)


def run(data: Path, save: bool) -> int:
    pairs, skipped, files = load(data)
    if not pairs:
        print(f"no usable pairs under {data}")
        return 1
    print(f"{files} transcript files under {data}: {len(pairs)} pairs used, {skipped} left out")
    results: dict[str, Any] = {"pairs": len(pairs), "skipped": skipped}
    results["sessions"] = report_sessions(pairs)
    results["chars_per_token"] = report_chars_per_token(pairs)
    results["errors"] = report_errors(pairs)
    report_breakdown(pairs)
    results["fits"] = report_fits(pairs)
    if save:
        print(f"\nresults: {save_results('token_estimates', results)}")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench token_estimates",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--data", type=Path, help="transcripts folder (default: PARLEY_TRANSCRIPTS)"
    )
    parser.add_argument("--quick", action="store_true", help="same as a full run (it is fast)")
    parser.add_argument("--no-save", action="store_true", help="no JSON in bench/results/")
    args = parser.parse_args(argv)
    return run(transcripts_folder(args.data), save=not args.no_save)
