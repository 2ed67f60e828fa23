"""The built site, opened in a real browser: Debian's headless Chromium, driven through chromedriver.

Run after `bash docs/build`:  python -m pytest docs/test_site.py

Every HTML page of docs/_build/html/ is served on 127.0.0.1 and loaded once (again, up to LOADS times, when a busy
machine spoiled the load: an error page, or math left untypeset); on each the checks are:
- math rendered: MathJax loaded and finished typesetting (waited for: its deferred script may run after the page's
  load on a busy machine; a page whose MathJax never loads or never finishes within MATH_WAIT fails, saying which),
  without an error node, and no TeX is left as text outside math and source
  (`$...$`, `$$`, a TeX command such as `\\tfrac` or `\\mathrm`, `\\(`, `\\[`, `:math:`, `.. math::`; notebook
  cells and their outputs, Python, shell and text blocks and inline code show source, where those strings are
  what the source says);
- no sideways scrolling: at 1280 px and at a phone's 390 px the page is no wider than the window (a long
  equation, a code block or a table may scroll inside its own box);
- formulas and code that fit: at 1280 px no display formula is wider than its column and no code line wider than
  its cell (the site wraps code there; a scroll bar at the bottom of a long cell is one the reader never sees); at
  390 px a wider one scrolls in its own box, never cut off (overflow hidden) or spilling out;
- no table row left as text (a paragraph "| a | b |" or "| --- |": a Markdown table split by a blank line);
- no link whose text is a file path ("docs/conventions.md") where the reader wants the page's title;
- nothing of the build machine in the page's text, outputs included: no absolute path into /tmp, /root,
  /home or /work, and no object repr (`<... at 0x7f...>`);
- every image loaded (`naturalWidth > 0`);
- no console errors (Chromium's SEVERE log entries: failed requests, script errors);
- every internal link resolves: the file exists, and a `#fragment` names an element of the target page;
- nothing is fetched from another host (the browser's resource timing lists every script, stylesheet, font
  and image a page loaded).
and the tutorials index links every walkthrough from its own text. Each check is a function of what the browser
found on a page, and test_checks_catch_broken_pages runs each one on a small page broken on purpose.
Screenshots of the home page, walkthrough sections and a reference page go to docs/_build/screenshots/, and the
counts (pages, images, formulas, links) to docs/_build/screenshots/checks.json.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import json
import re
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
MATHJAX = Path(__file__).resolve().parent / "node_modules" / "mathjax" / "es5"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
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
    "--hide-scrollbars",
    "--window-size=1280,900",
]
WIDTHS = (1280, 390)  # a laptop's window and a phone's
# TeX that should have been typeset: `$...$`, `$$`, a TeX command (a backslash and two or more letters, such
# as \tfrac, \mathrm), `\(`, `\[`, or reStructuredText's math markup left as text.
RAW_TEX = re.compile(r"\$\$|\$[^$\s][^$\n]*\$|\\[A-Za-z]{2,}|\\[(\[]|:math:|\.\. math::")
# The build machine: an absolute path into its temporary, home or work folders, or an object's default repr.
MACHINE_PATH = re.compile(r"(?<![\w.:/~-])/(?:tmp|root|home|work)/[^\s'\"),]*")
OBJECT_REPR = re.compile(r"<[^<>\n]* at 0x[0-9a-fA-F]+>")
# A Markdown table's rule line ("|---|---|", "| :--- | ---: |") left in a paragraph
TABLE_RULE = re.compile(r"\|\s*:?-{3,}:?\s*\|")
# Link text that is nothing but a file of the repository: a path with a folder ("docs/conventions.md",
# "`examples/01_attention_by_hand.py`") or a page's or notebook's file name ("notation.md")
PATH_TEXT = re.compile(r"\W*(?:[\w.-]+/[\w/.-]*\.(?:md|py|json|ipynb|toml|txt|html)|[\w-]+\.(?:md|ipynb))\W*")
TUTORIALS_INDEX = "tutorials/index.html"
# Screenshots: the page, and the id of the section to start from (None: the top); taken at every width.
SHOTS = {
    "home": ("index.html", None),
    "walkthrough_01b": ("tutorials/01b_multi_head_attention_by_hand.html", None),
    "walkthrough_03_post_norm": (
        "tutorials/03_backprop_encoder_decoder.html",
        "close-up-the-post-norm-residual-next-to-pre-norm",
    ),
    "walkthrough_04_cross_attention": ("tutorials/04_training_and_attention_maps.html", "reading-the-attention-maps"),
    "walkthrough_04_loss_curve": (
        "tutorials/04_training_and_attention_maps.html",
        "the-shipped-checkpoint-s-loss-curve",
    ),
    "reference": ("reference/api/numpy_transformer.loss.html", None),
}
LOADS = 3  # tries at loading a page before it counts as not served, or its math as not typeset
MATH_WAIT = 30.0  # seconds MathJax has to load and typeset a page (a few tenths on a quiet machine); then it fails
SHOT_HEIGHT = 1800  # pixels of page below the section's top (the whole page, up to this, for a page's top)

# Runs in the page once it has loaded: waits for MathJax and every image, then reports what it found.
SOURCE = ", ".join(
    [".cell_input", ".cell_output", ".highlight-python", ".highlight-ipython3", ".highlight-bash", ".highlight-text"]
    + [".highlight-none", "code", "pre", "script", "style", "mjx-container"]
)
INSPECT = f"const SOURCE = {json.dumps(SOURCE)};" + (
    """
