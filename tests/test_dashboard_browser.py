"""The dashboard as a web page: Voilà on a free loopback port, driven by headless Chromium.

Every tab: a control change updates the figure and the numbers; an invalid combination shows its
message in place. Sharing: the copied configuration restores the settings through a link.
Export: the PNG/SVG/CSV links are real data. Screenshots land in test-artifacts/ for a person to
look at. In CI (``CI`` set) a missing browser is a failure, never a silent skip."""

import json
import os
import shutil
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest

from browser import (
    ROOT,
    START_TIMEOUT_S,
    VIEWPORT,
    browser_page,
    chromium_available,
    img_src,
    numbers_text,
    open_tab,
    press_slider,
    select,
    type_slider,
    type_text,
    voila_server,
    wait_figure_change,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]
ARTIFACTS = ROOT / "test-artifacts"
# the visible control labels of a tab whose text is cut off (wider than the box that shows it)
TRUNCATED_LABELS = """k => [...document.querySelectorAll(
    '.mlsys-panel-' + k + ' .widget-label, .mlsys-panel-' + k + ' .widget-label-basic')]
  .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1).map(e => e.textContent)"""

# For each tab: its title, a valid change (must change figure and numbers) and an invalid one.
ACTIONS = {
    "memory": dict(
        title="Training memory",
        probe=lambda pg: press_slider(pg, ".mlsys-memory-tp", "ArrowRight"),  # TP 1 -> 2
        invalid=lambda pg: press_slider(pg, ".mlsys-memory-tp", "End"),  # TP 64 > 32 heads
    ),
    "scaling": dict(
        title="Scaling laws",
        probe=lambda pg: press_slider(pg, ".mlsys-scaling-compute-flops", "ArrowRight"),
        invalid=lambda pg: type_text(pg, ".mlsys-scaling-mfu-0-1", "1.5"),  # MFU must be <= 1
    ),
    "pipeline": dict(
        title="Pipeline schedules",
        probe=lambda pg: type_slider(pg, ".mlsys-pipeline-micro-batches-m", 16),
        invalid=lambda pg: (
            select(pg, ".mlsys-pipeline-schedule", "interleaved-1f1b"),
            type_slider(pg, ".mlsys-pipeline-chunks-v", 2),
            type_slider(pg, ".mlsys-pipeline-micro-batches-m", 3),
        ),
    ),
    "inference": dict(
        title="Inference",
        probe=lambda pg: type_text(pg, ".mlsys-inference-decode-batch", "32"),
        invalid=lambda pg: type_text(pg, ".mlsys-inference-decode-batch", "0"),  # batch must be >= 1
    ),
    "planner": dict(
        title="Parallelism planner",
        probe=lambda pg: type_text(pg, ".mlsys-planner-gpus", "512"),
        invalid=lambda pg: type_text(pg, ".mlsys-planner-sequences-step", "0"),  # sequences must be >= 1
    ),
    "rlhf": dict(
        title="RLHF systems",
        probe=lambda pg: type_text(pg, ".mlsys-rlhf-gpus", "64"),
        invalid=lambda pg: type_text(pg, ".mlsys-rlhf-gpus", "0"),  # at least one GPU
    ),
    "practice": dict(
        title="Practice",
        probe=lambda pg: type_text(pg, ".mlsys-practice-seed", 1),  # another question
        invalid=lambda pg: type_text(pg, ".mlsys-practice-seed", -1),  # seeds are >= 0
    ),
}


