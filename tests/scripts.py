"""Loading a benchmark script (tests/benchmarks/*.py, not a package) as a module, so its pure parts can be tested."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path) -> ModuleType:
    """The script at `path`, executed as a module named after its file (`<stem>_script`)."""
    spec = importlib.util.spec_from_file_location(f"{path.stem}_script", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script is being executed
    spec.loader.exec_module(module)
    return module