const WAIT = arguments[0];  // milliseconds MathJax has to load and typeset the page
const done = arguments[arguments.length - 1];
const sleep = ms => new Promise(r => setTimeout(r, ms));
// "none" (the page loads no MathJax), "typeset", or why MathJax did not finish. A page with math sets its config
// (window.MathJax) or names the script; the script is deferred and may not have run when this starts, so wait
// for MathJax.startup.promise to exist, then for it to resolve: typesetting chains onto it, so wait until it
// stops changing.
const mathjax = async () => {
  // A page holding Sphinx's math elements needs MathJax even when neither its config nor its script is in the
  // document yet (seen on a busy machine): wait for it rather than read the page as one without math.
  const math = 'script[src*="mathjax" i], span.math, div.math';
  const wanted = window.MathJax !== undefined || document.querySelector(math);
  if (!wanted) { return "none"; }
  const deadline = performance.now() + WAIT;
  const late = () => `MathJax did not finish within ${WAIT / 1000} s`;
  while (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) {
    if (performance.now() > deadline) { return `${late()}: it never loaded (no MathJax.startup.promise)`; }
    await sleep(50);
  }
  let promise;
  do {
    promise = MathJax.startup.promise;
    const ended = await Promise.race([
      promise.then(() => "typeset", e => `MathJax failed: ${e && e.message || e}`),
      sleep(Math.max(0, deadline - performance.now())).then(() => `${late()}: its startup promise never resolved`),
    ]);
    if (ended !== "typeset") { return ended; }
  } while (promise !== MathJax.startup.promise);
  return "typeset";
};
// Sphinx's math elements MathJax has not turned into an mjx-container yet (its startup promise can resolve while a
// long page is still being typeset): waited for, within the same time.
const untypeset = () => Array.from(document.querySelectorAll("span.math, div.math"))
  .filter(e => !e.querySelector("mjx-container")).length;
(async () => {
  const until = performance.now() + WAIT;
  let math = await mathjax();
  while (math === "typeset" && untypeset() && performance.now() < until) { await sleep(50); }
  if (math === "typeset" && untypeset()) {
    math = `MathJax left ${untypeset()} formulas untypeset within ${WAIT / 1000} s`;
  }
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
  const main = document.querySelector("article") || document.body;
  done({
    url: location.href,
    article: document.querySelector("article") !== null,  // every page Sphinx builds has one; an error page none
    mathjax: math,
    text: text,
    allText: document.body.innerText,
    formulas: document.querySelectorAll("mjx-container").length,
    outputs: document.querySelectorAll(".cell_output").length,
    folded: document.querySelectorAll("details:not([open])").length,
    // MathJax's error nodes, and the red text it draws for an undefined command (its noundefined extension)
    mathjaxErrors: Array.from(document.querySelectorAll("mjx-merror")).map(e => e.getAttribute("data-mjx-error") || "")
      .concat(Array.from(document.querySelectorAll('mjx-mtext[style*="color: red"]')).map(e => "undefined command")),
    images: images.map(img => ({src: img.currentSrc || img.src, width: img.naturalWidth})),
    links: Array.from(document.querySelectorAll("a[href]")).map(a => a.href),
    contentLinks: Array.from(main.querySelectorAll("a[href]")).filter(a => !a.closest(".toctree-wrapper"))
      .map(a => a.href),
    requests: performance.getEntriesByType("resource").map(e => e.name),
    ids: Array.from(document.querySelectorAll("[id], a[name]")).map(e => e.id || e.getAttribute("name")),
    // paragraphs of the main column outside source, with their text line by line (a table split by a blank line
    // leaves its rows as a paragraph of pipes)
    paragraphs: Array.from(main.querySelectorAll("p")).filter(p => !p.closest(SOURCE))
      .map(p => p.textContent.trim()).filter(t => t.includes("|")),
    linkTexts: Array.from(document.querySelectorAll("a[href]"))
      .map(a => ({text: a.textContent.trim(), href: a.getAttribute("href")})),
  });
})();
"""
)

# Runs at each width: how much wider than the window the page is, and the outermost elements of the main
# column that reach past its right edge without a scrolling box of their own around them.
GUTTER = 12  # pixels
OVERFLOW = (
    f"const GUTTER = {GUTTER};"
    + """
