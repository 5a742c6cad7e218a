"""Build the notebooks as a static web site: ``make site`` (``python -m tools.build_site``), read without installing.

Every notebook is executed at its defaults as the test suite runs it under papermill (``tests/nbrun.run_notebook``:
the ``mlsys_nb`` kernel, the per-cell timeout, a kernel that failed to start started again, the figure check of
``tests/kernel_startup.py``) and written as one HTML page with its outputs and figures by nbconvert's HTML exporter
(JupyterLab's look; figures embedded in the page). The dashboard (notebook 00) is widgets that need a kernel: its
page shows each tab as a screenshot taken in headless Chromium (``tests/browser.py``) and the command that serves
it live. ``index.html`` lists every notebook in curriculum order (the numbering) with its "you will be able to"
line from the README's table, and the README's two commands.

Why nbconvert: it comes with JupyterLab (no Node.js), renders a notebook as JupyterLab shows it and works offline
(MathJax from ``jupyter-server-mathjax`` is copied into the site); one page per notebook and an index are all the
site needs. Jupyter Book / MyST would add a Node.js or Sphinx tool chain to re-execute what papermill already runs.

Every page says which machine executed it and when: the times, rates and bandwidths on it are that machine's.
``check_site`` opens every page in Chromium and lists what is wrong (an error output, a figure missing, a link
that leads nowhere, a notebook missing from the index); the build exits non-zero on a failed notebook or a problem.
"""

from __future__ import annotations

import argparse
import datetime
import html
import json
import os
import platform
import re
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
README = ROOT / "README.md"
SITE = ROOT / "site"
TESTS = ROOT / "tests"
sys.path.insert(0, str(TESTS))  # the suite's helpers: nbrun (papermill runs), browser (Voila, Chromium)
DASHBOARD = "00_dashboard"
NOT_EXECUTED = "not executed in this build"
# nbconvert's JupyterLab template, with error outputs marked (``output_error``, what check_site looks for), no
# require.js (only widgets need it) and the site's navigation and machine line at the top of the page.
TEMPLATE = """{%- extends 'index.html.j2' -%}
{% block html_head_js_requirejs %}{% endblock html_head_js_requirejs %}
{% block extra_css %}<style>{{ resources.site_css }}</style>{% endblock extra_css %}
{% block body_header %}{{ super() }}{{ resources.site_header }}{% endblock body_header %}
{% block error -%}<div class="output_error">{{ super() }}</div>{%- endblock error %}
"""
CSS = """body.site, .site-header { font-family: system-ui, sans-serif; max-width: 72rem; margin: 1rem auto;
  padding: 0 1rem; line-height: 1.45 }
.site-nav a { margin-right: 1rem } .site-machine { background: #fff6dd; border-left: 4px solid #e69f00;
  padding: .5rem .8rem; margin: .8rem 0 } table.site-index td, table.site-index th { vertical-align: top;
  padding: .35rem .6rem; border-bottom: 1px solid #ddd; text-align: left } .site-status { white-space: nowrap }
.site-failed { color: #b00 } .site-shot { max-width: 100%; border: 1px solid #ccc } pre.site-commands {
  background: #f4f4f4; padding: .8rem; overflow-x: auto }"""
SHELL = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title><style>{css}</style></head>
<body class="site">{header}{body}</body></html>
"""


@dataclass
class Page:
    """One notebook's page: ``status`` is "executed", "failed", "screenshots" (the dashboard) or NOT_EXECUTED."""

    stem: str
    title: str
    able: str  # the "you will be able to" line, Markdown
    status: str = NOT_EXECUTED
    seconds: float | None = None
    error: str = ""


# ---- what the pages say ----------------------------------------------------------------------------------------
def curriculum(notebooks: Path = NOTEBOOKS) -> list[Path]:
    """The notebooks in curriculum order: their numbers (``05b`` after ``05``, docs/adding-a-topic.md)."""
    return sorted(notebooks.glob("[0-9]*.ipynb"))


