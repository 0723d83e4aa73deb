"""The package's imports run one way: no module reaches itself through its `import` statements
(the lazy ones inside functions included), and no subpackage imports one later in the flow."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "medddpm"


def modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        name = ".".join(p.relative_to(PKG.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports anywhere in its source."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (path.name == "__init__.py")]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in known else module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {m for m in found if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_cycles():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert "medddpm.train.heldout" in graph["medddpm.train.trainer"] and "medddpm.run.engine" in graph["medddpm.sample.sampler"]
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The paper's flow, the order the subpackages may import in (``medddpm/__init__.py``); the report
# layer is last: a notebook's measure mode drives the command line.
LAYERS = ("core", "net", "diffusion", "data", "run", "train", "sample", "profiling", "cli", "report")


def layer(name: str) -> int:
    parts = name.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else len(LAYERS)


def test_subpackages_import_only_what_comes_before_them_in_the_flow():
    known = modules()
    flat = [n for n, p in known.items() if p.parent == PKG and n not in ("medddpm", "medddpm.cli", "medddpm.__main__")]
    assert flat == [], f"modules outside the subpackages: {flat}"
    upward = [(name, dep) for name, path in known.items() for dep in imports(name, path, known)
              if layer(dep) > layer(name)]
    assert upward == [], upward


def test_the_books_table_readers_import_without_torch():
    """A chapter that reads the results store's tables (``report.tables``, ``report.quality_tables``, the fast
    path's, the recipes', the anatomy's, the gate's, the waits', the headline) starts without importing PyTorch (about
    2 s of each chapter's kernel on a 2-core CPU); so do what they read of the package: the sampler names and defaults
    (``diffusion.solvers``), NIfTI and BraTS files as arrays (``data.nifti``, ``data.brats``; their tensors are
    ``data.volumes``'), the sample measures and gate, and the timing lines of `train` and `sample`."""
    import subprocess
    import sys

    code = ("import sys, medddpm.report.tables, medddpm.report.quality_tables, medddpm.report.plots, "
            "medddpm.report.fast_tables, medddpm.report.stretch, medddpm.report.recipe, medddpm.report.anatomy, "
            "medddpm.report.equivalence, medddpm.report.waiting, medddpm.report.headline, medddpm.report.workloads, "
            "medddpm.diffusion.solvers, medddpm.data.nifti, medddpm.data.brats, medddpm.sample.quality, "
            "medddpm.sample.anatomy, medddpm.sample.gate, medddpm.train.timing, medddpm.sample.timing, "
            "medddpm.profiling.waiting; print(sorted(m for m in ('torch', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_sample_package_loads_its_sampler_when_asked():
    """``from medddpm.sample import Sampler`` (the README's) is the sampler's class, loaded on first use; an unknown
    name is an AttributeError."""
    import pytest

    import medddpm.sample
    from medddpm.sample import Sampler
    from medddpm.sample.sampler import Sampler as defined

    assert Sampler is defined and set(medddpm.sample.SAMPLER_NAMES) <= set(vars(medddpm.sample.sampler))
    with pytest.raises(AttributeError):
        medddpm.sample.Nothing
