"""One typed Settings class, read from the environment (and `.env`), checked at start.

Every setting is listed with its default in `.env.example`. Unsafe or contradictory
values are refused here, before the service accepts a request.
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

MIN_API_KEY_LENGTH = 16
LOOPBACK_NAMES = {"localhost", "ip6-localhost"}


@dataclass(frozen=True)
class ConfiguredKey:
    tenant: str
    key_sha256: bytes


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def normalize_database_url(url: str) -> str:
    """Accept the usual spellings and pin the async drivers this service ships with."""
    for prefix in ("postgres://", "postgresql://", "postgresql+psycopg://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url[len(prefix) :]
    if url.startswith("sqlite://") and not url.startswith("sqlite+aiosqlite://"):
        return "sqlite+aiosqlite://" + url[len("sqlite://") :]
    return url


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="PARLEY_",
        env_file=".env",
        extra="ignore",
        frozen=True,
        populate_by_name=True,
    )

    database_url: str = Field(
        default="sqlite+aiosqlite:///./parley.db",
        validation_alias=AliasChoices("DATABASE_URL", "PARLEY_DATABASE_URL"),
    )
    db_pool_size: int = Field(default=20, ge=1, le=200)
    db_echo: bool = False

    # HTTP
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list, repr=False)
    allow_open: bool = False
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    max_import_bytes: int = Field(default=512 * 1024 * 1024, ge=1024)
    max_file_bytes: int = Field(default=10 * 1024 * 1024, ge=1)
    sse_ping_seconds: float = Field(default=15.0, gt=0, le=15.0)
    # A stream whose client stops reading is closed after a send waits this long.
    sse_send_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    # A session's workspace: at most this many bytes in all, and this many files.
    workspace_max_bytes: int = Field(default=100 * 1024 * 1024, ge=1)
    workspace_max_files: int = Field(default=10_000, ge=1)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    # Model
    anthropic_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("ANTHROPIC_API_KEY", "PARLEY_ANTHROPIC_API_KEY")
    )
    anthropic_base_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("ANTHROPIC_BASE_URL", "PARLEY_ANTHROPIC_BASE_URL"),
    )
    model: str = "claude-sonnet-5-5"
    model_provider: Literal["anthropic", "offline"] | None = None
    model_timeout_seconds: float = Field(default=600.0, gt=0)
    max_retries: int = Field(default=4, ge=0, le=10)
    retry_base_seconds: float = Field(default=0.5, ge=0)
    retry_max_seconds: float = Field(default=30.0, ge=0)

    # Runs
    max_model_calls_per_run: int = Field(default=50, ge=1)
    max_continuations: int = Field(default=3, ge=0, le=20)
    run_lease_seconds: float = Field(default=30.0, ge=2)
    requires_action_ttl_seconds: float = Field(default=3600.0, gt=0)
    reaper_interval_seconds: float = Field(default=5.0, gt=0)
    tool_result_max_chars: int = Field(default=50_000, ge=1000)
    # A built-in tool call still running after this long is stopped (an error result).
    tool_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    event_flush_seconds: float = Field(default=0.05, ge=0)
    shutdown_grace_seconds: float = Field(default=10.0, ge=0)
    # Messages of recently used sessions' views kept in memory (0: none).
    view_cache_messages: int = Field(default=100_000, ge=0)

    # Compaction defaults (a session's `compaction` object overrides them)
    compaction_auto: bool = True
    compaction_micro: bool = True
    keep_recent_tool_results: int = Field(default=5, ge=0)
    micro_batch_tokens: int = Field(default=20_000, ge=0)
    collapse_at: float = Field(default=0.9, gt=0, le=1)
    cache_ttl_seconds: float = Field(default=300.0, gt=0)
    # A compaction must make the next request at least this share smaller, or it is
    # refused (manual: 422 nothing_to_gain; automatic: skipped until the view grows).
    compaction_min_saving: float = Field(default=0.2, ge=0, lt=1)
    compaction_model: str | None = None
    compaction_webhook_url: str | None = None

    @field_validator(
        "anthropic_api_key",
        "anthropic_base_url",
        "model_provider",
        "compaction_model",
        "compaction_webhook_url",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # Compose and shells pass unset variables as "": treat that as not given.
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("api_keys", "cors_origins", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str) -> str:
        url = normalize_database_url(value)
        if not url.startswith(("postgresql+asyncpg://", "sqlite+aiosqlite://")):
            raise ValueError("DATABASE_URL must be a PostgreSQL (asyncpg) or SQLite URL")
        return url

    @field_validator("cors_origins")
    @classmethod
    def _check_cors(cls, value: list[str]) -> list[str]:
        for origin in value:
            if origin != "*" and not origin.startswith(("http://", "https://")):
                raise ValueError(f"CORS origin {origin!r} must start with http:// or https://")
        return value

    @field_validator("api_keys")
    @classmethod
    def _check_api_keys(cls, value: list[str]) -> list[str]:
        seen: set[str] = set()
        for pair in value:
            tenant, sep, key = pair.partition(":")
            if not sep or not tenant.strip() or not key:
                raise ValueError("PARLEY_API_KEYS takes comma-separated tenant:key pairs")
            if len(key) < MIN_API_KEY_LENGTH:
                raise ValueError(
                    f"API key for tenant {tenant!r} is shorter than {MIN_API_KEY_LENGTH} characters"
                )
            if key in seen:
                raise ValueError("the same API key is configured twice")
            seen.add(key)
        return value

    @model_validator(mode="after")
    def _check_coherence(self) -> Settings:
        if self.model_provider == "anthropic" and self.anthropic_api_key is None:
            raise ValueError("PARLEY_MODEL_PROVIDER=anthropic needs ANTHROPIC_API_KEY")
        if "*" in self.cors_origins and len(self.cors_origins) > 1:
            raise ValueError("CORS origin '*' cannot be combined with other origins")
        if self.workspace_max_bytes < self.max_file_bytes:
            raise ValueError("PARLEY_WORKSPACE_MAX_BYTES must be at least PARLEY_MAX_FILE_BYTES")
        if self.retry_max_seconds < self.retry_base_seconds:
            raise ValueError("PARLEY_RETRY_MAX_SECONDS must be at least PARLEY_RETRY_BASE_SECONDS")
        return self

    @property
    def provider(self) -> Literal["anthropic", "offline"]:
        if self.model_provider is not None:
            return self.model_provider
        return "anthropic" if self.anthropic_api_key is not None else "offline"

    @cached_property
    def configured_keys(self) -> tuple[ConfiguredKey, ...]:
        keys = []
        for pair in self.api_keys:
            tenant, _, key = pair.partition(":")
            keys.append(ConfiguredKey(tenant.strip(), hashlib.sha256(key.encode()).digest()))
        return tuple(keys)

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    def check_bind(self, host: str) -> None:
        """Refuse to serve without keys on a non-loopback address unless told to."""
        if not self.api_keys and not self.allow_open and not is_loopback(host):
            raise RuntimeError(
                f"refusing to run without API keys on {host}: set PARLEY_API_KEYS, "
                "or PARLEY_ALLOW_OPEN=true to run open on purpose"
            )
