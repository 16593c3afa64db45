"""Routes: transcript export and import in Claude Code's JSONL shape."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["transcripts"])