def readme_lines(readme: Path = README) -> dict[str, str]:
    """The README notebook table's "you will be able to" cell (Markdown), by notebook stem."""
    rows = re.findall(r"^\| \w+ \| \[[^\]]*\]\(notebooks/([\w]+)\.ipynb\) \| (.*) \|$", readme.read_text(), re.M)
    return dict(rows)


def readme_commands(readme: Path = README) -> str:
    """The code block under the README's "## Two commands"."""
    section = readme.read_text().split("\n## Two commands\n", 1)[1]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


def notebook_intro(path: Path) -> tuple[str, str]:
    """A notebook's title (its first heading) and its "**After this notebook you can** ..." paragraph."""
    cells = json.loads(path.read_text())["cells"]
    text = "".join(next(c["source"] for c in cells if c["cell_type"] == "markdown"))
    title = text.splitlines()[0].lstrip("# ").strip()
    able = next((p for p in text.split("\n\n") if p.startswith("**After this notebook you can**")), "")
    return title, able.removeprefix("**After this notebook you can**").strip()


def pages_for(notebooks: list[Path], readme: Path = README) -> list[Page]:
    lines = readme_lines(readme) if readme.exists() else {}
    pages = []
    for path in notebooks:
        title, able = notebook_intro(path)
        pages.append(Page(path.stem, title, lines.get(path.stem) or able))
    return pages


def machine() -> dict:
    """The machine that executes the notebooks: ``runtime.machine.info()`` and the operating system."""
    from mlsys_nb.runtime.machine import info

    return {**info(), "os": platform.platform(terse=True)}


def machine_line(m: dict, seconds: float | None = None, what: str = "Executed", where: str = "this page") -> str:
    """Which machine ran the page and when; its measured numbers are that machine's."""
    ran = "" if seconds is None else f" in {seconds:.0f} s" if seconds < 120 else f" in {seconds / 60:.1f} min"
    return (
        f'<p class="site-machine">{what}{ran} on {html.escape(m["date (UTC)"])} UTC on {html.escape(m["cpu"])}, '
        f"{m['nproc']} cores, {html.escape(m['os'])}, torch {html.escape(m['torch'])}, Python {m['python']} "
        f"(load average {m['load average (1 min)']} as it started). Every time, rate and bandwidth on "
        f"{where} was measured on <b>this machine</b>; yours will differ. Formulas and published values do not.</p>"
    )


def nav(pages: list[Page], i: int) -> str:
    links = ['<a href="index.html">Index</a>']
    if i > 0:
        links.append(f'<a href="{pages[i - 1].stem}.html">← {html.escape(pages[i - 1].title)}</a>')
    if i + 1 < len(pages):
        links.append(f'<a href="{pages[i + 1].stem}.html">{html.escape(pages[i + 1].title)} →</a>')
    return f'<nav class="site-nav">{" ".join(links)}</nav>'


def markdown(text: str) -> str:
    from nbconvert.filters import markdown2html

    return markdown2html(text)


def rewrite_links(page_html: str, base: Path, site: Path, stems: set[str]) -> str:
    """Relative links written for ``base`` (a notebook's folder, or the repository for the README) made to work
    from ``site``: a notebook's ``.ipynb`` becomes its page, any other file is reached in the repository."""

    def fix(m: re.Match) -> str:
        attr, url = m.group(1), html.unescape(m.group(2))
        if re.match(r"^([a-z][a-z0-9+.-]*:|#|//)", url, re.I) or not url:
            return m.group(0)
        path, _, frag = url.partition("#")
        if path.removesuffix(".html") in stems | {"index"} or path.startswith(("dashboard/", "mathjax/")):
            return m.group(0)  # a page of the site, linked by the site itself
        target = (base / urllib.parse.unquote(path)).resolve()
        if target.suffix == ".ipynb" and target.stem in stems:
            new = target.stem + ".html"
        else:
            new = urllib.parse.quote(os.path.relpath(target, site))
        return f'{attr}="{html.escape(new + ("#" + frag if frag else ""))}"'

    return re.sub(r'\b(href|src)="([^"]*)"', fix, page_html)


def write(path: Path, title: str, header: str, body: str) -> None:
    path.write_text(SHELL.format(title=html.escape(title), css=CSS, header=header, body=body))


