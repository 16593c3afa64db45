"""The model adapter layer: `client` (the `ModelClient` seam and the Anthropic streaming
client), `offline*` (the deterministic stand-in), `provider` (which one a process uses),
`events` (a streamed response as plain values), `assembler` (raw SSE events to those),
`errors` (classifying failures), `retry` and `retrying` (the retry policy, and one
response streamed with retries). The agent loop and compaction talk only to
`ModelClient`; the model table is `app.context.models`."""
