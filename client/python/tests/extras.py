"""The tests' optional packages (torch, torchdata, datasets, megatron-core, torchtitan,
transformers): where CI installs them (`client/python/extras-venv.sh`, DSPREP_REQUIRE_EXTRAS=1) a
missing one fails the tests that need it; elsewhere those tests are skipped, the reason printed."""

import importlib
import os
from types import ModuleType

import pytest

REQUIRED = os.environ.get("DSPREP_REQUIRE_EXTRAS") == "1"


def extra(name: str) -> ModuleType:
    """Import module `name`, or skip the calling test module (a test: the test) where it is
    missing and CI's extras are not required."""
    if REQUIRED:
        return importlib.import_module(name)
    package = name.split(".")[0]
    return pytest.importorskip(
        name, reason=f"{package} is not installed (`client/python/extras-venv.sh` makes a venv with it; CI runs these tests there)"
    )