# ---- executing and writing one notebook ------------------------------------------------------------------------
def execute(path: Path, out_dir: Path):
    """Run ``path`` at its defaults with ``tests/nbrun`` into ``out_dir``: ``(executed notebook or None, error)``.
    A failing cell still gives the notebook (papermill writes it, the error in its cell)."""
    import nbformat
    import nbrun

    try:
        return nbrun.run_notebook(path.name, notebook_dir=path.parent, artifact_dir=out_dir), ""
    except Exception as e:  # a cell raised (papermill), or the kernel never started or died
        out = out_dir / executed_name(path.stem)
        return (nbformat.read(out, as_version=4) if out.exists() else None), f"{type(e).__name__}: {e}"


def executed_name(stem: str) -> str:
    """The file name ``tests/nbrun`` gives a notebook executed at its defaults."""
    return f"{stem}__defaults" + ".ipynb"


MATHJAX_URL = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"  # the site's copy; a config it ships


def copy_mathjax(site: Path) -> None:
    """MathJax 2 (the version nbconvert's pages load) from ``jupyter-server-mathjax`` into ``site/mathjax``, so the
    formulas render offline (about 12 MB; copied once)."""
    import shutil

    import jupyter_server_mathjax

    if not (site / "mathjax" / "MathJax.js").exists():
        shutil.copytree(Path(jupyter_server_mathjax.__file__).parent / "static", site / "mathjax", dirs_exist_ok=True)


def notebook_page(nb, title: str, header: str) -> str:
    """An executed notebook as one HTML page (nbconvert, JupyterLab's template, figures embedded); its formulas
    typeset by the site's own MathJax (``copy_mathjax``), so a page renders them offline."""
    import jinja2
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(
        template_name="lab",
        template_file="site.html.j2",
        extra_loaders=[jinja2.DictLoader({"site.html.j2": TEMPLATE})],
        mathjax_url=MATHJAX_URL,
    )
    resources = {"metadata": {"name": title}, "site_header": header, "site_css": CSS}
    body, _ = exporter.from_notebook_node(nb, resources=resources)
    return body


def build_notebook(path: Path, site: Path, pages: list[Page], i: int) -> None:
    """Execute ``pages[i]``'s notebook and write its page (its error shown in place if a cell failed)."""
    page, start, m = pages[i], time.monotonic(), machine()  # the date and load as this notebook starts
    print(f"site: executing {path.name}", flush=True)
    nb, page.error = execute(path, site / "_executed")
    page.seconds = time.monotonic() - start
    page.status = "failed" if page.error else "executed"
    header = f'<div class="site-header">{nav(pages, i)}{machine_line(m, page.seconds)}</div>'
    if nb is None:  # nothing ran: the page says why, marked as an error output
        body = f'<h1>{html.escape(page.title)}</h1><div class="output_error"><pre>{html.escape(page.error)}</pre></div>'
        text = SHELL.format(title=html.escape(page.title), css=CSS, header=header, body=body)
    else:
        text = notebook_page(nb, page.title, header)
    stems = {p.stem for p in pages}
    (site / f"{page.stem}.html").write_text(rewrite_links(text, path.parent, site, stems))
    print(f"site: {path.name}: {page.status} in {page.seconds:.0f} s {page.error[:300]}", flush=True)


def write_stub(site: Path, pages: list[Page], i: int) -> None:
    """The page of a notebook this build did not execute: says so, and how to build it."""
    page = pages[i]
    body = (
        f"<h1>{html.escape(page.title)}</h1><p>This notebook was {NOT_EXECUTED}. Build it with "
        f"<code>make site SITE_NOTEBOOKS={page.stem.split('_')[0]}</code>, or run it: "
        f"<code>make lab</code> and open <code>notebooks/{page.stem}.ipynb</code>.</p>"
    )
    write(site / f"{page.stem}.html", page.title, f'<div class="site-header">{nav(pages, i)}</div>', body)


