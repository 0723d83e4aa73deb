"""Open every page of the built book in headless Chromium and check it as a reader would see it:
each page in the table of contents exists and loads, and every image has a non-zero natural size.

Usage: python scripts/check_book_html.py [_build/html] [--toc _toc.yml] [--chromium /usr/bin/chromium]

How: each page is copied with a small script that, once the page has loaded, writes the natural
size of every <img> into the DOM; `chromium --headless --dump-dom` prints that DOM.
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
    var pre = document.createElement('pre'); pre.id = 'medddpm-check';
    pre.textContent = JSON.stringify({title: document.title, images: imgs.map(function (i) {
      return {src: i.getAttribute('src'), w: i.naturalWidth, h: i.naturalHeight, ok: i.complete};
    })});
    document.body.appendChild(pre);
  }
  document.addEventListener('DOMContentLoaded', report);
})();</script>"""
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("site", nargs="?", default="_build/html")
    ap.add_argument("--toc", default="_toc.yml")
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser") or "chromium")
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
            result = check_page(a.chromium, html, Path(tmp) / "profile")
            for img in result["images"]:
                images += 1
                if not (img["ok"] and img["w"] > 0 and img["h"] > 0):
                    failures.append(f"{page}: image {img['src']} has natural size {img['w']}×{img['h']}")
            print(f"{page}: loaded ({result['title']!r}), {len(result['images'])} images")
    for f in failures:
        print("FAIL", f, file=sys.stderr)
    pages = len(toc_pages(Path(a.toc)))
    bad = len({f.split(":")[0] for f in failures})
    print(f"{images} images checked")
    print(f"book: {pages - bad} passed, {bad} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
