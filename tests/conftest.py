"""Shared test setup: the repository root and the committed tiny checkpoints (`from conftest import ROOT`), and
one torch thread per test module, and no module leaving Ray running."""

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


@pytest.fixture(scope="module", autouse=True)
def no_ray_left_running(request):
    """A module that leaves Ray initialized (a fixture without its shutdown, a `ray.kill` or `ray.get` on a fake,
    which starts a local Ray of its own) fails here, instead of a later test's "nothing started" check."""
    import sys

    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
        pytest.fail(f"{request.module.__name__} left Ray initialized", pytrace=False)