# ---- the dashboard ---------------------------------------------------------------------------------------------
NO_CHROMIUM = "Chromium is not installed (apt-get install chromium, or set MLSYS_NB_CHROMIUM)"
SHOT_VIEWPORT = {"width": 1280, "height": 2400}
# the tab just opened shows its panel, with its figure (the Practice tab's stays hidden until an answer)
PANEL_SHOWN = """() => [...document.querySelectorAll('[class*="mlsys-panel-"]')]
  .some(e => e.offsetParent !== null && e.querySelector('img') !== null)"""


def dashboard_screenshots(out_dir: Path) -> tuple[list[tuple[str, str]], str]:
    """Serve the dashboard with Voilà, open each tab in headless Chromium and save a screenshot of it:
    ``([(tab title, file name)], "")``, or ``([], why not)`` when Chromium is missing or the dashboard failed."""
    from browser import browser_page, chromium_available, open_tab, voila_server

    if not chromium_available():
        return [], NO_CHROMIUM
    out_dir.mkdir(parents=True, exist_ok=True)
    shots = []
    try:
        with voila_server(log_path=out_dir / "voila.log") as url, browser_page() as pg:
            pg.set_viewport_size(SHOT_VIEWPORT)  # Voila's page scrolls inside itself: a tall window shows a whole tab
            pg.goto(url, timeout=120_000)
            pg.wait_for_selector(".mlsys-panel-memory img", state="attached", timeout=120_000)
            for k, title in enumerate(pg.locator(".mlsys-tabs .lm-TabBar-tab").all_inner_texts()):
                open_tab(pg, title.strip())
                pg.wait_for_function(PANEL_SHOWN, timeout=60_000)
                pg.wait_for_timeout(500)  # the image decoded and laid out
                name = f"dashboard-{k + 1}.png"
                pg.locator(".mlsys-tabs").first.screenshot(path=str(out_dir / name))
                shots.append((title.strip(), name))
    except Exception as e:  # the page says what went wrong instead of showing no tab
        return shots, f"the dashboard could not be captured: {type(e).__name__}: {e}"
    return shots, ""


def write_dashboard(site: Path, pages: list[Page], i: int, m: dict, shots, reason: str) -> None:
    page = pages[i]
    """The dashboard's page: its tabs as screenshots, or why there are none (no Chromium: said, not a failure)."""
    page.status = "screenshots" if not reason else "no screenshots" if reason == NO_CHROMIUM else "failed"
    page.error = reason
    live = (
        "<p>A static page cannot run the dashboard's controls. Run it live: <code>make dashboard</code>, then open "
        "<a href='http://127.0.0.1:8866/'>http://127.0.0.1:8866/</a> (or <code>make lab</code> and open "
        f"<code>notebooks/{page.stem}.ipynb</code>).</p>"
    )
    missing = f"<p><b>No screenshots in this build:</b> {html.escape(reason)}.</p>" if reason else ""
    tabs = "".join(
        f'<h2>{html.escape(t)}</h2><img class="site-shot" src="dashboard/{n}" alt="{html.escape(t)}">' for t, n in shots
    )
    captured = (
        f'<p class="site-machine">Captured on {html.escape(m["date (UTC)"])} UTC. The dashboard shows the kit\'s '
        "models and published values: nothing on it is measured.</p>"
    )
    header = f'<div class="site-header">{nav(pages, i)}{captured}</div>'
    body = f"<h1>{html.escape(page.title)}</h1><p>{markdown(page.able)}</p>{live}{missing}{tabs}"
    write(site / f"{page.stem}.html", page.title, header, rewrite_links(body, README.parent, site, set()))


# ---- the index and the whole build -----------------------------------------------------------------------------
def status_cell(page: Page) -> str:
    if page.status == "executed":
        return f"executed in {page.seconds:.0f} s"
    if page.status == "failed":
        return f'<span class="site-failed">failed: {html.escape(page.error[:200])}</span>'
    if page.status == "screenshots":
        return "its tabs as screenshots"
    if page.status == "no screenshots":
        return f"no screenshots: {html.escape(page.error)}"
    return NOT_EXECUTED


