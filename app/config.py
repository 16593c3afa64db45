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

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

MIN_API_KEY_LENGTH = 16
LOOPBACK_NAMES = {"localhost", "ip6-localhost"}


class TenantLimits(BaseModel):
    """One tenant's overrides of the rate limits and its token budget (0: no limit)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: int | None = Field(default=None, ge=0)
    turns_per_minute: int | None = Field(default=None, ge=0)
    running_runs: int | None = Field(default=None, ge=0)
    token_budget: int | None = Field(default=None, ge=0)


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


def _first(value: int | None, default: int) -> int:
    return default if value is None else value


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
    run_lease_seconds: float = Field(default=10.0, ge=2)
    requires_action_ttl_seconds: float = Field(default=3600.0, gt=0)
    reaper_interval_seconds: float = Field(default=2.0, gt=0)
    # A run whose owner died is resumed by another process at most this many times.
    max_takeovers: int = Field(default=3, ge=0)
    # How long a run step is retried while the database is unreachable.
    db_retry_seconds: float = Field(default=60.0, ge=0)
    tool_result_max_chars: int = Field(default=50_000, ge=1000)
    # A built-in tool call still running after this long is stopped (an error result).
    tool_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    event_flush_seconds: float = Field(default=0.05, ge=0)
    shutdown_grace_seconds: float = Field(default=5.0, ge=0)
    # Bytes of recently used sessions' views kept in memory (0: none).
    view_cache_bytes: int = Field(default=256 * 2**20, ge=0)

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

    # Webhooks (signed run events from the outbox)
    # Networks (CIDRs) a webhook URL may resolve into although they are not public:
    # loopback, private and link-local addresses are refused otherwise.
    webhook_allow_networks: Annotated[list[str], NoDecode] = Field(default_factory=list)
    webhook_timeout_seconds: float = Field(default=10.0, gt=0, le=60)
    webhook_retry_base_seconds: float = Field(default=10.0, gt=0)
    webhook_retry_max_seconds: float = Field(default=3600.0, gt=0)
    webhook_retry_window_seconds: float = Field(default=86400.0, gt=0)
    webhook_poll_seconds: float = Field(default=1.0, gt=0)
    # Delivered and failed deliveries are deleted this long after they were created.
    webhook_keep_seconds: float = Field(default=7 * 86400.0, gt=0)
    # Server secret: derives each tenant's secret for per-turn webhook URLs and signs
    # browser tokens. Without it neither is available.
    secret_key: SecretStr | None = Field(default=None, repr=False)

    # Limits per key (requests, turns per minute) and per tenant (running runs, tokens
    # per budget period); 0 is no limit. `tenant_limits` overrides them per tenant (JSON).
    rate_requests_per_minute: int = Field(default=0, ge=0)
    rate_turns_per_minute: int = Field(default=0, ge=0)
    max_running_runs: int = Field(default=0, ge=0)
    tenant_token_budget: int = Field(default=0, ge=0)
    budget_period: Literal["hour", "day", "month"] = "day"
    tenant_limits: dict[str, TenantLimits] = Field(default_factory=dict)
    browser_token_max_seconds: int = Field(default=3600, ge=60, le=86400)

    @field_validator(
        "anthropic_api_key",
        "anthropic_base_url",
        "model_provider",
        "compaction_model",
        "compaction_webhook_url",
        "secret_key",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # Compose and shells pass unset variables as "": treat that as not given.
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("api_keys", "cors_origins", "webhook_allow_networks", mode="before")
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

    @field_validator("webhook_allow_networks")
    @classmethod
    def _check_networks(cls, value: list[str]) -> list[str]:
        for net in value:
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError:
                raise ValueError(f"PARLEY_WEBHOOK_ALLOW_NETWORKS: {net!r} is not a CIDR") from None
        return value

    @field_validator("secret_key")
    @classmethod
    def _check_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 32:
            raise ValueError("PARLEY_SECRET_KEY must be at least 32 characters")
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
        if self.webhook_retry_max_seconds < self.webhook_retry_base_seconds:
            raise ValueError(
                "PARLEY_WEBHOOK_RETRY_MAX_SECONDS must be at least "
                "PARLEY_WEBHOOK_RETRY_BASE_SECONDS"
            )
        return self

    def limits_of(self, tenant: str) -> TenantLimits:
        """The tenant's limits: its overrides, else the service-wide settings."""
        return self.merged_limits.get(tenant, self.default_limits)

    @cached_property
    def merged_limits(self) -> dict[str, TenantLimits]:
        return {tenant: self._merged(own) for tenant, own in self.tenant_limits.items()}

    @cached_property
    def default_limits(self) -> TenantLimits:
        return self._merged(TenantLimits())

    def _merged(self, own: TenantLimits) -> TenantLimits:
        return TenantLimits(
            requests_per_minute=_first(own.requests_per_minute, self.rate_requests_per_minute),
            turns_per_minute=_first(own.turns_per_minute, self.rate_turns_per_minute),
            running_runs=_first(own.running_runs, self.max_running_runs),
            token_budget=_first(own.token_budget, self.tenant_token_budget),
        )

    @cached_property
    def allowed_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return tuple(ipaddress.ip_network(net, strict=False) for net in self.webhook_allow_networks)

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
