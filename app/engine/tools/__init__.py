"""Built-in workspace tools. `db_workspace` is imported on its own: the rest is pure."""

from app.conversation.workspace import (
    MemoryWorkspace,
    PathError,
    Workspace,
    normalize_dir,
    normalize_path,
)
from app.engine.tools.builtin import (
    BUILTIN_TOOLS,
    READ_ONLY_TOOLS,
    ToolOutcome,
    ToolSpec,
    run_builtin,
    truncate_middle,
)

__all__ = [
    "BUILTIN_TOOLS",
    "READ_ONLY_TOOLS",
    "MemoryWorkspace",
    "PathError",
    "ToolOutcome",
    "ToolSpec",
    "Workspace",
    "normalize_dir",
    "normalize_path",
    "run_builtin",
    "truncate_middle",
]