def write_index(site: Path, pages: list[Page], m: dict, readme: Path, seconds: float) -> None:
    stems = {p.stem for p in pages}
    rows = "".join(
        f'<tr data-notebook="{p.stem}" data-status="{p.status}"><td>{p.stem.split("_")[0]}</td>'
        f'<td><a href="{p.stem}.html">{html.escape(p.title.split(" · ", 1)[-1])}</a></td><td>{markdown(p.able)}</td>'
        f'<td class="site-status">{status_cell(p)}</td></tr>'
        for p in pages
    )
    intro = markdown(readme.read_text().split("\n\n", 2)[1]) if readme.exists() else ""
    commands = html.escape(readme_commands(readme)) if readme.exists() else ""
    body = (
        "<h1>mlsys_nb: the notebooks, executed</h1>"
        f"{intro}<h2>Run them yourself: two commands</h2><pre class='site-commands'>{commands}</pre>"
        f"{machine_line(m, seconds, 'Built', 'these pages')}"
        "<h2>The notebooks</h2><table class='site-index'><tr><th>#</th><th>notebook</th>"
        f"<th>you will be able to</th><th>this build</th></tr>{rows}</table>"
    )
    write(site / "index.html", "mlsys_nb: the notebooks, executed", "", rewrite_links(body, readme.parent, site, stems))


def select(notebooks: list[Path], only: list[str] | None) -> set[str]:
    """The stems to build: all, or those whose number or stem is in ``only`` (``["14", "20"]``)."""
    if not only:
        return {p.stem for p in notebooks}
    known = {p.stem.split("_")[0]: p.stem for p in notebooks} | {p.stem: p.stem for p in notebooks}
    bad = [o for o in only if o not in known]
    if bad:
        raise ValueError(f"SITE_NOTEBOOKS (--only) names notebooks by number or stem, one of {sorted(known)}: {bad}")
    return {known[o] for o in only}


def build(
    site: Path = SITE, only: list[str] | None = None, notebooks: Path = NOTEBOOKS, readme: Path = README
) -> list[Page]:
    """Execute the chosen notebooks and write the site into ``site``; the pages, each with its status."""
    start = time.monotonic()
    paths = curriculum(notebooks)
    chosen, pages, m = select(paths, only), pages_for(paths, readme), machine()
    for old in [*site.glob("*.html"), *site.glob("_executed/*"), *site.glob("dashboard/*")]:
        old.unlink()  # a page of an earlier build would pass for this one's
    site.mkdir(parents=True, exist_ok=True)
    copy_mathjax(site)
    for i, path in enumerate(paths):
        if path.stem not in chosen:
            write_stub(site, pages, i)
        elif path.stem == DASHBOARD:
            write_dashboard(site, pages, i, m, *dashboard_screenshots(site / "dashboard"))
        else:
            build_notebook(path, site, pages, i)
    write_index(site, pages, m, readme, time.monotonic() - start)
    return pages


# ---- checking the site in a browser ----------------------------------------------------------------------------
PAGE_FACTS = """() => ({
  title: document.title,
  text: document.body ? document.body.innerText.trim().length : 0,
  hrefs: [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href')),
  images: [...document.querySelectorAll('img')].filter(i => i.complete && i.naturalWidth > 0).length,
  errors: document.querySelectorAll('.output_error').length,
  rows: [...document.querySelectorAll('tr[data-notebook]')]
    .map(r => [r.dataset.notebook, r.dataset.status, r.innerText]),
})"""


def draws_figure(executed: Path) -> bool:
    """The executed notebook has an image output (a figure it showed)."""
    cells = json.loads(executed.read_text())["cells"]
    outputs = [o for c in cells for o in c.get("outputs", [])]
    return any(k.startswith("image/") for o in outputs for k in o.get("data", {}))


def ids_in(path: Path) -> set[str]:
    return {html.unescape(i) for i in re.findall(r'\bid="([^"]*)"', path.read_text())}


