"""The house keeps its shape: fuzz/ is four packages whose imports run one way (certify → repro → oracles →
engine), synth knows nothing of targets or fuzz, and no module in fuzz/ grows past 600 lines."""

import ast
from pathlib import Path

import pytest

from conftest import ROOT

FLOORS = ("engine", "oracles", "repro", "certify")  # each may import the ones before it, never one after


def fuzz_imports(path: Path) -> set[str]:
    """The fuzz modules a file imports (absolute imports, at any depth: a lazy import is an arrow too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "fuzz":
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "fuzz")
    return out


def floor_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FLOORS else None


@pytest.mark.parametrize("package", FLOORS)
def test_imports_run_one_way(package):
    above = set(FLOORS[FLOORS.index(package) + 1:]) | {"cli"}
    wrong = sorted(f"{p.relative_to(ROOT)} imports {m}" for p in (ROOT / "fuzz" / package).glob("*.py")
                   for m in fuzz_imports(p) if floor_of(m) in above or m == "fuzz.cli")
    if package == "certify":  # the top floor: family-certify's CLI shares the fuzz CLI's build options
        wrong = [w for w in wrong if not w.startswith("fuzz/certify/commands.py imports fuzz.cli")]
    assert wrong == []


def test_synth_imports_neither_fuzz_nor_targets():
    wrong = []
    for p in (ROOT / "synth").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            wrong += [f"{p.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in ("fuzz", "targets")]
    assert wrong == []


def test_no_module_in_fuzz_is_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "fuzz").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}


def test_the_flat_layout_is_gone():
    """Every module sits in its package; fuzz/ itself holds only the package marker and the fuzz CLI."""
    assert sorted(p.name for p in (ROOT / "fuzz").glob("*.py")) == ["__init__.py", "cli.py"]
