"""Command line: `python -m app [serve|migrate|openapi|create-key|revoke-key|prune-events]`.

`serve` (the default) applies migrations, then runs uvicorn on PARLEY_HOST:PARLEY_PORT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from pathlib import Path

from app import auth
from app.config import Settings
from app.db import Database, make_engine


async def _migrate(settings: Settings) -> None:
    from app.migrate import upgrade

    if settings.is_sqlite:
        path = settings.database_url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    settings = Settings()
    host = args.host or settings.host
    port = args.port or settings.port
    if not args.no_migrate:
        asyncio.run(_migrate(settings))
    uvicorn.run(
        "app.main:app",
        host=host,
        port=port,
        proxy_headers=True,
        timeout_graceful_shutdown=int(settings.shutdown_grace_seconds) + 5,
        log_level=settings.log_level.lower(),
    )


def openapi(args: argparse.Namespace) -> None:
    from app.main import create_app

    spec = create_app(Settings(model_provider="offline", database_url="sqlite://")).openapi()
    text = json.dumps(spec, indent=2, sort_keys=True) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)


async def _create_key(tenant: str, name: str | None) -> str:
    db = Database(make_engine(Settings()))
    async with db.transaction() as session:
        key = auth.create_key(session, tenant, name)
    await db.dispose()
    return key


async def _revoke_key(key_id: str) -> bool:
    db = Database(make_engine(Settings()))
    async with db.transaction() as session:
        revoked = await auth.revoke_key(session, uuid.UUID(key_id))
    await db.dispose()
    return revoked


async def _prune_events(days: float) -> str:
    from datetime import timedelta

    from app.engine.retention import prune_events

    engine = make_engine(Settings())
    try:
        pruned = await prune_events(engine, timedelta(days=days))
    finally:
        await engine.dispose()
    return f"deleted {pruned.events} events of {pruned.runs} runs finished over {days:g} days ago"


def _days(value: str) -> float:
    days = float(value)
    if not days >= 0:
        raise argparse.ArgumentTypeError("must be a number of days, 0 or more")
    return days


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m app", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    p_serve = sub.add_parser("serve", help="migrate the database, then serve HTTP")
    p_serve.add_argument("--host")
    p_serve.add_argument("--port", type=int)
    p_serve.add_argument("--no-migrate", action="store_true")
    sub.add_parser("migrate", help="apply migrations up to head")
    p_openapi = sub.add_parser("openapi", help="write the OpenAPI document")
    p_openapi.add_argument("--output", default="openapi/openapi.json")
    p_key = sub.add_parser("create-key", help="store a new hashed API key and print it once")
    p_key.add_argument("--tenant", required=True)
    p_key.add_argument("--name")
    p_revoke = sub.add_parser("revoke-key", help="revoke a stored API key by id")
    p_revoke.add_argument("key_id")
    p_prune = sub.add_parser(
        "prune-events",
        help="delete the stored events of runs that finished long ago (messages are kept)",
    )
    p_prune.add_argument("--older-than-days", type=_days, required=True, metavar="N")
    args = parser.parse_args(argv)
    command = args.command or "serve"
    if command == "serve":
        if args.command is None:
            args = p_serve.parse_args([])
        serve(args)
    elif command == "migrate":
        asyncio.run(_migrate(Settings()))
    elif command == "openapi":
        openapi(args)
    elif command == "create-key":
        print(asyncio.run(_create_key(args.tenant, args.name)))
    elif command == "revoke-key":
        revoked = asyncio.run(_revoke_key(args.key_id))
        print("revoked" if revoked else "no such active key")
    elif command == "prune-events":
        print(asyncio.run(_prune_events(args.older_than_days)))


if __name__ == "__main__":
    main()