const root = document.documentElement;
const main = document.querySelector("article") || document.body;
// the column and its gutter (the theme draws headings and tables a few pixels into it), never past the window
const edge = Math.min(main.getBoundingClientRect().right + GUTTER, root.clientWidth) + 1;
const wide = [];
const name = e => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") +
  (e.className && typeof e.className === "string" ? "." + e.className.trim().split(/\\s+/).join(".") : "") +
  ' "' + (e.textContent || "").trim().slice(0, 60) + '"';
const walk = e => {
  for (const node of e.childNodes) {
    if (node.nodeType === Node.TEXT_NODE) {  // a line of text that does not wrap spills out of its box
      const range = document.createRange(); range.selectNodeContents(node);
      const right = range.getBoundingClientRect().right;
      if (node.textContent.trim() && right > edge) {
        wide.push(name(e) + ` (its text) reaches ${Math.round(right)} px`);
      }
      continue;
    }
    if (node.nodeType !== Node.ELEMENT_NODE) continue;
    const style = getComputedStyle(node);
    if (style.display === "none" || style.visibility === "hidden") continue;  // not drawn (a hover-only ¶)
    const r = node.getBoundingClientRect();
    const scrolls = style.overflowX !== "visible";  // what is wider scrolls inside this box
    // a formula is measured whole: its content, when its box does not scroll
    const right = node.tagName === "MJX-CONTAINER" && !scrolls ? r.left + node.scrollWidth : r.right;
    if (r.width > 0 && right > edge) { wide.push(name(node) + ` reaches ${Math.round(right)} px`); continue; }
    if (scrolls || node.tagName === "MJX-CONTAINER") continue;
    walk(node);
  }
};
walk(main);
// What is wider than its own box, and whether that box scrolls (overflow-x auto or scroll, on it or on the
// nearest ancestor whose overflow is not visible) or clips it (hidden, clip) or lets it spill out (visible).
const scrollsIn = e => {
  for (; e && e !== main.parentElement; e = e.parentElement) {
    const overflow = getComputedStyle(e).overflowX;
    if (overflow !== "visible") return overflow === "auto" || overflow === "scroll";
  }
  return false;
};
const formulas = Array.from(main.querySelectorAll('mjx-container[display="true"]'))
  .filter(m => m.scrollWidth > m.parentElement.clientWidth + 1 || m.scrollWidth > m.clientWidth + 1)
  .map(m => ({width: m.scrollWidth, room: Math.min(m.clientWidth, m.parentElement.clientWidth), scrolls: scrollsIn(m),
              text: (m.querySelector("mjx-assistive-mml") || m).textContent.trim().slice(0, 60)}));
const code = Array.from(main.querySelectorAll("pre")).filter(p => p.scrollWidth > p.clientWidth + 1)
  .map(p => ({width: p.scrollWidth, room: p.clientWidth, scrolls: scrollsIn(p),
              text: p.textContent.split("\\n").reduce((a, b) => b.length > a.length ? b : a, "").trim().slice(0, 60)}));
return {scrollWidth: root.scrollWidth, clientWidth: root.clientWidth, edge: Math.round(edge), wide: wide.slice(0, 5),
        formulas: formulas, code: code};
