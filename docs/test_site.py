"""The built site, opened in a real browser: Debian's headless Chromium, driven through chromedriver.

Run after `bash docs/build`:  python -m pytest docs/test_site.py

Every HTML page of docs/_build/html/ is served on 127.0.0.1 and loaded once; on each the checks are:
- math rendered: MathJax finished without an error, and no raw `$$`, `\\frac`, `\\sqrt`, `\\(`, `\\[`, `:math:`
  or `.. math::` is left in the visible text outside source (notebook cells and their outputs, Python, shell
  and text blocks, inline code: they show source, where those strings are what the source says);
- every image loaded (`naturalWidth > 0`);
- no console errors (Chromium's SEVERE log entries: failed requests, script errors);
- every internal link resolves: the file exists, and a `#fragment` names an element of the target page;
- nothing is fetched from another host (the browser's resource timing lists every script, stylesheet, font
  and image a page loaded).
Screenshots of the home page, a walkthrough and a reference page go to docs/_build/screenshots/, and the
counts (pages, images, formulas, links) to docs/_build/screenshots/checks.json.
"""

from __future__ import annotations

import base64
import functools
import http.server
import json
import shutil
import tempfile
import threading
import urllib.parse
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

SITE = Path(__file__).resolve().parent / "_build" / "html"
SCREENSHOTS = Path(__file__).resolve().parent / "_build" / "screenshots"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
]
RAW_MATH = ["$$", "\\frac", "\\sqrt", "\\(", "\\[", ":math:", ".. math::"]
SHOTS = {
    "home": "index.html",
    "walkthrough": "tutorials/01_attention_by_hand.html",
    "reference": "reference/api/numpy_transformer.loss.html",
}

# Runs in the page once it has loaded: waits for MathJax and every image, then reports what it found.
SOURCE = ", ".join(
    [".cell_input", ".cell_output", ".highlight-python", ".highlight-ipython3", ".highlight-bash", ".highlight-text"]
    + [".highlight-none", "code", "script", "style", "mjx-container"]
)
INSPECT = f"const SOURCE = {json.dumps(SOURCE)};" + (
    """
const done = arguments[arguments.length - 1];
(async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  const images = Array.from(document.images);
  await Promise.all(images.map(img => {
    img.loading = "eager";
    return img.complete ? null : new Promise(r => { img.onload = r; img.onerror = r; });
  }));
  const body = document.body.cloneNode(true);
  // Source code is shown as written: notebook cells and their outputs, Python, shell and text listings.
  body.querySelectorAll(SOURCE).forEach(e => e.remove());
  const hidden = document.createElement("div");
  hidden.style.position = "absolute"; hidden.style.left = "-99999px";
  hidden.appendChild(body); document.documentElement.appendChild(hidden);
  const text = body.innerText;
  hidden.remove();
  done({
    text: text,
    formulas: document.querySelectorAll("mjx-container").length,
    outputs: document.querySelectorAll(".cell_output").length,
    mathjaxErrors: document.querySelectorAll("mjx-merror").length,
    images: images.map(img => ({src: img.currentSrc || img.src, width: img.naturalWidth})),
    links: Array.from(document.querySelectorAll("a[href]")).map(a => a.href),
    requests: performance.getEntriesByType("resource").map(e => e.name),
    ids: Array.from(document.querySelectorAll("[id], a[name]")).map(e => e.id || e.getAttribute("name")),
  });
})();
"""
)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's name)
        pass


@pytest.fixture(scope="module")
def site():
    """Serve the built site on a free port of 127.0.0.1 and visit every page once in headless Chromium."""
    if not (SITE / "index.html").is_file():
        pytest.fail(f"no built site at {SITE}: run `bash docs/build` first")
    for program in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(program) is None:
            pytest.fail(f"{program} is missing: apt-get install chromium chromium-driver")
    handler = functools.partial(QuietHandler, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    profile = tempfile.mkdtemp(prefix="docs-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(60)
    pages = {}
    try:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        for path in sorted(SITE.rglob("*.html")):
            name = path.relative_to(SITE).as_posix()
            driver.get(base + name)
            found = driver.execute_async_script(INSPECT)
            found["console"] = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            pages[name] = found
            for shot, page in SHOTS.items():
                if page == name:  # the whole page (up to 5,000 pixels down), not just the window
                    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
                    clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 5000), "scale": 1}
                    shot_png = driver.execute_cdp_cmd(
                        "Page.captureScreenshot", {"clip": clip, "captureBeyondViewport": True}
                    )
                    (SCREENSHOTS / f"{shot}.png").write_bytes(base64.b64decode(shot_png["data"]))
    finally:
        driver.quit()
        server.shutdown()
        shutil.rmtree(profile, ignore_errors=True)
    counts = {
        "pages": len(pages),
        "images": sum(len(p["images"]) for p in pages.values()),
        "formulas": sum(p["formulas"] for p in pages.values()),
        "links": sum(len(p["links"]) for p in pages.values()),
    }
    (SCREENSHOTS / "checks.json").write_text(json.dumps(counts, indent=1) + "\n")
    print(f"\nsite checks: {counts}")
    return {"base": base, "pages": pages, "counts": counts}


