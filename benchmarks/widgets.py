"""Responsiveness of the dashboard: time from a control change to the updated figure, per tab.

(a) in-process: ``tab.set_state(change)`` in this Python process: calculator, redraw and the PNG
    the tab puts in its ``Image`` widget (what the front end receives); the baseline; (b) in the
    browser: Voilà + headless Chromium, from the key press on a slider to the
    new figure image in the page (kernel round trip + PNG transfer + decode).
Targets: (a) <= 100 ms median, (b) <= 300 ms median. Prints a table of medians and p90s and, with
``--record``, writes data/measured/widgets.md.

    .venv/bin/python benchmarks/widgets.py [--repeats 15] [--record]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from mlsys_nb.runtime.machine import summary as machine
from mlsys_nb.runtime.timing import Timer, median, quantile

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

# Per tab: two states to alternate between in-process, and the slider to move in the browser.
IN_PROCESS = {
    "memory": ({"tp": 2}, {"tp": 4}),
    "scaling": ({"compute": 1e23}, {"compute": 1e24}),
    "pipeline": ({"m": 8}, {"m": 16}),
}
IN_BROWSER = {
    "memory": ("Training memory", ".mlsys-memory-tp"),
    "scaling": ("Scaling laws", ".mlsys-scaling-compute-flops"),
    "pipeline": ("Pipeline schedules", ".mlsys-pipeline-micro-batches-m"),
}


def in_process(repeats: int, quick: bool = False) -> dict:
    """Seconds per change for each tab of ``IN_PROCESS``, in a full dashboard (``quick``: one holding
    only those tabs, to prove the path; its times are not the full dashboard's)."""
    from mlsys_nb.dashboard import TABS, Dashboard

    dash = Dashboard(tabs=[t for t in TABS if t.key in IN_PROCESS]) if quick else Dashboard()
    out = {}
    for key, (a, b) in IN_PROCESS.items():
        tab, t = dash.tabs[key], Timer()
        for i in range(repeats + 2):
            with t:
                tab.set_state(a if i % 2 else b)
                dash.refresh(key)
        out[key] = t.samples[2:]  # the first two are warm-up
    return out


def in_browser(repeats: int) -> dict:
    from browser import (
        browser_page,
        chromium_available,
        img_src,
        open_tab,
        press_slider,
        voila_server,
        wait_figure_change,
    )

    if not chromium_available():
        print("chromium not installed: skipping the browser column", file=sys.stderr)
        return {}
    out = {}
    with voila_server() as url, browser_page() as page:
        page.goto(url, timeout=120_000)
        page.wait_for_selector(".mlsys-panel-memory img", state="attached", timeout=120_000)
        for key, (title, css) in IN_BROWSER.items():
            if css is None:
                continue
            open_tab(page, title)
            page.wait_for_selector(f".mlsys-panel-{key} img", timeout=60_000)
            t = Timer()
            for i in range(repeats + 2):
                src = img_src(page, key)
                with t:
                    press_slider(page, css, "ArrowRight" if i % 2 == 0 else "ArrowLeft")
                    wait_figure_change(page, key, src)
            out[key] = t.samples[2:]  # the first two are warm-up
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--record", action="store_true", help="write data/measured/widgets.md")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="1 repeat in-process only, in a dashboard of the timed tabs (no browser), no record",
    )
    args = ap.parse_args()
    if args.repeats < 3:
        ap.error("--repeats must be >= 3")
    if args.quick:
        args.repeats, args.record = 1, False
    a, b = in_process(args.repeats, args.quick), ({} if args.quick else in_browser(args.repeats))
    lines = [
        "| tab | in-process median (ms) | in-process p90 (ms) | browser median (ms) | browser p90 (ms) "
        "| browser / in-process |",
        "|---|---|---|---|---|---|",
    ]
    for key in IN_PROCESS:
        ma, pa = median(a[key]) * 1e3, quantile(a[key], 0.9, method="nearest") * 1e3
        if key in b:
            mb, pb = median(b[key]) * 1e3, quantile(b[key], 0.9, method="nearest") * 1e3
            lines.append(f"| {key} | {ma:.1f} | {pa:.1f} | {mb:.1f} | {pb:.1f} | {mb / ma:.1f}x |")
        else:
            lines.append(f"| {key} | {ma:.1f} | {pa:.1f} | - | - | - |")
    table = "\n".join(lines)
    print(table)
    print("targets: in-process median <= 100 ms; browser median <= 300 ms")
    if args.record:
        text = (
            f"# Dashboard responsiveness (benchmarks/widgets.py)\n\n"
            f"Machine: {machine()}. {args.repeats} repeats "
            f"per tab after 2 warm-up changes.\n\n{table}\n"
        )
        out = ROOT / "data" / "measured" / "widgets.md"
        out.write_text(text)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