@pytest.fixture(scope="module")
def starting_server():
    """Voilà starting in a thread: ``(future of its URL, the environment patch)``. The browser starts
    meanwhile (``page``), which takes the patch back once the server has its environment."""
    if not chromium_available():
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs it (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium) ")
    ARTIFACTS.mkdir(exist_ok=True)
    # Voila's server imports jsonschema, which builds rfc3987_syntax's parsers at import (seconds of CPU) for
    # "iri" format checks that serving the dashboard never makes: skipped as in Ray's processes
    from mlsys_nb.runtime.ports import skipped_imports_dir

    skip_dir = skipped_imports_dir()
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", os.pathsep.join(x for x in (skip_dir, os.environ.get("PYTHONPATH", "")) if x))
    server = voila_server(log_path=ARTIFACTS / "voila.log")
    pool = ThreadPoolExecutor(max_workers=1)
    started = pool.submit(server.__enter__)  # Popen, then polls until Voila answers (START_TIMEOUT_S)
    try:
        yield started, mp
    finally:
        mp.undo()
        pool.shutdown(wait=True)
        try:
            if started.exception() is None:
                server.__exit__(None, None, None)
        finally:
            shutil.rmtree(skip_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def server(starting_server):
    return starting_server[0].result(timeout=START_TIMEOUT_S + 30)


@pytest.fixture(scope="module")
def page(starting_server):
    started, mp = starting_server
    with browser_page() as pg:  # chromium starts while Voila does
        url = started.result(timeout=START_TIMEOUT_S + 30)  # voila_server gives up at START_TIMEOUT_S
        mp.undo()  # the server has its environment; the rest of the session keeps its own
        pg.goto(url, timeout=120_000)
        pg.wait_for_selector(".mlsys-panel-memory img", state="attached", timeout=120_000)
        yield pg


@pytest.mark.parametrize("key", list(ACTIONS))
def test_tab_responds_and_explains(page, key):
    act = ACTIONS[key]
    open_tab(page, act["title"])
    # the Practice tab shows a message, not empty axes, until the first answer: its image is hidden
    page.wait_for_selector(f".mlsys-panel-{key} img", state="attached" if key == "practice" else "visible")
    if key == "practice":
        assert "first" in page.locator(".mlsys-practice-rule").inner_text()  # the scoring rule is shown
        assert "after your first answer" in page.locator(".mlsys-practice-placeholder").inner_text()
    page.screenshot(path=str(ARTIFACTS / f"dashboard-{key}-1-start.png"))
    truncated = page.evaluate(TRUNCATED_LABELS, key)
    assert not truncated, f"{key}: control labels cut off: {truncated}"
    src0, numbers0 = img_src(page, key), numbers_text(page, key)

    act["probe"](page)
    wait_figure_change(page, key, src0)
    page.wait_for_function(
        "([k, t]) => document.querySelector('.mlsys-numbers-' + k).textContent !== t",
        arg=[key, numbers0],
        timeout=30_000,
    )
    assert "mlsys-error" not in page.inner_html(f".mlsys-numbers-{key}")
    page.screenshot(path=str(ARTIFACTS / f"dashboard-{key}-2-changed.png"))

    act["invalid"](page)
    page.wait_for_selector(f".mlsys-numbers-{key} .mlsys-error", state="attached", timeout=30_000)
    message = page.locator(f".mlsys-numbers-{key} .mlsys-error").text_content().strip()
    assert message, f"{key}: an empty error message"
    panel_text = page.locator(f".mlsys-panel-{key}").inner_text()
    assert message[:40] in panel_text, f"{key}: the message is not visible in the tab: {message!r}"
    if key == "pipeline":  # the last valid chart stays, dimmed, and the message offers valid values
        assert "try m = 4" in message, message
        page.wait_for_selector(".mlsys-panel-pipeline img.mlsys-stale", state="visible", timeout=30_000)
    page.screenshot(path=str(ARTIFACTS / f"dashboard-{key}-3-invalid.png"))


def test_export_links_hold_real_files(page):
    open_tab(page, "Pipeline schedules")
    page.locator(".mlsys-export-pipeline").click()
    link = page.locator(".mlsys-export-links-pipeline a.mlsys-export-png")
    link.wait_for(state="attached", timeout=30_000)
    assert link.get_attribute("href").startswith("data:image/png;base64,iVBOR")
    csv = page.locator(".mlsys-export-links-pipeline a.mlsys-export-csv").get_attribute("href")
    assert csv.startswith("data:text/csv;base64,")


def test_shared_link_restores_settings(server, page):
    """Move TP to 4: the link shows only that change, and a second visitor of its address sees TP = 4."""
    open_tab(page, "Training memory")
    press_slider(page, ".mlsys-memory-tp", "Home")
    press_slider(page, ".mlsys-memory-tp", "ArrowRight")
    press_slider(page, ".mlsys-memory-tp", "ArrowRight")  # TP = 4
    page.wait_for_function(
        "() => document.querySelector('.mlsys-memory-tp .widget-readout').textContent.trim() === '4'"
    )
    page.wait_for_function(  # the kernel redraws the link after the slider's last value
        "() => document.querySelector('.mlsys-query').textContent.includes('\"tp\":4')", timeout=60_000
    )
    link = page.evaluate("document.querySelector('.mlsys-query').href")  # the anchor's full address
    # one click copies the full address: to the clipboard, and selected in the read-only box
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.rstrip("/"))
    page.locator(".mlsys-copy-link").click()
    page.wait_for_function("() => document.querySelector('.mlsys-copy-link').dataset.copied", timeout=10_000)
    assert page.locator(".mlsys-copy-link").text_content() == "Copied ✓"
    assert page.evaluate("navigator.clipboard.readText()") == link
    assert page.locator(".mlsys-share-url").input_value() == link
    # every tab was changed by the tests before (1-2 settings each); the full configuration was ~1.3 KB
    assert link.startswith(server) and len(link) < 700, link
    config = json.loads(urllib.parse.parse_qs(urllib.parse.urlsplit(link).query)["config"][0])
    assert config["memory"] == {"tp": 4} and "tab" not in config, config  # only changes; the first tab is the default
    fresh = page.context.browser.new_page(viewport=VIEWPORT)  # a second visitor of the link
    try:
        fresh.goto(link, timeout=120_000)
        fresh.wait_for_selector(".mlsys-panel-memory img", state="attached", timeout=120_000)
        readout = fresh.locator(".mlsys-memory-tp .widget-readout").text_content().strip()
        assert readout == "4", f"the link did not restore TP: shows {readout}"
        fresh.screenshot(path=str(ARTIFACTS / "dashboard-from-link.png"))
    finally:
        fresh.close()


