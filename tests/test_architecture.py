"""The layering of `app` holds: the import-linter contracts in pyproject.toml are kept.

`make lint` runs the same check (`lint-imports`); this test makes a broken contract
fail the suite too, with import-linter's report as the failure message.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def lint_imports_executable() -> str:
    beside_python = Path(sys.executable).parent / "lint-imports"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("lint-imports")
    if found is None:
        pytest.fail("lint-imports (import-linter) is not installed")
    return found


def test_import_contracts_are_kept() -> None:
    result = subprocess.run(
        [lint_imports_executable(), "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
