"""The compaction layers around a model request (ARCHITECTURE.md, cheapest first):

1. snip (rows the client marked, left out: a projection, see services.view);
2. micro-compaction: the persisted watermark moves forward in batches worth a cache miss;
3. context collapse: spans summarised in the background after a run, applied once the
   estimate passes `collapse_at` of the threshold;
4. auto-compaction past the threshold: a summary replaces everything before a safe
   cut, recorded as a `compact_boundary` row, a `compact_summary` message, re-attached
   files and verbatim copies of the kept messages (nothing is deleted or re-parented);
5. manual (`POST /compact`, a run of kind `compact`) and 6. reactive (after a
   "prompt is too long" answer) use the same machinery.
"""

from app.engine.compaction.collapse import COLLAPSE_INSTRUCTION, collapse_spans
from app.engine.compaction.compact import (
    FILES_SHARE,
    KEEP_SHARE,
    CompactionOutcome,
    NothingToCompact,
    budget,
    compact,
    plan_compaction,
    precheck,
)
from app.engine.compaction.estimates import context_report, request_estimate, view_estimate
from app.engine.compaction.hooks import CompactionEvent, CompactionHooks, WebhookHook
from app.engine.compaction.layers import before_request, reactive, run_manual
from app.engine.compaction.summary import SUMMARY_MAX_TOKENS, CompactionFailed

__all__ = [
    "COLLAPSE_INSTRUCTION",
    "FILES_SHARE",
    "KEEP_SHARE",
    "SUMMARY_MAX_TOKENS",
    "CompactionEvent",
    "CompactionFailed",
    "CompactionHooks",
    "CompactionOutcome",
    "NothingToCompact",
    "WebhookHook",
    "before_request",
    "budget",
    "collapse_spans",
    "compact",
    "context_report",
    "plan_compaction",
    "precheck",
    "reactive",
    "request_estimate",
    "run_manual",
    "view_estimate",
]