def test_inference_says_70b_does_not_fit_on_one_80gb_gpu(page):
    open_tab(page, "Inference")
    type_text(page, ".mlsys-inference-decode-batch", "16")  # an earlier test left the invalid batch 0
    select(page, ".mlsys-inference-model", "llama-3-70b")
    verdict = page.locator(".mlsys-panel-inference .mlsys-verdict")
    verdict.wait_for(state="attached", timeout=60_000)
    text = verdict.text_content()
    assert "does not fit: weights 141 GB > 77 GB usable; needs TP ≥ 2" in text, text
    assert "tokens/s" not in page.locator(".mlsys-panel-inference").inner_text().split("Numbers")[0]
    page.screenshot(path=str(ARTIFACTS / "dashboard-inference-70b-does-not-fit.png"))
    select(page, ".mlsys-inference-model", "llama-3-8b")


def test_memory_sweep_control_changes_the_figure(page):
    """The 'bars over' control redraws the memory figure (the bars' totals, legend and OOM mark are
    checked on the figure's artists in tests/test_memory_widget.py; here a screenshot shows them)."""
    open_tab(page, "Training memory")
    src0 = img_src(page, "memory")
    select(page, ".mlsys-memory-bars-over", "ZeRO stage")
    wait_figure_change(page, "memory", src0)
    page.screenshot(path=str(ARTIFACTS / "dashboard-memory-sweep-zero.png"))
    select(page, ".mlsys-memory-bars-over", "sequence length")


def test_practice_answer_check_hint_new(page):
    """Answer the Practice tab's question in the browser: the key (the same seed gives the same
    question in this process) is accepted, a wrong answer is refused with a reason, Hint and New work."""
    from mlsys_nb import quiz

    open_tab(page, "Practice")
    type_text(page, ".mlsys-practice-seed", 4)
    q = quiz.draw(seed="4:0")  # what the tab draws for seed 4, first round
    page.wait_for_function(
        "t => document.querySelector('.mlsys-practice-question').textContent.includes(t)",
        arg=q.text[:40],
        timeout=30_000,
    )
    feedback = page.locator(".mlsys-practice-feedback")
    wrong = [c for c in q.choices if c != q.answer][0] if q.is_choice else str(q.answer * 3)
    page.locator(".mlsys-practice-answer input").fill(wrong)
    page.locator(".mlsys-practice-check").click()
    page.wait_for_function(
        "() => document.querySelector('.mlsys-practice-feedback').textContent.includes('✗')", timeout=30_000
    )
    page.locator(".mlsys-practice-answer input").fill(q.answer_response())
    page.locator(".mlsys-practice-check").click()
    page.wait_for_function(
        "() => document.querySelector('.mlsys-practice-feedback').textContent.includes('✓')", timeout=30_000
    )
    page.locator(".mlsys-practice-hint").click()
    page.wait_for_function(
        "() => document.querySelector('.mlsys-practice-feedback').textContent.includes('Hint 1')", timeout=30_000
    )
    assert q.hints[0][:30] in feedback.text_content()
    page.locator(".mlsys-practice-new").click()
    nxt = quiz.draw(seed="4:1")
    page.wait_for_function(
        "t => document.querySelector('.mlsys-practice-question').textContent.includes(t)",
        arg=nxt.text[:40],
        timeout=30_000,
    )
    assert "0/1" in page.locator(".mlsys-panel-practice").inner_text()  # the first verdict (wrong) counts
    page.screenshot(path=str(ARTIFACTS / "dashboard-practice-answered.png"))


def test_mock_interview_clock_runs(page):
    """The timed mock interview shows a clock that ticks in the page (no control touched)."""
    open_tab(page, "Practice")
    select(page, ".mlsys-practice-mode", "mock interview")
    clock = page.locator(".mlsys-practice-clock")
    page.wait_for_function(
        "() => document.querySelector('.mlsys-practice-clock').textContent.includes('question 1 of')", timeout=30_000
    )
    first = clock.text_content()
    page.wait_for_function(
        "t => document.querySelector('.mlsys-practice-clock').textContent !== t", arg=first, timeout=15_000
    )
    assert "Time " in clock.text_content() and "in total" in clock.text_content()
    page.screenshot(path=str(ARTIFACTS / "dashboard-practice-mock-clock.png"))
    select(page, ".mlsys-practice-mode", "practice")
