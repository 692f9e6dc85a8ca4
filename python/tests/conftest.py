"""Shared fixtures: small tuning databases made with autokernel.tune (in process, tiny budgets)."""

import os

import pytest

import autokernel


@pytest.fixture(scope="session")
def tuned_db(tmp_path_factory):
    """A database with gemm:8x64x64 and gemm:16x32x48 tuned on this machine (exact records)."""
    path = str(tmp_path_factory.mktemp("db") / "tuned.db")
    autokernel.tune(
        ["gemm:8x64x64", "gemm:16x32x48"], db=path, budget=3, strategy="random",
        isolation="none", finalists=0, progress=False,
    )
    return path


def torch_or_skip():
    """torch, or a skip with the reason (a failure in CI, where torch must be installed)."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        if os.environ.get("AUTOKERNEL_NO_TORCH"):
            pytest.skip(f"torch was not installed: {os.environ['AUTOKERNEL_NO_TORCH']}", allow_module_level=True)
        if os.environ.get("CI"):
            pytest.fail(f"torch is required in CI: {e}")
        pytest.skip(f"torch is not installed ({e}): the PyTorch tests are skipped", allow_module_level=True)
    return torch
