"""Open every page of the built book in headless Chromium at a laptop's width (1300 px) and check
it as a reader would see it: each page in the table of contents exists and loads, every image has
a non-zero natural size, no table of the pages in NO_SCROLL scrolls sideways, a figure in a
full-width cell (a multi-panel figure) is drawn wider than the text column, and the prose (the page's
text outside code) has no raw scientific notation ("8.5e-04": write 8.5 × 10⁻⁴) and names no issue
of the tracker ("issue 21"). A screenshot of the
pages in SCREENSHOTS is written to --screenshots.

Usage: python scripts/check_book_html.py [_build/html] [--toc _toc.yml] [--chromium /usr/bin/chromium]
                                         [--screenshots _build/screenshots]

How: each page is copied with a small script that, once the page has loaded, writes the natural
size of every <img>, the rendered widths of full-width figures and of the text, and every
sideways-scrolling table into the DOM; `chromium --headless --dump-dom` prints that DOM.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

PROBE = """<script>(function () {
  // once every image has finished (or after 8 s), write their natural sizes into the DOM;
  // not waiting for window.load, which remote scripts of the theme can hold up offline
  var t0 = Date.now();
  function report() {
    var imgs = Array.from(document.images);
    if (imgs.some(function (i) { return !i.complete; }) && Date.now() - t0 < 8000) {
      return setTimeout(report, 100);
    }
    var para = document.querySelector('article p');
    var text = para ? para.getBoundingClientRect().width : 0;
    var scrolling = Array.from(document.querySelectorAll('table')).map(function (t) {
      for (var e = t.parentElement; e && e !== document.body; e = e.parentElement) {
        var o = getComputedStyle(e).overflowX;
        if (o === 'auto' || o === 'scroll') { return {sw: e.scrollWidth, cw: e.clientWidth}; }
      }
      return {sw: t.scrollWidth, cw: t.scrollWidth};
    }).filter(function (r) { return r.sw > r.cw + 2; });
    var wide = Array.from(document.querySelectorAll('div.cell.tag_full-width img')).map(function (i) {
      return {src: i.getAttribute('src'), shown: i.getBoundingClientRect().width, natural: i.naturalWidth};
    });
    var pre = document.createElement('pre'); pre.id = 'medddpm-check';
    pre.textContent = JSON.stringify({title: document.title, text: text, scrolling: scrolling, wide: wide,
      images: imgs.map(function (i) {
      return {src: i.getAttribute('src'), w: i.naturalWidth, h: i.naturalHeight, ok: i.complete};
    })});
    document.body.appendChild(pre);
  }
  document.addEventListener('DOMContentLoaded', report);
})();</script>"""
WIDTH = 1300  # px: a laptop's browser window
NO_SCROLL = ("chapters/00_intro", "chapters/05_end_to_end")  # pages whose tables must fit the width
SCREENSHOTS = ("chapters/00_intro", "chapters/06_beyond")
FLAGS = [f"--window-size={WIDTH},1000", "--hide-scrollbars", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--allow-file-access-from-files", "--virtual-time-budget=10000"]


def toc_pages(toc: Path) -> list[str]:
    data = yaml.safe_load(toc.read_text())
    pages = [data["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                pages.append(node["file"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk({k: v for k, v in data.items() if k != "root"})
    return pages


def check_page(chromium: str, html: Path, profile: Path) -> dict:
    text = html.read_text(encoding="utf-8")
    probed = html.with_name(html.stem + ".probe.html")
    probed.write_text(text.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    try:
        p = subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", probed.as_uri()],
                           capture_output=True, text=True, timeout=120)
    finally:
        probed.unlink()
    m = re.search(r'<pre id="medddpm-check"[^>]*>(.*?)</pre>', p.stdout, flags=re.S)
    if not m:
        raise RuntimeError(f"{html.name}: the page did not finish loading in Chromium ({p.stderr.strip()[-300:]})")
    import html as h

    return json.loads(h.unescape(m.group(1)))


def layout_failures(page: str, result: dict) -> list[str]:
    """Tables that scroll sideways on a NO_SCROLL page; full-width figures drawn no wider than the text."""
    out = []
    if page in NO_SCROLL:
        out += [f"{page}: a table scrolls sideways at {WIDTH} px ({r['sw']} px in {r['cw']} px)" for r in result["scrolling"]]
    text = result.get("text") or 0
    for img in result.get("wide", []):
        if text and img["natural"] > 1.1 * text and img["shown"] <= 1.05 * text:
            out.append(f"{page}: multi-panel figure {img['src']} is drawn {img['shown']:.0f} px wide, in the "
                       f"{text:.0f} px text column")
    return out


RAW_SCI = re.compile(r"(?<![\w.\-])[-+]?\d+(?:\.\d+)?e[-+]?\d+(?![\w.\-])")  # 8.5e-04, 1e-2; not inside an ID (KX-08e5)
ISSUE = re.compile(r"\bissues? #?\d+", re.I)  # the tracker's numbers mean nothing to a reader


def prose(html_text: str) -> str:
    """A page's text outside code: cell sources, <pre>, <code>, scripts and styles removed."""
    import html as h

    t = re.sub(r"<(script|style|pre|code)\b.*?</\1>", " ", html_text, flags=re.S | re.I)
    t = re.sub(r'<div class="cell_input.*?</div>\s*</div>', " ", t, flags=re.S)
    return h.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", t)))


