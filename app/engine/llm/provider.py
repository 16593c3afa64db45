"""Choosing the model client a process uses."""

from __future__ import annotations

from app.config import Settings
from app.engine.llm.client import AnthropicClient, ModelClient
from app.engine.llm.offline import OfflineModel


def make_model_client(settings: Settings) -> ModelClient:
    """The client `settings.provider` names: Anthropic, or the offline stand-in."""
    if settings.provider == "anthropic":
        return AnthropicClient.from_settings(settings)
    return OfflineModel()
