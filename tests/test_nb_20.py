"""Notebook 20 under papermill: another seed and size with the worked solutions filled in and checked
(the defaults, seed 0 and n=3 with no answers, run under nbval)."""

import pytest
from nbrun import printed_text, run_notebook

TOPICS = 12


@pytest.mark.notebook
def test_notebook_20_solutions_pass_for_another_seed():
    seed = 7
    nb = run_notebook("20_interview_worksheets.ipynb", seed=seed, n=2, solutions=True)
    text = printed_text(nb)
    assert f"seed={seed}, n=2" in text
    assert text.count("check passed") == TOPICS + 2, text
    assert text.count("worksheet, 2/2 answered correctly") == TOPICS
    assert "not attempted" not in text


def test_stored_notebook_shows_no_answers():
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "notebooks" / "20_interview_worksheets.ipynb"
    nb = json.loads(path.read_text())
    for c in nb["cells"]:
        if c["cell_type"] == "code":
            assert not c.get("outputs"), "the stored notebook must have no outputs"
            src = "".join(c["source"])
            if "solution" in c["metadata"].get("tags", []):
                assert src.startswith("if solutions:") and c["metadata"]["jupyter"]["source_hidden"]
            elif src.startswith("# Try it yourself"):
                assert src.rstrip().endswith("[...] * n"), src
