"""Cursor pagination, one format for every list.

A cursor is opaque to clients: the sort key of the last item of a page (a few JSON
values), base64url-encoded. Each list decodes it with the key's own types; a cursor that
does not decode, or decodes to the wrong shape, is a 422 naming `after`.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from sqlalchemy import Select, and_, or_

from app.context.shapes import unstorable
from app.errors import Invalid

T = TypeVar("T")
MAX_CURSOR_CHARS = 1024

Key = str | int | datetime | uuid.UUID


def encode_cursor(*key: Key) -> str:
    values = [value.isoformat() if isinstance(value, datetime) else value for value in key]
    raw = json.dumps(values, default=str, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def bad_cursor(detail: str = "The cursor is not valid") -> Invalid:
    return Invalid.field(["query", "after"], "not a valid cursor", detail)


def decode_cursor(cursor: str, *types: Callable[[Any], Any]) -> tuple[Any, ...]:
    """The key values of `cursor`, each converted by its type (`str`, `int`, `uuid.UUID`,
    `as_datetime`); 422 when it is not a cursor of this list."""
    if len(cursor) > MAX_CURSOR_CHARS:
        raise bad_cursor()
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        values = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
        if not isinstance(values, list) or len(values) != len(types):
            raise ValueError("wrong shape")
        return tuple(convert(value) for convert, value in zip(types, values, strict=True))
    except (ValueError, TypeError, OverflowError, UnicodeError):
        raise bad_cursor() from None


def as_datetime(value: Any) -> datetime:
    if not isinstance(value, str):
        raise TypeError("not a timestamp")
    parsed = datetime.fromisoformat(value)
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def as_int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise ValueError("not a position")
    return value


def as_str(value: Any) -> str:
    if not isinstance(value, str) or unstorable(value):
        raise TypeError("not a storable string")
    return value


def page(
    rows: Sequence[T], limit: int, key: Callable[[T], tuple[Key, ...]]
) -> tuple[list[T], str | None]:
    """The first `limit` rows and the cursor of the next page (rows were fetched with
    `limit + 1`, so one more than a page means there is a next one)."""
    items = list(rows[:limit])
    more = len(rows) > limit
    return items, (encode_cursor(*key(items[-1])) if more and items else None)


class Dated(Protocol):
    """A row listed newest first: its creation time, then its id, break ties."""

    created_at: datetime
    id: uuid.UUID


def newest_first(query: Select[Any], model: Any, after: str | None, limit: int) -> Select[Any]:
    """`query` over `model`'s rows, newest first by (`created_at`, `id`), from after the
    cursor `after` (422 for one that is not), a row more than a page (for `page` with
    `dated_key`)."""
    created, ident = model.created_at, model.id
    if after:
        at, last = decode_cursor(after, as_datetime, uuid.UUID)
        query = query.where(or_(created < at, and_(created == at, ident < last)))
    return query.order_by(created.desc(), ident.desc()).limit(limit + 1)


def dated_key(row: Dated) -> tuple[datetime, uuid.UUID]:
    return row.created_at, row.id
