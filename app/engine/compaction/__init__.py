"""The compaction layers around a model request, cheapest first:

1. snip (messages the client marked, left out: a projection, `context.projection`);
2. micro-compaction: the persisted watermark moves forward in batches worth a cache miss;
3. context collapse: spans summarised in the background after a run, applied once the
   estimate passes `collapse_at` of the threshold;
4. auto-compaction past the threshold: a summary replaces everything before a safe
   cut, recorded as a `compact_boundary` row, a `compact_summary` message, re-attached
   files and verbatim copies of the kept messages (nothing is deleted or re-parented);
5. manual (`POST /compact`, a run of kind `compact`) and 6. reactive (after a
   "prompt is too long" answer) use the same machinery.

Modules: `layers` (what runs before each request, reactive and manual compaction),
`compact` (one compaction, written in one step), `summary` (asking for the summary),
`collapse` (background collapse summaries), `hooks` (before/after hooks, the webhook).
The pure planning (cut points, budgets, what is re-attached) is in `app.context`.
"""
