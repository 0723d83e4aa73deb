"""Every chapter executes on every kind of results store (issue 22): one GPU, an unknown GPU with
only ``make gpu-measure`` output (no ncu, fast path, sampling, quality or scaling), an empty
store; and every value its prose quotes ({glue:text}`name`) is glued, so the book builds.

The chapters of one store run one after another in one kernel, its namespace cleared before each
(``%reset -f``): a chapter still has to import and define all it uses, and the store's chapters
pay for the kernel's start and the package's imports once. Figures are drawn but not rendered
(``%matplotlib agg``): nbmake and the book, which render every figure, run each chapter in a kernel
of its own."""
import pytest

from book_stores import REPO, STORES, referenced

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("papermill")
pytest.importorskip("myst_nb")
CHAPTERS = sorted((REPO / "notebooks").glob("[0-9]*.py"))
# a chapter that never reads its `results_dir` past the parameter cell draws the same page on every store: nbmake and
# the book execute it on the committed one
READERS = [c for c in CHAPTERS if c.read_text().count("results_dir") > 1]


def glued(nb) -> set[str]:
    return {out.get("metadata", {}).get("scrapbook", {}).get("name") for cell in nb.cells
            for out in cell.get("outputs", [])} - {None}


@pytest.fixture(scope="module", params=list(STORES))
def store(request, tmp_path_factory):
    """(name, root, kernel manager): a store and one kernel that runs its chapters."""
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(REPO / "notebooks"))
    try:
        yield request.param, STORES[request.param](tmp_path_factory.mktemp("store") / "results"), km
    finally:
        km.shutdown_kernel(now=True)


def run_chapter(chapter, parameters: dict, km, tmp_path):
    """The chapter as papermill would run it (its parameters injected), in the store's kernel
    with a cleared namespace."""
    import jupytext
    from nbclient import NotebookClient
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    source = tmp_path / f"{chapter.stem}.ipynb"
    nbformat.write(jupytext.read(chapter), source)
    nb = parameterize_notebook(load_notebook_node(str(source)), parameters)
    nb.cells.insert(0, nbformat.v4.new_code_cell("%reset -f\n%matplotlib agg\nimport matplotlib.pyplot as _plt\n_plt.close('all')\ndel _plt"))
    return NotebookClient(nb, km=km, timeout=600, kernel_name="python3").execute()


@pytest.mark.parametrize("chapter", READERS, ids=lambda p: p.stem)
def test_chapter_executes_and_glues_what_it_quotes(store, chapter, tmp_path):
    name, root, km = store
    out = run_chapter(chapter, {"results_dir": str(root)}, km, tmp_path)
    missing = referenced(chapter) - glued(out)
    assert not missing, f"{chapter.name} on the {name} store quotes unglued values: {sorted(missing)}"


def test_only_a_chapter_that_draws_nothing_from_the_store_is_left_to_the_committed_one():
    assert [c.stem for c in CHAPTERS if c not in READERS] == ["02_model"]
