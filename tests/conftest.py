from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "graphs"


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
