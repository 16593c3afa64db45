"""Running the built-in workspace tools. Their specs are the registry in `app.context.tools`."""

from app.conversation.workspace import (
    MemoryWorkspace,
    PathError,
    Workspace,
    normalize_dir,
    normalize_path,
)
from app.engine.tools.builtin import ToolError, ToolOutcome, run_builtin, truncate_middle

__all__ = [
    "MemoryWorkspace",
    "PathError",
    "ToolError",
    "ToolOutcome",
    "Workspace",
    "normalize_dir",
    "normalize_path",
    "run_builtin",
    "truncate_middle",
]