"""
)


# --- The checks: each a function of what the browser found on one page, a list of faults (empty: clean) ---------


def math_faults(page: dict) -> list[str]:
    """MathJax not finished (never loaded, failed, or out of time), its error nodes, and TeX left as text outside
    math and source."""
    faults = [] if page["mathjax"] in ("none", "typeset") else [page["mathjax"]]
    faults += [f"MathJax error: {message or '(no message)'}" for message in page["mathjaxErrors"]]
    for match in RAW_TEX.finditer(page["text"]):
        context = page["text"][max(match.start() - 30, 0) : match.end() + 30].replace("\n", " ")
        faults.append(f"TeX left as text: {match.group()!r} in ...{context}...")
    return faults


def overflow_faults(page: dict) -> list[str]:
    """At each width: a page wider than the window, or content past the main column's edge."""
    faults = []
    for width, found in page["overflow"].items():
        if found["scrollWidth"] > found["clientWidth"]:
            faults.append(f"at {width} px the page scrolls sideways ({found['scrollWidth']} px wide)")
        faults += [f"at {width} px past the column's edge ({found['edge']} px): {e}" for e in found["wide"]]
    return faults


def too_wide(page: dict, kind: str, what: str, box: str) -> list[str]:
    """The elements of one kind (the OVERFLOW script's "formulas" or "code") wider than their box: at 1280 px
    any, at a phone's width those whose box does not scroll (cut off, or spilling out)."""
    faults = []
    for width, found in page["overflow"].items():
        for e in found[kind]:
            if int(width) == WIDTHS[0] or not e["scrolls"]:
                how = f"scrolls in its {box}" if e["scrolls"] else "cut off"
                faults.append(f"at {width} px {what} {e['width']} px wide in {e['room']} px ({how}): {e['text']}")
    return faults


def formula_faults(page: dict) -> list[str]:
    """A display formula wider than its column: at 1280 px at all (a laptop shows every equation whole, the
    learner never has to find a hidden scroll bar), at a phone's width unless it scrolls in its own box."""
    return too_wide(page, "formulas", "a formula", "box")


def code_faults(page: dict) -> list[str]:
    """A code line wider than its cell: at 1280 px at all (the site wraps long lines there; a scroll bar at the
    bottom of a long cell is one the reader does not see), at a phone's width unless the cell scrolls."""
    return too_wide(page, "code", "a code line", "cell")


def table_faults(page: dict) -> list[str]:
    """A paragraph that is the row of a table left as text: a Markdown table split by a blank line (its last rows
    then read "| a | b |"), or a table's rule line."""
    faults = []
    for text in page["paragraphs"]:
        for line in text.splitlines():
            line = line.strip()
            row = line.startswith("|") and line.endswith("|") and line.count("|") >= 3
            if row or TABLE_RULE.search(line):
                faults.append(f"a table row shown as text: {line[:80]}")
    return faults


def path_link_faults(page: dict) -> list[str]:
    """A link whose text is a file's path ("docs/conventions.md"): a reader wants the page's title."""
    return [
        f"link text is a file path: {link['text']!r} -> {link['href']}"
        for link in page["linkTexts"]
        if PATH_TEXT.fullmatch(link["text"])
    ]


def leak_faults(page: dict) -> list[str]:
    """Paths of the build machine and object reprs anywhere in the page's text, cell outputs included."""
    found = MACHINE_PATH.findall(page["allText"]) + OBJECT_REPR.findall(page["allText"])
    return [f"leaked: {leak}" for leak in found]


def walkthroughs_not_listed(index: dict, base: str, stems: list[str]) -> list[str]:
    """The walkthroughs that the tutorials index does not link from its own text (its table of contents aside)."""
    linked = {urllib.parse.unquote(link[len(base) :].partition("#")[0]) for link in index["contentLinks"]}
    return [stem for stem in stems if f"tutorials/{stem}.html" not in linked]


# --- The browser -------------------------------------------------------------------------------------------------


class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 128  # the default 5 refuses connections when Chromium opens many at once on busy cores
    daemon_threads = True


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's name)
        pass


