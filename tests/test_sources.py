"""Sources a learner can open, and the notebook conventions that make exercises checkable.

- No tracked file cites a file the repository does not contain: markdown links (in ``.md`` files and
  notebook markdown cells) must resolve, with their ``#anchor`` when they point to a markdown file,
  and every bare ``something.md/.py/.ipynb/.yaml`` path in any tracked text file must name a tracked
  file (by its path from the repository root, from the citing file's folder, or as the tail of a
  tracked path, e.g. ``pipeline/simulate.py``). Files of *other* repositories are allowed only when
  listed in ``EXTERNAL`` with the repository they live in.
- Every notebook is stored without outputs, has one ``parameters`` cell with ``solutions = False``,
  and every exercise solution cell is tagged ``solution``, stored collapsed and runs only
  ``if solutions:``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SELF = "tests/test_sources.py"  # holds deliberately wrong citations to show the check catches them

# Files that live in other repositories (cited with that repository named next to them).
EXTERNAL = {
    "PERFORMANCE.md": "NVIDIA/nccl-tests (doc/PERFORMANCE.md)",
    "doc/PERFORMANCE.md": "NVIDIA/nccl-tests",
    "dualpipe.py": "deepseek-ai/DualPipe",
    "dualpipe/dualpipe.py": "deepseek-ai/DualPipe",
    "dualpipe/dualpipev.py": "deepseek-ai/DualPipe",
    "torch/distributed/pipelining/schedules.py": "pytorch/pytorch",
    "c10d_logger.py": "pytorch/pytorch (a frame name filtered out of tracebacks)",
    "data_analysis.ipynb": "epoch-research/analyzing-chinchilla",
    "out.ipynb": "the output file of a papermill command line in the README",
    "block_manager.py": "GeeeekExplorer/nano-vllm (nanovllm/engine/block_manager.py)",
    "transformer_engine/pytorch/quantization.py": "NVIDIA/TransformerEngine (quantized_model_init's docstring)",
    "torch/_inductor/codegen/cpp_flex_attention_template.py": "pytorch/pytorch (the CPU flex-decoding kernel)",
}
# folders of other repositories, cited by path under them (no such folder is tracked here)
EXTERNAL_TREES = {
    "vllm/": "vllm-project/vllm (the inference front page maps the engine's files to vLLM v1's)",
}

_PATH = re.compile(r"(?<![\w/.\-])((?:[\w\-]+/)*[\w\-]+\.(?:md|py|ipynb|ya?ml))(#[\w\-]+)?(?![\w\-])")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
_TMP_JOIN = re.compile(r"/\s*$")  # ``tmp_path / "x.py"``: a file the test creates, not a citation


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if (ROOT / f).is_file()]


def _texts(rel: str) -> list[tuple[str, str]]:
    """(kind, text) pieces of a tracked file: notebooks per cell, other text files whole."""
    path = ROOT / rel
    try:
        raw = path.read_text()
    except UnicodeDecodeError:
        return []
    if rel.endswith(".ipynb"):
        return [(c["cell_type"], "".join(c["source"])) for c in json.loads(raw)["cells"]]
    return [("markdown" if rel.endswith(".md") else "text", raw)]


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(rel: str) -> set[str]:
    text = (ROOT / rel).read_text()
    ids = set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))
    ids |= {slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}
    return ids


def _resolve(target: str, src: str, tracked: set[str]) -> str | None:
    """The tracked file a bare path in ``src`` names (from the root, from src's folder, or as the
    tail of exactly one tracked path), or None."""
    for c in (target, os.path.normpath(os.path.join(os.path.dirname(src), target))):
        if c in tracked:
            return c
    tails = [f for f in tracked if f.endswith("/" + target)]
    return tails[0] if tails else None


def missing_citations(files: list[str] | None = None, tracked: set[str] | None = None) -> list[str]:
    tracked_list = _tracked()
    tracked = tracked if tracked is not None else set(tracked_list)
    problems = []
    for rel in files if files is not None else [f for f in tracked_list if f != SELF]:
        for kind, text in _texts(rel):
            if kind == "markdown":
                for m in _LINK.finditer(text):
                    target = m.group(1)
                    if re.match(r"[a-z]+:", target) or target.startswith("#"):
                        continue
                    file_part, _, anchor = target.partition("#")
                    hit = os.path.normpath(os.path.join(os.path.dirname(rel), file_part))
                    if hit not in tracked:
                        if any(f.startswith(hit + "/") for f in tracked):
                            continue  # a link to a folder of the repository
                        hit = None
                    if hit is None:
                        problems.append(f"{rel}: link to missing file {target!r}")
                    elif anchor and hit.endswith(".md") and anchor not in anchors(hit):
                        problems.append(f"{rel}: link to missing anchor {target!r}")
            for m in _PATH.finditer(text):
                path, anchor = m.group(1), (m.group(2) or "")[1:]
                if path in EXTERNAL or "NN" in path or path.startswith(tuple(EXTERNAL_TREES)):
                    continue
                if _TMP_JOIN.search(text[max(0, m.start() - 12) : m.start() - 1]):
                    continue
                hit = _resolve(path, rel, tracked)
                if hit is None:
                    problems.append(f"{rel}: cites {path!r}, which the repository does not contain")
                elif anchor and hit.endswith(".md") and anchor not in anchors(hit):
                    problems.append(f"{rel}: cites missing anchor {path}#{anchor}")
    return problems


def test_no_tracked_file_cites_a_missing_file():
    problems = missing_citations()
    assert not problems, "citations of files/anchors the repository does not contain:\n" + "\n".join(problems)


def test_the_citation_check_catches_what_it_should(tmp_path, monkeypatch):
    """The check fails on a cited file outside the repo, a dead link and a dead anchor, and passes on
    the kit's own files, a sibling-relative link, a path tail and an allowed external file."""
    probe = ROOT / "docs" / "_probe_citations.md"
    good = (
        "see [refs](references.md#zero), ../notebooks/00_dashboard.ipynb, `pipeline/simulate.py`,\n"
        "docs/references.md#chinchilla and nccl-tests' doc/PERFORMANCE.md\n"
    )
    bad = "see no_such_notes.md §2.3, [x](../notebooks/09_experts.ipynb) and docs/references.md#no-such-anchor\n"
    tracked = set(_tracked()) | {"docs/_probe_citations.md"}
    try:
        probe.write_text(good)
        assert missing_citations(["docs/_probe_citations.md"], tracked) == []
        probe.write_text(bad)
        found = missing_citations(["docs/_probe_citations.md"], tracked)
    finally:
        probe.unlink()
    assert len(found) == 3, found
    assert any("no_such_notes.md" in p for p in found) and any("09_experts" in p for p in found)
    assert any("no-such-anchor" in p for p in found)


