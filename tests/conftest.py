"""Session-wide test settings: one torch thread, no telemetry, one shared data cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Tiny models gain nothing from intra-op threads, and a loaded 2-core machine
# makes two threads per process very slow; engines' clients inherit this too.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data cache for the session: partitions are built once, then loaded."""
    return tmp_path_factory.mktemp("data-cache")
