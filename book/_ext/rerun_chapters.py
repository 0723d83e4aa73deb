"""Sphinx extension of the book: every chapter is read (so executed) again on every build.

Sphinx re-reads only sources that changed; a chapter's notebook does not change when the results
store or the package does, so without this an incremental `jupyter-book build book/` would keep
pages computed from old results."""


def _chapters(app, env, added, changed, removed):
    return [doc for doc in env.found_docs if doc.startswith("chapters/") and doc not in changed]


def setup(app):
    app.connect("env-get-outdated", _chapters)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
