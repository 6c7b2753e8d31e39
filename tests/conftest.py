import os
import shutil
import sys

# Without a GPU, Triton runs only as its interpreter, which must be chosen before any kernel is decorated.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import rift_hf  # noqa: E402,F401  (registers the "rift" names)


@pytest.fixture(autouse=True)
def _deterministic():
    from rift_hf.generation import rounds

    rounds._LEARNT.clear()  # draft-length costs learnt by one test must not steer the next
    rounds._PAYOFFS.clear()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    yield