@contextlib.contextmanager
def serve(folder: Path):
    """Serve a folder on a free port of 127.0.0.1; yields the base URL."""
    server = Server(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


@contextlib.contextmanager
def browser():
    """Headless Chromium through chromedriver, with a throw-away profile."""
    for program in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(program) is None:
            pytest.fail(f"{program} is missing: apt-get install chromium chromium-driver")
    profile = tempfile.mkdtemp(prefix="docs-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def set_width(driver, width: int) -> None:
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}
    )


def screenshot(driver, path: Path, section: str | None) -> None:
    """The page from the top of `section` (or of the page) down, SHOT_HEIGHT pixels at most."""
    top = 0
    if section is not None:
        top = driver.execute_script(
            "const e = document.getElementById(arguments[0]);"
            "return e ? e.getBoundingClientRect().top + window.scrollY : null;",
            section,
        )
        if top is None:
            return  # no such section: test_screenshots_saved names the missing file
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    height = min(size["height"] - top, SHOT_HEIGHT)
    clip = {"x": 0, "y": top, "width": size["width"], "height": height, "scale": 1}
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"clip": clip, "captureBeyondViewport": True})
    path.write_bytes(base64.b64decode(shot["data"]))


def visit(driver, url: str, shots: dict[str, str | None] | None = None, math_wait: float = MATH_WAIT) -> dict:
    """Load one page at the first width, inspect it once MathJax has typeset it (within `math_wait` seconds), then
    measure its overflow at every width (and take the screenshots asked for: name -> section, at each width)."""
    set_width(driver, WIDTHS[0])
    for _ in range(LOADS):  # a load a busy machine spoiled (Chromium's error page, math untypeset) is tried again
        driver.get(url)
        found = driver.execute_async_script(INSPECT, round(math_wait * 1000))
        if found["url"] == url and found["article"] and not math_faults(found):
            break
    found["console"] = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    found["overflow"] = {}
    for width in WIDTHS:
        set_width(driver, width)
        found["overflow"][width] = driver.execute_script(OVERFLOW)
        for shot, section in (shots or {}).items():
            screenshot(driver, SCREENSHOTS / f"{shot}_{width}.png", section)
    return found


@pytest.fixture(scope="module")
def site():
    """Serve the built site and visit every page once in headless Chromium."""
    if not (SITE / "index.html").is_file():
        pytest.fail(f"no built site at {SITE}: run `bash docs/build` first")
    pages = {}
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with serve(SITE) as base, browser() as driver:
        for path in sorted(SITE.rglob("*.html")):
            name = path.relative_to(SITE).as_posix()
            shots = {shot: section for shot, (page, section) in SHOTS.items() if page == name}
            pages[name] = visit(driver, base + name, shots)
    counts = {
        "pages": len(pages),
        "images": sum(len(p["images"]) for p in pages.values()),
        "formulas": sum(p["formulas"] for p in pages.values()),
        "links": sum(len(p["links"]) for p in pages.values()),
    }
    (SCREENSHOTS / "checks.json").write_text(json.dumps(counts, indent=1) + "\n")
    print(f"\nsite checks: {counts}")
    return {"base": base, "pages": pages, "counts": counts}


def walkthrough_stems() -> list[str]:
    stems = sorted(p.stem for p in EXAMPLES.glob("[0-9][0-9]*.py"))
    assert stems, f"no walkthroughs found in {EXAMPLES}"
    return stems


def assert_clean(site, check, what: str) -> None:
    """The check finds nothing on any page; else the faults it found, page by page."""
    faults = {name: check(page) for name, page in site["pages"].items() if check(page)}
    assert not faults, f"{what}:\n" + json.dumps(faults, indent=1, ensure_ascii=False)


# --- The built site ----------------------------------------------------------------------------------------------


def test_every_page_loaded(site) -> None:
    """Each page was served and shown as itself (not Chromium's error page) within LOADS tries: every other check
    reads what the browser showed."""
    base = site["base"]
    assert_clean(
        site,
        lambda page: [] if page["article"] else [f"not shown after {LOADS} loads: the browser was at {page['url']}"],
        "pages that did not load",
    )
    assert all(page["url"].startswith(base) for page in site["pages"].values())


def test_site_has_every_section(site) -> None:
    """The four Diátaxis sections, a tutorial per walkthrough, and a reference page per module exist."""
    pages = site["pages"]
    for section in ("tutorials", "howto", "reference", "explanation"):
        assert f"{section}/index.html" in pages, section
    for stem in walkthrough_stems():  # each one executed: its page shows what its cells printed
        assert f"tutorials/{stem}.html" in pages, stem
        assert pages[f"tutorials/{stem}.html"]["outputs"] > 0, f"{stem}: no cell output on its page"
    assert any(name.startswith("reference/api/numpy_transformer.") for name in pages)


