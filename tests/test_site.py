"""``make site`` (tools/build_site.py): the notebooks executed as a static site, checked in a real browser.

The site is built for two notebooks, the fastest at their defaults (14: 8 s with figures, 20: 11 s without, at load
5 on 2 cores); the index still lists all. ``check_site`` opens every page in Chromium: each loads, shows no error
output, shows an image where its notebook drew a figure, links only to files and anchors that exist, and the index
lists every notebook in order. Each of those checks is broken on purpose once and must say so, and a notebook whose
cell raises fails the build and is flagged. In CI (``CI`` set) a missing Chromium is a failure, never a skip."""

import os
import shutil
import sys
from pathlib import Path

import pytest

from browser import chromium_available

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools import build_site  # noqa: E402  (the repository's tools, beside tests/)

SUBSET = ["14", "20"]  # 14 draws figures, 20 draws none
ALL = [p.stem for p in build_site.curriculum()]


def need_chromium():
    if not chromium_available():
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs it (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    return out, {p.stem: p for p in build_site.build(out, only=SUBSET)}


@pytest.mark.notebook
@pytest.mark.slow
def test_a_subset_build_executes_its_notebooks_and_lists_them_all(site):
    out, pages = site
    assert list(pages) == ALL
    built = {s for s, p in pages.items() if p.status != build_site.NOT_EXECUTED}
    assert built == {"14_kv_cache_management", "20_interview_worksheets"}, built
    assert all(pages[s].status == "executed" for s in built), {s: pages[s].error for s in built}
    assert all((out / f"{s}.html").exists() for s in ALL)  # a page for each, a stub for the others
    assert build_site.draws_figure(out / "_executed" / "14_kv_cache_management__defaults.ipynb")
    assert not build_site.draws_figure(out / "_executed" / "20_interview_worksheets__defaults.ipynb")
    index = (out / "index.html").read_text()
    assert "make lab" in index and "make test" in index  # the README's two commands
    page = (out / "14_kv_cache_management.html").read_text()
    assert "measured on <b>this machine</b>" in page and "torch " in page and "cores" in page
    assert 'src="mathjax/MathJax.js' in page and (out / "mathjax" / "MathJax.js").exists()  # formulas offline


@pytest.mark.notebook
@pytest.mark.browser
@pytest.mark.slow
def test_the_site_passes_its_browser_check(site):
    need_chromium()
    assert build_site.check_site(site[0]) == []


@pytest.mark.notebook
@pytest.mark.browser
@pytest.mark.slow
def test_the_check_flags_each_broken_idea(site, tmp_path):
    """A figure dropped, a link to a missing page and to a missing anchor, a notebook missing from the index, an
    unbuilt notebook's row that does not say so: each is one problem the check names."""
    need_chromium()
    out = tmp_path / "site"
    shutil.copytree(site[0], out)
    fig = out / "14_kv_cache_management.html"
    fig.write_text(fig.read_text().replace("<img ", "<span "))
    ws = out / "20_interview_worksheets.html"
    ws.write_text(ws.read_text().replace("<main>", '<main><a href="no_such.html">x</a><a href="#no-such-id">y</a>', 1))
    index = out / "index.html"
    text = index.read_text()
    row = text.index('<tr data-notebook="20_')
    text = text[:row] + text[text.index("</tr>", row) + 5 :]  # notebook 20's row removed
    index.write_text(text.replace(build_site.NOT_EXECUTED + "</td>", "ok</td>", 1))
    shutil.rmtree(out / "mathjax")  # the pages' formulas would show as TeX source
    problems = "\n".join(build_site.check_site(out))
    for expected in (
        "14_kv_cache_management.html: the notebook draws a figure but the page shows no image",
        "20_interview_worksheets.html: link 'no_such.html' leads to no file",
        "20_interview_worksheets.html: link '#no-such-id': 20_interview_worksheets.html has no anchor",
        "index.html lists",
        "index.html: 00_dashboard was not executed in this build but its row does not say so",
        "14_kv_cache_management.html: link 'mathjax/MathJax.js' leads to no file",
    ):
        assert expected in problems, f"not flagged: {expected}\n{problems}"


@pytest.mark.notebook
@pytest.mark.slow
def test_a_cell_that_raises_fails_the_build_and_its_page_is_flagged(tmp_path):
    notebooks, out = tmp_path / "notebooks", tmp_path / "site"
    notebooks.mkdir()
    from nbformat import v4, write

    title = "# 01 · Raises\n\n**After this notebook you can** fail."
    cells = [v4.new_markdown_cell(title), v4.new_code_cell("1 / 0")]
    write(v4.new_notebook(cells=cells), notebooks / "01_raises.ipynb")
    [page] = build_site.build(out, notebooks=notebooks, readme=tmp_path / "no_readme.md")
    assert page.status == "failed" and "ZeroDivisionError" in page.error, page
    assert page.able == "fail."  # no README: the line comes from the notebook's first cell
    if chromium_available():
        problems = build_site.check_site(out, notebooks)
        assert any(p.startswith("01_raises.html: shows 1 error output") for p in problems), problems


def test_subset_names_a_notebook_by_number_or_stem():
    paths = build_site.curriculum()
    assert build_site.select(paths, ["14", "20_interview_worksheets"]) == {
        "14_kv_cache_management",
        "20_interview_worksheets",
    }
    with pytest.raises(ValueError, match=r"SITE_NOTEBOOKS .* one of .*'05b'.*\['99'\]"):
        build_site.select(paths, ["99"])


def test_every_notebook_has_a_you_will_be_able_to_line():
    lines = build_site.readme_lines()
    assert set(lines) == set(ALL), set(ALL) ^ set(lines)
    assert all(p.able.strip() for p in build_site.pages_for(build_site.curriculum()))


def test_links_lead_to_pages_or_to_the_repository(tmp_path):
    html = '<a href="05_data_parallelism.ipynb#Sharding">a</a><a href="../docs/references.md#x">b</a><a href="#h">c</a>'
    out = build_site.rewrite_links(html, build_site.NOTEBOOKS, tmp_path, {"05_data_parallelism"})
    rel = os.path.relpath(ROOT / "docs" / "references.md", tmp_path)
    assert out == f'<a href="05_data_parallelism.html#Sharding">a</a><a href="{rel}#x">b</a><a href="#h">c</a>'


def test_the_dashboard_page_says_why_it_has_no_screenshots(tmp_path):
    pages = build_site.pages_for(build_site.curriculum()[:2])
    build_site.write_dashboard(tmp_path, pages, 0, build_site.machine(), [], "Chromium is not installed")
    text = (tmp_path / "00_dashboard.html").read_text()
    assert "No screenshots in this build:</b> Chromium is not installed" in text
    assert "make dashboard" in text and "http://127.0.0.1:8866/" in text


@pytest.mark.browser
def test_formulas_typeset_offline_from_the_sites_own_mathjax(tmp_path):
    """A page's MathJax is the site's copy (no network): a formula in markdown is typeset in Chromium."""
    need_chromium()
    from nbformat import v4

    from browser import browser_page

    build_site.copy_mathjax(tmp_path)
    nb = v4.new_notebook(cells=[v4.new_markdown_cell("Ring all-reduce sends $2(n-1)/n \\cdot S$ bytes.")])
    page = tmp_path / "formula.html"
    page.write_text(build_site.notebook_page(nb, "formula", ""))
    with browser_page() as b:
        b.route("http*://**", lambda route: route.abort())  # offline: any request to the network fails
        b.goto(page.as_uri())
        b.wait_for_function("() => document.querySelectorAll('.MathJax, .MathJax_Display').length > 0", timeout=30_000)
