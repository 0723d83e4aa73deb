"""Every chapter executes on every kind of results store (issue 22): one GPU, an unknown GPU with
only ``make gpu-measure`` output (no ncu, fast path, sampling, quality or scaling), an empty
store; and every value its prose quotes ({glue:text}`name`) is glued, so the book builds."""
import pytest

from book_stores import REPO, STORES, referenced

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("papermill")
pytest.importorskip("myst_nb")
CHAPTERS = sorted((REPO / "notebooks").glob("[0-9]*.py"))


def glued(nb) -> set[str]:
    return {out.get("metadata", {}).get("scrapbook", {}).get("name") for cell in nb.cells
            for out in cell.get("outputs", [])} - {None}


@pytest.fixture(scope="module", params=list(STORES))
def store(request, tmp_path_factory):
    return request.param, STORES[request.param](tmp_path_factory.mktemp("store") / "results")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_executes_and_glues_what_it_quotes(store, chapter, tmp_path):
    from medddpm.report.notebook import execute

    name, root = store
    out = execute(chapter, tmp_path / f"{chapter.stem}.ipynb", {"results_dir": str(root)}, cwd=REPO / "notebooks")
    missing = referenced(chapter) - glued(nbformat.read(out, as_version=4))
    assert not missing, f"{chapter.name} on the {name} store quotes unglued values: {sorted(missing)}"