def test_math_is_rendered_on_every_page(site) -> None:
    assert_clean(site, math_faults, "raw TeX (or a MathJax error)")
    assert site["counts"]["formulas"] > 100  # the derivations, the walkthroughs and the docstrings typeset
    assert site["pages"]["explanation/derivations.html"]["formulas"] > 20


def test_no_page_scrolls_sideways(site) -> None:
    assert_clean(site, overflow_faults, "too wide")


LEARNERS_PATH = {  # what a learner reading the pages found, each kind checked on every page
    "formulas_fit_their_column": (formula_faults, "formulas too wide"),
    "code_fits_its_cell": (code_faults, "code lines too wide"),
    "no_table_row_shown_as_text": (table_faults, "tables broken into text"),
    "no_link_reads_as_a_file_path": (path_link_faults, "links that read as paths"),
}


@pytest.mark.parametrize("kind", LEARNERS_PATH)
def test_learners_path(site, kind: str) -> None:
    assert_clean(site, *LEARNERS_PATH[kind])


def test_nothing_of_the_build_machine_shows(site) -> None:
    assert_clean(site, leak_faults, "machine paths or object reprs")


def test_tutorials_index_lists_every_walkthrough(site) -> None:
    missing = walkthroughs_not_listed(site["pages"][TUTORIALS_INDEX], site["base"], walkthrough_stems())
    assert not missing, f"walkthroughs not named in the tutorials index's text: {missing}"


def test_workbook_has_every_exercise_with_its_answer_folded(site) -> None:
    """One workbook page per numbered exercise of each walkthrough that has an answers file, its answer folded."""
    pages = site["pages"]
    for stem in walkthrough_stems():
        number = stem.split("_", 1)[0]
        if not (EXAMPLES / "answers" / f"{number}_answers.py").is_file():
            continue
        text = (EXAMPLES / f"{stem}.py").read_text().split("\n# ## Exercises\n", 1)
        assert len(text) == 2, f"{stem} has an answers file but no Exercises section"
        count = len(re.findall(r"^# (\d+)\. ", text[1], flags=re.MULTILINE))
        for n in range(1, count + 1):
            page = pages.get(f"workbook/{number}_exercise_{n}.html")
            assert page is not None, f"no workbook page for exercise {n} of {stem}"
            assert page["folded"] == 1, f"workbook/{number}_exercise_{n}: the answer is not folded"


def test_workbook_answer_is_the_tested_one() -> None:
    """The answer a workbook page shows (its <details> block) is, line for line, in the answers file the page names,
    which the test suite runs: a shown answer cannot drift from the checked one (an API change included). Reads the
    pages `bash docs/build` wrote under docs/workbook/."""
    workbook = Path(__file__).resolve().parent / "workbook"
    pages = sorted(workbook.glob("*_exercise_*.md"))
    assert len(pages) >= 6, f"no workbook pages under {workbook}: run `bash docs/build` first"
    for page in pages:
        text = page.read_text()
        named = re.findall(r"`examples/answers/([\w.]+)`", text)
        shown = re.findall(r"<details>.*?```python\n(.*?)```", text, re.S)
        assert named and shown, f"{page.name}: expected an answer block and the answers file it comes from"
        answer_lines = set("".join((EXAMPLES / "answers" / name).read_text() for name in set(named)).splitlines())
        for block in shown:
            drifted = [line for line in block.splitlines() if line.strip() and line not in answer_lines]
            assert not drifted, f"{page.name}: lines not in examples/answers/{named[0]}: {drifted[:3]}"


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
        for width in WIDTHS:
            path = SCREENSHOTS / f"{shot}_{width}.png"
            assert path.is_file() and path.stat().st_size > 10_000, path


# --- The checks themselves, on pages broken on purpose (no built site needed) ------------------------------------

