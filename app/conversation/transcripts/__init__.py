"""Transcripts in Claude Code's session JSONL shape: export and import.

Export (`export`) writes a session's full chain (root to head, across compact
boundaries), one line per message, oldest first.

Import reads such a file into a new session, in three steps: `reader` reduces each line
to what will be stored, `tree` builds the message tree from the kept lines, `importer`
inserts it. The rules:
- kept: `user` and `assistant` lines, `system` lines of subtype `compact_boundary`, and
  `attachment` lines that carry a `message` (Parley's own export). Everything else
  (summaries, file-history snapshots, progress, hooks, other system lines) and every
  `isSidechain` line (subagent transcripts) is skipped; a kept line whose parent was
  skipped hangs under that line's nearest kept ancestor, so the tree stays connected.
- Claude Code writes one line per content block of a streamed response, chained by
  parentUuid and sharing `message.id`: those lines become one message. Its tool results
  are written one line each, under the line of their own tool_use (so siblings), or
  even between two block lines of the response (A1, R1, A2, R2): they are chained one
  under the other after the merged message, in file order, so that no result falls off
  the chain (see `tree._TreeBuilder`).
- Every node gets a fresh uuid, the source one kept as `metadata.source_uuid`, so a
  file can be imported twice; `seq` follows file order; the head is where the file's
  last kept line sits.
"""

from app.conversation.transcripts.export import export_rows, render
from app.conversation.transcripts.importer import import_session

__all__ = ["export_rows", "import_session", "render"]
