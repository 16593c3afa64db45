"""Routes: the session workspace that the built-in tools act on."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from app.api.deps import AfterQuery, DbDep, SessionDep, SettingsDep
from app.conversation import files
from app.models import File
from app.schemas import FileOut, Page

router = APIRouter(prefix="/sessions/{session_id}/files", tags=["files"])


def file_out(row: File) -> FileOut:
    return FileOut(path=row.path, size=row.size, sha256=row.sha256, updated_at=row.updated_at)


@router.get("", summary="List workspace files")
async def list_files(
    session: SessionDep,
    db: DbDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    after: AfterQuery = None,
) -> Page[FileOut]:
    """The session's workspace files (path, size, SHA-256, last change), ordered by path, a
    page at a time (`after`: the `next_cursor` of the previous page)."""
    rows, cursor = await files.list_page(db, session.id, after=after, limit=limit)
    return Page[FileOut](data=[file_out(r) for r in rows], next_cursor=cursor)


@router.put(
    "/{path:path}",
    responses={
        200: {"model": FileOut},
        201: {"model": FileOut},
        409: {"description": "A concurrent write created the same file; retry"},
    },
    openapi_extra={
        "requestBody": {"content": {"application/octet-stream": {"schema": {"type": "string"}}}}
    },
    summary="Write a file",
)
async def put_file(
    path: str, request: Request, session: SessionDep, db: DbDep, settings: SettingsDep
) -> Response:
    """Create or replace a workspace file with the raw request body. Answers 201 when
    created, 200 when replaced; 422 for a path that is invalid, leaves the workspace, lies
    under a file or names a directory; 413 over the file size limit or the workspace's
    quota (bytes or files)."""
    clean = files.workspace_path(path)  # before reading a body that may be refused anyway
    row, created = await files.put(db, session.id, clean, await request.body(), settings)
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
    row = await files.get(db, session.id, path)
    return Response(
        row.content,
        media_type="application/octet-stream",
        headers={"ETag": f'"{row.sha256}"'},
    )


@router.delete("/{path:path}", status_code=204, summary="Delete a file")
async def delete_file(path: str, session: SessionDep, db: DbDep) -> Response:
    """Remove a workspace file. Answers 204; 404 when there is no such file."""
    await files.remove(db, session.id, path)
    return Response(status_code=204)