PAGE = """<!doctype html><html><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<script>window.MathJax = {tex: {inlineMath: [["\\\\(", "\\\\)"]], displayMath: [["\\\\[", "\\\\]"]]}};</script>
<script defer src="mathjax/tex-chtml-full.js"></script>
<style>body { margin: 0; } article { max-width: 700px; margin: 0 auto; }
.scroll, pre, .math { overflow-x: auto; }
@media (min-width: 48em) { pre { white-space: pre-wrap; overflow-wrap: anywhere; } }</style>
</head><body><article><h1>A page</h1><p>Softmax: \\(p_i = e^{s_i} / \\sum_j e^{s_j}\\).</p>
<div class="scroll"><pre>a code line far wider than the column {wide}</pre></div>
<div class="math">\\[ J = \\mathrm{diag}(\\gamma)\\, r \\big(I - \\tfrac1D \\mathbf{1}\\mathbf{1}^\\top\\big)
{long} \\]</div>
<p>|x| is the absolute value; see <a href="clean.html">the conventions</a> and <code>docs/conventions.md</code>.</p>
{fault}</article></body></html>"""
# An equation that fits the column at 1280 px and scrolls in its box at 390 px; a code line that wraps at 1280 px
# and scrolls in its cell at 390 px (as the site's pages do).
LONG = " + ".join(f"x_{i}" for i in range(8))
WIDE_FORMULA = r"\[ " + " + ".join(f"y_{i}" for i in range(80)) + r" \]"
BROKEN = {  # the fault, and the check (or checks) that must catch it
    "mathjax_error": (r"<p>\(a & b\)</p>", math_faults),
    "undefined_command": (r"<p>\(\tfracc1D x\)</p>", math_faults),
    "unbalanced_braces": (r"<p>\(\frac{1}{\)</p>", math_faults),
    "tex_as_text": (r"<ul><li><p>$J_{\mathrm{LN}} = \mathrm{diag}(\gamma)$</p></li></ul>", math_faults),
    "tfrac_as_text": (r"<p>- \tfrac1D \hat x \hat x^\top\big)$.</p>", math_faults),
    "wide_at_1280": ('<div style="width: 1500px">a table far too wide</div>', overflow_faults),
    "wide_at_390": ('<img style="width: 600px; height: 10px" alt="">', overflow_faults),
    "past_the_column": ('<div style="width: 900px">wider than the column, not the window</div>', overflow_faults),
    "machine_path": ('<div class="cell_output"><pre>saved /tmp/tmpk2x9/attention.png</pre></div>', leak_faults),
    "home_path": ("<p>see /root/.cache/walkthrough/out.png</p>", leak_faults),
    "long_equation": (f"<p>{WIDE_FORMULA}</p>", (overflow_faults, formula_faults)),
    "scrolling_formula": (f'<div class="math">{WIDE_FORMULA}</div>', formula_faults),  # at 1280 px
    "clipped_formula": (f'<div style="overflow: hidden">{WIDE_FORMULA}</div>', formula_faults),
    "scrolling_code": ('<pre style="white-space: pre">' + "x = 1  # " * 40 + "</pre>", code_faults),  # at 1280 px
    "clipped_code": ('<pre style="white-space: pre; overflow: hidden">' + "x = 1  # " * 40 + "</pre>", code_faults),
    "spilling_code": (
        '<pre style="white-space: pre; overflow: visible">' + "x = 1  # " * 40 + "</pre>",
        (overflow_faults, code_faults),
    ),
    "table_row_as_text": ("<p>| x used by several paths | dx = the sum of the J^T dy |</p>", table_faults),
    "table_rule_as_text": ("<p>| forward | backward |\n| --- | --- |</p>", table_faults),
    "path_as_link_text": ('<p>as stated in <a href="clean.html">docs/conventions.md</a></p>', path_link_faults),
    "file_as_link_text": ('<p>the <a href="clean.html">notation.md</a> table</p>', path_link_faults),
    "unwrapped_line": ('<p style="white-space: nowrap">' + "a line that never wraps " * 30 + "</p>", overflow_faults),
    "object_repr": (
        '<div class="cell_output"><pre>&lt;numpy_transformer.model.Transformer at 0x7f3a2c1d9e50&gt;</pre></div>',
        leak_faults,
    ),
}
SCRIPT = '<script defer src="mathjax/tex-chtml-full.js"></script>'
# The race a busy machine runs into, made certain: MathJax's script runs well after the page has loaded.
LATE = '<script>setTimeout(() => { const s = document.createElement("script"); s.src = "mathjax/tex-chtml-full.js";'
LATE += " document.head.appendChild(s); }, 1500);</script>"
CHECKS = (math_faults, overflow_faults, leak_faults, formula_faults, code_faults, table_faults, path_link_faults)