_NB_MENTION = re.compile(r"\b[Nn]otebooks? (\d\d[a-z]?)\b((?:(?:,| and|,? or| to|–|-) ?\d\d[a-z]?\b)*)")


def notebook_mentions_missing(files: list[str] | None = None) -> list[str]:
    """'notebook NN' (and 'notebooks NN and MM') naming a notebook that does not exist yet."""
    have = {p.name.split("_", 1)[0] for p in (ROOT / "notebooks").glob("*.ipynb")}
    problems = []
    for rel in files if files is not None else [f for f in _tracked() if f != SELF]:
        for _, text in _texts(rel):
            for m in _NB_MENTION.finditer(text):
                for nn in [m.group(1), *re.findall(r"\d\d[a-z]?", m.group(2))]:
                    if nn not in have:
                        problems.append(f"{rel}: mentions notebook {nn}, which does not exist (yet)")
    return problems


def test_no_file_points_to_a_notebook_that_does_not_exist():
    problems = notebook_mentions_missing()
    assert not problems, "\n".join(problems)


def test_the_notebook_mention_check_catches_a_missing_one(tmp_path):
    probe = ROOT / "docs" / "_probe_mentions.md"
    try:
        probe.write_text("Notebook 03 and notebooks 05 and 99 come next; notebook 98 too, and notebook 05x.\n")
        found = notebook_mentions_missing(["docs/_probe_mentions.md"])
    finally:
        probe.unlink()
    assert sorted(found) == sorted(
        f"docs/_probe_mentions.md: mentions notebook {n}, which does not exist (yet)" for n in ("99", "98", "05x")
    ), found