def prose_failures(page: str, html_text: str) -> list[str]:
    """Raw scientific notation and issue numbers in the prose of one page, each quoted in context."""
    text = prose(html_text)
    out = []
    for pattern, what in ((RAW_SCI, "raw scientific notation"), (ISSUE, "an issue number")):
        for m in pattern.finditer(text):
            out.append(f"{page}: {what} in the prose: …{text[max(0, m.start() - 40):m.end() + 20]}…")
    return out


def screenshot(chromium: str, html: Path, png: Path, profile: Path) -> None:
    png.parent.mkdir(parents=True, exist_ok=True)
    flags = [f for f in FLAGS if not f.startswith("--window-size")] + [f"--window-size={WIDTH},2400"]
    subprocess.run([chromium, *flags, f"--user-data-dir={profile}", f"--screenshot={png}", html.as_uri()],
                   capture_output=True, text=True, timeout=120)
    if not png.exists() or png.stat().st_size == 0:
        raise RuntimeError(f"{html.name}: Chromium wrote no screenshot")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("site", nargs="?", default="_build/html")
    ap.add_argument("--toc", default="_toc.yml")
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser") or "chromium")
    ap.add_argument("--screenshots", default=None, help=f"folder for {WIDTH} px screenshots (default: <site>/../screenshots)")
    a = ap.parse_args(argv)
    if not shutil.which(a.chromium):
        print(f"check_book_html: error: Chromium not found ({a.chromium}); install Debian's chromium", file=sys.stderr)
        return 2
    site = Path(a.site)
    failures, images = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "site"
        shutil.copytree(site, copy)
        for page in toc_pages(Path(a.toc)):
            html = copy / f"{page}.html"
            if not html.exists():
                failures.append(f"{page}: page missing from the built book")
                continue
            failures += prose_failures(page, html.read_text(encoding="utf-8"))
            result = check_page(a.chromium, html, Path(tmp) / "profile")
            for img in result["images"]:
                images += 1
                if not (img["ok"] and img["w"] > 0 and img["h"] > 0):
                    failures.append(f"{page}: image {img['src']} has natural size {img['w']}×{img['h']}")
            failures += layout_failures(page, result)
            print(f"{page}: loaded ({result['title']!r}), {len(result['images'])} images, {len(result['wide'])} "
                  f"full-width, text column {result['text']:.0f} px at {WIDTH} px")
            if page in SCREENSHOTS:
                shots = Path(a.screenshots) if a.screenshots else site.parent / "screenshots"
                png = shots / f"{page.replace('/', '_')}-{WIDTH}px.png"
                screenshot(a.chromium, html, png, Path(tmp) / "profile")
                print(f"{page}: screenshot {png}")
    for f in failures:
        print("FAIL", f, file=sys.stderr)
    pages = len(toc_pages(Path(a.toc)))
    bad = len({f.split(":")[0] for f in failures})
    print(f"{images} images checked")
    print(f"book: {pages - bad} passed, {bad} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
