"""The README's quick-start snippet runs as written, on tiny random models."""

import pathlib
import re

import rift_hf
from tiny import draft_target_pair, make_prompt

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_quickstart_snippet_runs():
    text = README.read_text()
    block = re.search(r"<!-- quickstart -->\s*```python\n(.*?)```", text, re.S)
    assert block, "README lost its quick-start block"
    target, draft = draft_target_pair("llama")
    namespace = {"rift_hf": rift_hf, "target": target, "draft": draft, "ids": make_prompt(80)}
    exec(block.group(1), namespace)
    stats = namespace["stats"]
    assert sum(r["accepted"] + 1 for r in stats.rounds) == namespace["out"].shape[1] - 80
    assert stats.budget == 20