def test_checks_catch_broken_pages(tmp_path) -> None:
    """Each check passes a clean page (whose long equation and code line scroll in their own boxes) and fails
    the page broken on purpose for it; the index check names the walkthrough an index leaves out. A page whose
    MathJax runs late is typeset before it is read; one whose MathJax never loads fails, saying so."""
    if not (MATHJAX / "tex-chtml-full.js").is_file():
        pytest.fail(f"MathJax is not installed in {MATHJAX}: run `npm ci --prefix docs`")
    (tmp_path / "mathjax").mkdir()
    shutil.copy2(MATHJAX / "tex-chtml-full.js", tmp_path / "mathjax")
    shutil.copytree(MATHJAX / "output", tmp_path / "mathjax" / "output")
    page = PAGE.replace("{wide}", "x" * 300).replace("{long}", LONG)
    (tmp_path / "clean.html").write_text(page.replace("{fault}", ""))
    (tmp_path / "late.html").write_text(page.replace("{fault}", "").replace(SCRIPT, LATE))
    (tmp_path / "never.html").write_text(page.replace("{fault}", "").replace(SCRIPT, SCRIPT.replace("tex-", "no-")))
    for name, (fault, _) in BROKEN.items():
        (tmp_path / f"{name}.html").write_text(page.replace("{fault}", fault))
    stems = ["01_attention_by_hand", "01b_multi_head_attention_by_hand", "08_check_your_own_model"]
    links = "".join(f'<a href="{stem}.html">{stem}</a> ' for stem in stems[:2])
    toc = f'<div class="toctree-wrapper"><a href="{stems[2]}.html">{stems[2]}</a></div>'
    (tmp_path / "tutorials").mkdir()
    (tmp_path / "tutorials" / "index.html").write_text(f"<article><p>{links}</p>{toc}</article>")
    with serve(tmp_path) as base, browser() as driver:
        clean = visit(driver, base + "clean.html")
        assert clean["formulas"] == 2, clean["formulas"]  # MathJax ran: the inline and the display formula
        for check in CHECKS:
            assert check(clean) == [], (check.__name__, check(clean))
        broken = {}
        for name, (_, catchers) in BROKEN.items():
            catchers = catchers if isinstance(catchers, tuple) else (catchers,)
            broken[name] = visit(driver, base + f"{name}.html")
            for catcher in catchers:
                assert catcher(broken[name]), f"{catcher.__name__} missed the fault of {name}.html"
            for check in CHECKS:  # and only the checks it is meant for fire
                assert check in catchers or check(broken[name]) == [], (name, check.__name__, check(broken[name]))
        late = visit(driver, base + "late.html")
        never = visit(driver, base + "never.html", math_wait=2)
        index = visit(driver, base + TUTORIALS_INDEX)
        assert walkthroughs_not_listed(index, base, stems) == [stems[2]]  # listed in the toctree only
    assert late["mathjax"] == "typeset" and late["formulas"] == 2 and math_faults(late) == [], math_faults(late)
    assert math_faults(never)[0] == "MathJax did not finish within 2 s: it never loaded (no MathJax.startup.promise)"
    for name in ("mathjax_error", "undefined_command"):  # typeset, but as an error
        assert broken[name]["mathjaxErrors"] and broken[name]["formulas"] == 3, name
    assert broken["long_equation"]["formulas"] == 3  # typeset, and wider than the column without a box of its own
    for name in ("scrolling_formula", "scrolling_code"):  # fine on a phone, where they scroll in their own box
        assert all("at 1280 px" in fault for fault in formula_faults(broken[name]) + code_faults(broken[name])), name
    for name in ("clipped_formula", "clipped_code", "spilling_code"):  # cut off (or spilling out) at both widths
        faults = formula_faults(broken[name]) + code_faults(broken[name])
        assert any("at 390 px" in fault for fault in faults) and any("at 1280 px" in fault for fault in faults), name
    assert all("at 390 px" in fault for fault in overflow_faults(broken["wide_at_390"]))  # fits at 1280 px
    assert any("scrolls sideways" in fault for fault in overflow_faults(broken["wide_at_1280"]))
