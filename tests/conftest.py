import pytest
import torch


@pytest.fixture(autouse=True)
def _deterministic():
    """Every test starts from the same seed and thread count, whatever ran before."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    yield
