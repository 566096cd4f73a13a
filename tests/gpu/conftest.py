"""The GPU checks: run on a CUDA device, skipped without one (tests/gpu/gpu_runs.py says how
the device is chosen), with their data made from this repository's text (repo_data.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_runs import DEVICE, NO_DEVICE


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.gpu)
            if DEVICE is None:
                item.add_marker(pytest.mark.skip(reason=NO_DEVICE))


@pytest.fixture(scope="session", autouse=True)
def commands_use_the_session_cluster():
    """No Dask cluster: training and eval use none, and the GPU image has no Dask (the wheel set
    carries only what training and eval import)."""
    yield


@pytest.fixture(scope="session")
def gpu_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from repo_data import build

    return build(tmp_path_factory.mktemp("gpu-data"))