def link_problems(page: Path, hrefs: list[str]) -> list[str]:
    """Links of ``page`` to a file that does not exist, or to an anchor its (HTML) target does not have."""
    problems = []
    for href in hrefs:
        if re.match(r"^(https?|mailto|data|javascript):", href):
            continue
        url = urllib.parse.urlsplit(urllib.parse.urljoin(page.as_uri(), href))
        target = Path(urllib.parse.unquote(url.path))
        frag = url.fragment  # a browser matches an id as written, then percent-decoded (nbconvert writes it encoded)
        if not target.exists():
            problems.append(f"{page.name}: link {href!r} leads to no file")
        elif frag and target.suffix == ".html" and not {frag, urllib.parse.unquote(frag)} & ids_in(target):
            problems.append(f"{page.name}: link {href!r}: {target.name} has no anchor {frag!r}")
    return problems


def page_problems(path: Path, facts: dict, site: Path) -> list[str]:
    problems = [] if facts["title"] and facts["text"] else [f"{path.name}: an empty page"]
    if facts["errors"] or "output_error" in path.read_text():
        problems.append(f"{path.name}: shows {facts['errors']} error output(s)")
    executed = site / "_executed" / executed_name(path.stem)
    if executed.exists() and draws_figure(executed) and not facts["images"]:
        problems.append(f"{path.name}: the notebook draws a figure but the page shows no image")
    scripts = [src.split("?")[0] for src in re.findall(r'<script[^>]*\bsrc="([^"]+)"', path.read_text())]
    return problems + link_problems(path, facts["hrefs"] + scripts)


def index_problems(rows: list[list[str]], stems: list[str]) -> list[str]:
    """The index lists every notebook, in curriculum order; one this build did not execute says so."""
    problems = []
    if [r[0] for r in rows] != stems:
        problems.append(f"index.html lists {[r[0] for r in rows]}, not the notebooks in order {stems}")
    for stem, status, text in rows:
        if status == NOT_EXECUTED and NOT_EXECUTED not in text:
            problems.append(f"index.html: {stem} was {NOT_EXECUTED} but its row does not say so")
    return problems


def check_site(site: Path = SITE, notebooks: Path = NOTEBOOKS) -> list[str]:
    """Open every page of ``site`` in headless Chromium (no request leaves the machine) and list the problems:
    a page that does not load or is empty, an error output, a notebook that drew a figure shown without an image,
    a link to a missing file or anchor, an index that does not list every notebook in order with its status."""
    from browser import browser_page

    problems, stems = [], [p.stem for p in curriculum(notebooks)]
    with browser_page() as pg:
        pg.route("**/*", lambda r: r.continue_() if r.request.url.startswith(("file:", "data:")) else r.abort())
        for path in sorted(site.glob("*.html")):
            response = pg.goto(path.as_uri(), wait_until="load")
            if response is not None and not response.ok:
                problems.append(f"{path.name}: does not load ({response.status})")
                continue
            facts = pg.evaluate(PAGE_FACTS)
            problems += page_problems(path, facts, site)
            if path.name == "index.html":
                problems += index_problems(facts["rows"], stems)
    if not (site / "index.html").exists():
        problems.append("no index.html")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.build_site", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=SITE, help="the site's folder (default: site/)")
    parser.add_argument("--only", nargs="*", help="build these notebooks (numbers or stems); the index lists all")
    parser.add_argument("--no-check", action="store_true", help="do not open the pages in Chromium afterwards")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONSTARTUP", str(TESTS / "kernel_startup.py"))  # the figure check, as under pytest
    start = time.monotonic()
    pages = build(args.out, args.only)
    failed = [f"{p.stem}: {p.error}" for p in pages if p.status == "failed"]
    from browser import chromium_available

    if args.no_check or not chromium_available():
        problems = []
        print("site: not checked in a browser" + ("" if args.no_check else " (Chromium is not installed)"))
    else:
        problems = check_site(args.out)
    took = datetime.timedelta(seconds=round(time.monotonic() - start))
    print(f"site: {args.out / 'index.html'} written in {took}; {len(failed)} notebook(s) failed", flush=True)
    for line in failed + problems:
        print(f"  {line}")
    return 1 if failed or problems else 0


if __name__ == "__main__":
    sys.exit(main())
