"""Shared test setup: the repository root and the committed tiny checkpoints (`from conftest import ROOT`), and
one torch thread per test module."""

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TINY_ARITH = ROOT / "checkpoints" / "tiny-arith"  # the tiny default job's checkpoint
TINY_ARITH_MIXED = ROOT / "checkpoints" / "tiny-arith-mixed"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core box oversubscribed threads stall
    tests by 10-100x; the previous setting is restored after each module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