def test_site_has_every_section(site) -> None:
    """The four Diátaxis sections, a tutorial per walkthrough, and a reference page per module exist."""
    pages = site["pages"]
    for section in ("tutorials", "howto", "reference", "explanation"):
        assert f"{section}/index.html" in pages, section
    walkthroughs = sorted(p.stem for p in (SITE.parents[2] / "examples").glob("0*.py"))
    assert walkthroughs, "no walkthroughs found"
    for stem in walkthroughs:  # each one executed: its page shows what its cells printed
        assert f"tutorials/{stem}.html" in pages, stem
        assert pages[f"tutorials/{stem}.html"]["outputs"] > 0, f"{stem}: no cell output on its page"
    assert any(name.startswith("reference/api/numpy_transformer.") for name in pages)


def test_math_is_rendered_on_every_page(site) -> None:
    raw = {
        name: [s for s in RAW_MATH if s in page["text"]]
        for name, page in site["pages"].items()
        if any(s in page["text"] for s in RAW_MATH) or page["mathjaxErrors"]
    }
    assert not raw, f"raw TeX (or a MathJax error) left in the visible text: {raw}"
    assert site["counts"]["formulas"] > 100  # the derivations, the walkthroughs and the docstrings typeset
    assert site["pages"]["explanation/derivations.html"]["formulas"] > 20


def test_every_image_loads(site) -> None:
    broken = {
        name: [img["src"] for img in page["images"] if img["width"] == 0]
        for name, page in site["pages"].items()
        if any(img["width"] == 0 for img in page["images"])
    }
    assert not broken, f"images that did not load: {broken}"
    assert site["counts"]["images"] > 5  # the walkthroughs' figures, the loss curves, the tiled-attention plot


def test_no_console_errors(site) -> None:
    errors = {name: page["console"] for name, page in site["pages"].items() if page["console"]}
    assert not errors, f"console errors: {errors}"


def test_every_internal_link_resolves(site) -> None:
    base, pages = site["base"], site["pages"]
    bad = []
    for name, page in pages.items():
        for link in page["links"]:
            if not link.startswith(base):
                continue  # another site: the pages have none but the theme's own credits
            target, _, fragment = link[len(base) :].partition("#")
            target = urllib.parse.unquote(target.split("?")[0]) or "index.html"
            if target.endswith("/"):
                target += "index.html"
            if not (SITE / target).is_file():
                bad.append(f"{name} -> {link} (no such file)")
            elif fragment and target in pages and urllib.parse.unquote(fragment) not in pages[target]["ids"]:
                bad.append(f"{name} -> {link} (no such anchor)")
    assert not bad, "broken internal links:\n" + "\n".join(bad)


def test_nothing_is_fetched_from_elsewhere(site) -> None:
    """Offline: every script, stylesheet, font and image a page loads comes from the site itself."""
    base = site["base"]
    outside = {
        name: [url for url in page["requests"] if not url.startswith(base)]
        for name, page in site["pages"].items()
        if any(not url.startswith(base) for url in page["requests"])
    }
    assert not outside, f"resources loaded from elsewhere: {outside}"
    mathjax = [url for page in site["pages"].values() for url in page["requests"] if "mathjax" in url]
    assert mathjax, "no page loaded the site's own MathJax"


def test_screenshots_saved(site) -> None:
    for shot in SHOTS:
        path = SCREENSHOTS / f"{shot}.png"
        assert path.is_file() and path.stat().st_size > 10_000, path