def test_references_anchors_are_unique():
    text = (ROOT / "docs" / "references.md").read_text()
    ids = re.findall(r"<a id=\"([^\"]+)\"", text)
    assert len(ids) == len(set(ids)) and len(ids) > 40, sorted(i for i in ids if ids.count(i) > 1)


NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def solution_problems(nb: dict, name: str) -> list[str]:
    """Convention checks for one notebook (JSON dict): clean, parameters with solutions = False,
    solution cells tagged, collapsed and guarded by ``if solutions:``."""
    problems = []
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    if any(c.get("outputs") or c.get("execution_count") for c in code):
        problems.append(f"{name}: stored with outputs or execution counts")
    params = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(params) != 1:
        problems.append(f"{name}: needs exactly one cell tagged 'parameters'")
    elif not re.search(r"^solutions\s*=\s*False\b", "".join(params[0]["source"]), flags=re.M):
        problems.append(f"{name}: the parameters cell lacks 'solutions = False'")
    for i, c in enumerate(nb["cells"]):
        tags = c.get("metadata", {}).get("tags", [])
        src = "".join(c["source"])
        if "solution" in tags:
            if c["cell_type"] != "code" or not re.match(r"(#[^\n]*\n)*if solutions:", src):
                problems.append(f"{name}: solution cell {i} must be code starting with 'if solutions:'")
            if not c.get("metadata", {}).get("jupyter", {}).get("source_hidden"):
                problems.append(f"{name}: solution cell {i} is not stored collapsed (jupyter.source_hidden)")

            def cell(j):
                return "".join(nb["cells"][j]["source"]) if 0 <= j < len(nb["cells"]) else ""

            if "..." not in cell(i - 1) + cell(i - 2):
                problems.append(f"{name}: no stub with '...' just before solution cell {i}")
            if _is_check(cell(i + 1)):
                pass  # stub, solution, check: the check runs on the solution when solutions=True
            elif _is_check(cell(i - 1)):
                # stub, check, solution: the solution must call the check again, or it is never exercised
                checks = re.findall(r"^def (\w+)\(", cell(i - 1), flags=re.M)
                if not any(re.search(rf"\b{f}\(", src) for f in checks):
                    problems.append(f"{name}: solution cell {i} follows its check but does not run it again")
            else:
                problems.append(
                    f"{name}: no check next to solution cell {i} (it prints 'not attempted' on a "
                    "stub, else asserts and calls passed(...), which prints 'check passed: ...')"
                )
    return problems


def _is_check(text: str) -> bool:
    # "not attempted" is printed by mlsys_nb.exercises.exercise(...) (or, in older cells, by the cell itself)
    # its pass: passed("...") (mlsys_nb.runtime.notebook: prints "check passed: ..." and records it)
    passes = "check passed" in text or re.search(r"\bpassed\(", text) is not None
    return ("not attempted" in text or "exercise(" in text) and passes


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_conventions(nb):
    problems = solution_problems(json.loads(nb.read_text()), nb.name)
    assert not problems, "\n".join(problems)


def test_notebook_convention_check_catches_violations():
    nb = json.loads(NOTEBOOKS[1].read_text())
    assert solution_problems(nb, "x") == []
    bad = json.loads(json.dumps(nb))
    p = next(c for c in bad["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    p["source"] = "".join(p["source"]).replace("solutions = False", "solutions = True")
    bad["cells"][-1] = {
        "cell_type": "code",
        "metadata": {"tags": ["solution"]},
        "source": "print(1)",
        "outputs": [],
        "execution_count": 3,
    }
    found = solution_problems(bad, "x")
    assert any("solutions = False" in f for f in found)
    assert any("no check next to solution cell" in f or "does not run it again" in f for f in found)
    assert any("if solutions:" in f for f in found) and any("collapsed" in f for f in found)
    assert any("outputs" in f for f in found)
