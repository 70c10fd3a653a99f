"""Real captures of other projects, read where they lie: ``../shared/fixtures/`` beside the
checkout (kineto, torch_npu and msprof, other profilers' samples; README in each folder).
They are never copied into this repository. A clone without ``../shared`` skips the tests
that need them, saying why; CI has it (``.ci/run`` refuses to run without it)."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
"""``../shared/fixtures`` from the project's root."""


def shared_fixture(relative: str) -> Path:
    """The fixture file or folder at ``relative`` under ``../shared/fixtures``
    (``"kineto/a100_alexnet.json.gz"``, ``"ascend-cluster/msinsight_st_qwen3_4rank_pp2_dp2"``).
    Skips the calling test where the shared fixtures are absent; a fixture missing from them
    is an error, not a skip."""
    if not SHARED_FIXTURES.is_dir():
        pytest.skip(
            f"real fixtures are not here: {SHARED_FIXTURES} is absent (a clone without ../shared)"
        )
    path = SHARED_FIXTURES / relative
    if not path.exists():
        raise FileNotFoundError(f"{path}: not among the shared fixtures")
    return path
