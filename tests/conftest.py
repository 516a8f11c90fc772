"""Shared test setup."""

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core box oversubscribed threads stall
    tests by 10-100x; the previous setting is restored after each module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
