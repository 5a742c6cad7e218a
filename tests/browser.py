"""Serve the dashboard with Voilà on a free loopback port and drive it with headless Chromium
(Debian's /usr/bin/chromium through Playwright; no browser download). Used by the browser test
and by benchmarks/widgets.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from serve_helpers import stop_process

from mlsys_nb.runtime.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("MLSYS_NB_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
VIEWPORT = {"width": 1280, "height": 800}
START_TIMEOUT_S = 120


def chromium_available() -> bool:
    return Path(CHROMIUM).exists()


@contextlib.contextmanager
def voila_server(notebook: str = "00_dashboard.ipynb", log_path: Path | None = None, args=()):
    """Start Voilà on 127.0.0.1:<free port> (with the extra command-line ``args``); yield the base URL; always
    stop it."""
    port = free_port()
    voila = Path(sys.executable).with_name("voila")
    log = open(log_path or os.devnull, "w")
    proc = subprocess.Popen(
        [str(voila), notebook, "--no-browser", "--Voila.ip=127.0.0.1", f"--port={port}", *args],
        cwd=ROOT / "notebooks",
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"voila exited with code {proc.returncode}; see {log_path}")
            try:
                urllib.request.urlopen(url, timeout=2).close()  # any HTTP answer means it is up
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"voila did not answer on {url} within {START_TIMEOUT_S} s") from None
                time.sleep(0.3)
        yield url
    finally:
        stop_process(proc, timeout=10)
        log.close()


@contextlib.contextmanager
def browser_page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(60_000)
            yield page
        finally:
            browser.close()


# ---- driving ipywidgets controls -------------------------------------------------------------
def img_src(page, key: str) -> str | None:
    loc = page.locator(f".mlsys-panel-{key} img")
    return loc.first.get_attribute("src") if loc.count() else None


def wait_figure_change(page, key: str, old_src: str | None, timeout_ms: int = 30_000) -> None:
    page.wait_for_function(
        "([k, s]) => { const i = document.querySelector('.mlsys-panel-' + k + ' img');"
        " return i !== null && i.src !== s; }",
        arg=[key, old_src],
        timeout=timeout_ms,
    )


def numbers_text(page, key: str) -> str:
    return page.locator(f".mlsys-numbers-{key}").text_content()


def press_slider(page, css: str, key: str) -> None:
    """Move a slider with the keyboard (ArrowRight, ArrowLeft, Home, End)."""
    handle = page.locator(f"{css} .noUi-handle")
    handle.focus()
    page.keyboard.press(key)


def type_slider(page, css: str, value) -> None:
    """Type a value into an Int/FloatSlider's editable readout."""
    readout = page.locator(f"{css} .widget-readout")
    readout.click()
    page.keyboard.press("Control+A")
    page.keyboard.type(str(value))
    page.keyboard.press("Enter")


def type_text(page, css: str, value) -> None:
    """Replace the text of an IntText/FloatText and submit it (Enter)."""
    box = page.locator(f"{css} input")
    box.fill(str(value))
    box.press("Enter")


def select(page, css: str, label: str) -> None:
    page.locator(f"{css} select").select_option(label=label)


def open_tab(page, title: str) -> None:
    page.locator(".mlsys-tabs .lm-TabBar-tab", has_text=title).click()
