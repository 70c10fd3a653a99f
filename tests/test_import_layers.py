"""The import-layer contracts of pyproject.toml catch an upward import.

Each test copies the package and pyproject.toml to a temporary directory, adds one upward
import to the copy, and runs ``lint-imports`` there (the copy is the ``multicore_profiler``
it finds first), so the real tree is never touched. ``make test`` runs ``lint-imports`` on
the real tree itself.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONTRACTS = {
    contract["id"]: contract
    for contract in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
}
UPWARD = {
    "errors": ("multicore_profiler/errors.py", "multicore_profiler.abi"),
    "prefetch": ("multicore_profiler/prefetch.py", "multicore_profiler.errors"),
    "no_pandas": ("multicore_profiler/no_pandas.py", "multicore_profiler.errors"),
    "progress": ("multicore_profiler/progress.py", "multicore_profiler.errors"),
    "extension": ("multicore_profiler/extension.py", "multicore_profiler.errors"),
    "scratch": ("multicore_profiler/scratch.py", "multicore_profiler.errors"),
    "limits": ("multicore_profiler/limits.py", "multicore_profiler.abi"),
    "abi": ("multicore_profiler/abi.py", "multicore_profiler.kernels"),
    "kernels": ("multicore_profiler/kernels/upward.py", "multicore_profiler.storage"),
    "storage": ("multicore_profiler/storage/upward.py", "multicore_profiler.export"),
    "ingest": ("multicore_profiler/ingest/upward.py", "multicore_profiler.fuse"),
    "analysis": ("multicore_profiler/analysis/upward.py", "multicore_profiler.ingest"),
    "export": ("multicore_profiler/export/upward.py", "multicore_profiler.fuse"),
    "fuse": ("multicore_profiler/fuse/upward.py", "multicore_profiler.cli"),
}
"""For each contract: the file that gets the upward import, and the module it imports."""
IMPORT_STYLES = {
    "module level": "import {target}\n",
    "inside a function": "\n\ndef upward() -> None:\n    import {target}\n",
    "under TYPE_CHECKING": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
    "    import {target}\n",
}


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A copy of the package and of pyproject.toml, without caches."""
    shutil.copytree(
        ROOT / "multicore_profiler",
        tmp_path / "multicore_profiler",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def lint_imports(copy: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """Run lint-imports on ``copy`` with its pyproject.toml, limited to ``contracts``."""
    limits = [arg for contract in contracts for arg in ("--contract", contract)]
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", *limits, str(copy / "pyproject.toml")],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def add_upward_import(copy: Path, contract: str, style: str = "module level") -> str:
    """Add ``contract``'s upward import to the copy; return the importing module's name."""
    path, target = UPWARD[contract]
    with (copy / path).open("a") as file:
        file.write(IMPORT_STYLES[style].format(target=target))
    return path.removesuffix(".py").replace("/", ".")


def test_every_contract_has_an_upward_import_to_try() -> None:
    assert sorted(UPWARD) == sorted(CONTRACTS)


@pytest.mark.parametrize("contract", sorted(UPWARD))
def test_an_upward_import_breaks_the_contract_of_its_room(copy: Path, contract: str) -> None:
    importer = add_upward_import(copy, contract)
    result = lint_imports(copy, contract)
    assert result.returncode != 0, result.stdout
    assert f"{CONTRACTS[contract]['name']} BROKEN" in result.stdout
    assert f"{importer} -> {UPWARD[contract][1]}" in result.stdout


@pytest.mark.parametrize("style", sorted(IMPORT_STYLES))
def test_lazy_and_type_checking_imports_count(copy: Path, style: str) -> None:
    importer = add_upward_import(copy, "storage", style)
    result = lint_imports(copy, "storage")
    assert result.returncode != 0, result.stdout
    assert "storage imports only abi, errors and limits BROKEN" in result.stdout
    assert f"{importer} -> multicore_profiler.export" in result.stdout


def test_an_import_through_the_package_init_breaks_the_contract(copy: Path) -> None:
    with (copy / "multicore_profiler/kernels/upward.py").open("w") as file:
        file.write("from multicore_profiler import ProfileError\n")
    result = lint_imports(copy, "kernels")
    assert result.returncode != 0, result.stdout
    assert "multicore_profiler.kernels.upward -> multicore_profiler (l.1)" in result.stdout


def test_the_untouched_copy_keeps_every_contract(copy: Path) -> None:
    result = lint_imports(copy, *CONTRACTS)
    assert result.returncode == 0, result.stdout
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in result.stdout
