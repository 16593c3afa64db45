"""The pure context package: plain functions over stored messages (`types.Node`), no
I/O. What the model is sent is decided here; the services only load rows and call in.

- blocks: questions about blocks and rows (tool ids, clean user turn, visibility)
- tokens: estimates (`CHARS_PER_TOKEN`)
- normalize: `normalize_for_api`, `validate_api_messages` (invariant 4)
- cache: `add_cache_breakpoints`
- tools: the tool registry (`BUILTIN_TOOLS`) and the tools a session offers the model
- micro: micro-compaction watermark, plan and projection (invariant 3)
- collapse: collapse spans, plan and projection
- cut: compaction cut points and API rounds
- render: compacted messages as text for the summariser
- summary_prompt: the summary instruction, reading the answer, the summary message
"""
