"""One intra-op thread: on a CPU shared with other jobs, OpenMP workers spin against each other and a tiny
model's generate slows ~30x with 2 threads (measured); these tests time nothing."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
