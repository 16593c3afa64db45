"""Routes: the session workspace that the built-in tools act on."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy import delete, select

from app.api.deps import DbDep, SessionDep
from app.conversation.files import DbWorkspace
from app.conversation.workspace import PathError, normalize_path
from app.errors import Invalid, NotFound
from app.models import File
from app.schemas import FileOut, Page

router = APIRouter(prefix="/sessions/{session_id}/files", tags=["files"])


def workspace_path(path: str) -> str:
    try:
        return normalize_path(path)
    except PathError as exc:
        raise Invalid(
            str(exc), errors=[{"loc": ["path", "path"], "msg": str(exc), "type": "value_error"}]
        ) from exc


def file_out(row: File) -> FileOut:
    return FileOut(path=row.path, size=row.size, sha256=row.sha256, updated_at=row.updated_at)


@router.get("", summary="List workspace files")
async def list_files(
    session: SessionDep,
    db: DbDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    after: str | None = None,
) -> Page[FileOut]:
    """The session's workspace files (path, size, SHA-256, last change), ordered by path, a
    page at a time (`after`: the last path seen)."""
    query = select(File).where(File.session_id == session.id)
    if after:
        query = query.where(File.path > after)
    rows = list(await db.scalars(query.order_by(File.path).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return Page[FileOut](
        data=[file_out(r) for r in rows], next_cursor=rows[-1].path if more and rows else None
    )


@router.put(
    "/{path:path}",
    responses={200: {"model": FileOut}, 201: {"model": FileOut}},
    openapi_extra={
        "requestBody": {"content": {"application/octet-stream": {"schema": {"type": "string"}}}}
    },
    summary="Write a file",
)
async def put_file(path: str, request: Request, session: SessionDep, db: DbDep) -> Response:
    """Create or replace a workspace file with the raw request body. Answers 201 when
    created, 200 when replaced; 422 for a path that is invalid or leaves the workspace,
    413 over the file size limit."""
    clean = workspace_path(path)
    data = await request.body()
    row, created = await DbWorkspace(db, session.id).put(clean, data)
    return Response(
        file_out(row).model_dump_json(),
        status_code=201 if created else 200,
        media_type="application/json",
    )


@router.get(
    "/{path:path}",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}}},
    summary="Read a file",
)
async def get_file(path: str, session: SessionDep, db: DbDep) -> Response:
    """The file's bytes (application/octet-stream), with its SHA-256 as the ETag. 404 when
    there is no such file."""
    row = await db.get(File, (session.id, workspace_path(path)))
    if row is None:
        raise NotFound(f"File {path} not found")
    return Response(
        row.content,
        media_type="application/octet-stream",
        headers={"ETag": f'"{row.sha256}"'},
    )


@router.delete("/{path:path}", status_code=204, summary="Delete a file")
async def delete_file(path: str, session: SessionDep, db: DbDep) -> Response:
    """Remove a workspace file. Answers 204; 404 when there is no such file."""
    clean = workspace_path(path)
    result = await db.execute(delete(File).where(File.session_id == session.id, File.path == clean))
    if result.rowcount == 0:  # type: ignore[attr-defined]
        raise NotFound(f"File {path} not found")
    return Response(status_code=204)
