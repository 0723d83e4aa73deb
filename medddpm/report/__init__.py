"""Everything the notebooks need: the paper's numbers, tables built from the results store, plots,
and the papermill/jupytext glue that turns notebooks/*.py into the book's executed chapters."""
