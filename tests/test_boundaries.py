"""Layering: store ← agent ← learning ← app. agent and store never import torch/transformers/peft (fresh interpreter)."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "peft", "sentence_transformers", "accelerate")


def _modules(package: str) -> list[str]:
    pkg_dir = ROOT / package
    names = [package]
    for info in pkgutil.walk_packages([str(pkg_dir)], prefix=f"{package}."):
        names.append(info.name)
    return names


@pytest.mark.parametrize("package", ["store", "agent"])
def test_serving_layers_never_import_torch(package: str) -> None:
    """Importing every module of agent/ and store/ leaves torch, transformers and peft out of sys.modules."""
    mods = _modules(package)
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        f"bad = sorted(h for h in {HEAVY!r} if h in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"{package} pulled in heavy modules: {out.stdout.strip()}"
    assert len(mods) > 3


def _project_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & {"app", "agent", "learning", "store"}


ALLOWED = {"store": set(), "agent": {"store"}, "learning": {"agent", "store"}, "app": {"agent", "learning", "store"}}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_layering(package: str) -> None:
    """Each package imports only the layers beneath it."""
    for path in (ROOT / package).rglob("*.py"):
        illegal = _project_imports(path) - ALLOWED[package] - {package}
        assert not illegal, f"{path.relative_to(ROOT)} imports {sorted(illegal)}"


def test_environment_read_only_in_settings() -> None:
    """Only app/settings.py reads the environment (one Settings object). app/vllm_plugins/ is not the app's code: vLLM
    imports it into its own process, where the environment is how the launcher hands it the key."""
    # llamacpp_build may read LLAMA_CPP_LIB_PATH, llama-cpp-python's own variable and not a setting of ours: the folder
    # whose libraries are checked before loading must be the one that library loads from (issue 65). Nothing else.
    def reads_environment(p: Path) -> bool:
        text = p.read_text(encoding="utf-8")
        if p.relative_to(ROOT) == Path("learning/engines/llamacpp_build.py"):
            text = text.replace("os.environ.get(LIB_PATH_ENV)", "")
        return "os.environ" in text or "os.getenv" in text

    offenders = [
        str(p.relative_to(ROOT))
        for pkg in ALLOWED
        for p in (ROOT / pkg).rglob("*.py")
        if "vllm_plugins" not in p.parts and reads_environment(p)
    ]
    assert offenders in ([], ["app/settings.py"]), offenders
