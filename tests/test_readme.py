"""The README's quick start runs verbatim, with only the model names swapped for tiny local models."""

import pathlib
import re
import time

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import rift_hf
from rift_hf.models import tiny_random_pair

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def _char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable ASCII character (and [UNK]), loadable with AutoTokenizer once saved."""
    vocab = {"[UNK]": 0, **{chr(c): i + 1 for i, c in enumerate(range(32, 127))}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]")


def _slow_target(module, _inputs):
    """A forward pre-hook that makes the tiny pair's target (3 layers; the drafter has 2) cost more than it does."""
    if module.__class__.__name__ == "LlamaForCausalLM" and module.config.num_hidden_layers == 3:
        time.sleep(0.02)


def test_quickstart_runs_verbatim(tmp_path, capsys):
    text = README.read_text()
    block = re.search(r"<!-- quickstart -->\s*```python\n(.*?)```", text, re.S)
    assert block, "README lost its quick-start block"
    code = block.group(1)
    target, draft, _ = tiny_random_pair()
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(tmp_path / name)
        _char_tokenizer().save_pretrained(tmp_path / name)
    names = re.findall(r'from_pretrained\("([^"]+)"\)', code)
    assert names == ["Qwen/Qwen2.5-Coder-1.5B-Instruct"] * 2 + ["Qwen/Qwen2.5-Coder-0.5B-Instruct"]
    code = code.replace(names[0], str(tmp_path / "target")).replace(names[2], str(tmp_path / "draft"))
    # Tiny random models at the block's ~12K character tokens and 512 new tokens take minutes and gain nothing (their
    # drafter costs what their target does, so the default rightly steps aside): a shorter module and answer here.
    assert code.count("json.decoder") == 2 and code.count('"max_new_tokens": 512') == 1
    code = code.replace("json.decoder", "json.scanner").replace('"max_new_tokens": 512', '"max_new_tokens": 64')
    namespace = {}
    # The real target is ~3x its drafter's size; tiny random models are alike in cost, and the default would let the
    # target decode alone (`stepped_aside`). A target forward made dearer stands in for the real pair's.
    handle = torch.nn.modules.module.register_module_forward_pre_hook(_slow_target)
    try:
        exec(compile(code, "README.md", "exec"), namespace)
    finally:
        handle.remove()
    stats, out, ids = namespace["stats"], namespace["out"], namespace["ids"]
    assert not stats.stepped_aside
    assert sum(r["accepted"] + 1 for r in stats.rounds) == out.shape[1] - ids.shape[1] == 64
    # A quarter of the prompt, rounded down to what the policy lays out (page-retrieval: whole pages).
    assert stats.budget == rift_hf.RiftConfig(policy=stats.policy, budget=0.25).resolve_budget(ids.shape[1])
    assert ids.shape[1] // 4 - 8 < stats.budget <= ids.shape[1] // 4
    # The target alone, timed beside rift in the block, and the same tokens.
    assert torch.equal(out, namespace["alone"])
    assert namespace["alone_s"] > 0 and namespace["rift_s"] > 0
    printed = capsys.readouterr().out
    assert f"AL {stats.acceptance_length:.2f}" in printed and "same tokens: True" in printed


def test_readme_fits_a_screen_or_two_and_its_links_resolve():
    text = README.read_text()
    assert len(text.encode()) < 15_000
    root = README.parent
    for page in [README, *sorted((root / "docs").glob("*.md"))]:
        for link in re.findall(r"\]\(([^)#]+)\)", page.read_text()):
            if not link.startswith("http"):
                assert (page.parent / link).exists(), f"{page.name}: broken link {link}"


def test_the_pipeline_form_in_the_readme_runs():
    from transformers import pipeline

    text = README.read_text()
    assert 'pipeline("text-generation", model=target, tokenizer=tokenizer,\nassistant_model=draft)' in text
    target, draft, _ = tiny_random_pair()
    pipe = pipeline("text-generation", model=target, tokenizer=_char_tokenizer(), assistant_model=draft)
    prompt = "def double(x):\n    return x * 2\n" * 4
    # A target far dearer than its drafter, as real ones are: on a loaded machine a target only ~20 ms dearer could
    # look not worth a drafter's prompt pass over 16 tokens, and the default would rightly step aside.
    handle = target.register_forward_pre_hook(lambda *_: time.sleep(0.1))
    try:
        out = pipe(prompt, max_new_tokens=16, cache_implementation="rift", do_sample=False)
    finally:
        handle.remove()
    assert out[0]["generated_text"].startswith(prompt)
    # the default policy (`auto`) as it resolved for this prompt
    assert rift_hf.last_stats(target).policy == rift_hf.RiftConfig().fitted(len(prompt)).policy == "page-round"


def test_the_first_screen_holds_what_install_and_the_quick_start():
    lines = README.read_text().splitlines()
    first = "\n".join(lines[:45])
    assert "pip install" in first and "<!-- quickstart -->" in first and "<!-- /quickstart -->" in first


def _slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_resolve_to_files_and_headings():
    root = README.parent
    pages = [README, *sorted((root / "docs").rglob("*.md"))]
    checked = 0
    for page in pages:
        for target, _, anchor in re.findall(r"\]\(([^)#\s]*)(#([^)\s]+))?\)", page.read_text()):
            if target.startswith(("http", "mailto:")) or (not target and not anchor):
                continue
            linked = page if not target else page.parent / target
            assert linked.exists(), f"{page.relative_to(root)}: no file {target}"
            if anchor:
                headings = re.findall(r"^#+ (.+)$", linked.read_text(), flags=re.M)
                assert anchor in {_slug(h) for h in headings}, f"{page.name}: no heading for {target}#{anchor}"
            checked += 1
    assert checked >= 20  # README, guide and the lab notebook's pages link to each other and to results files


def test_the_readme_speed_block_is_what_its_record_renders(monkeypatch):
    """The README's end-to-end speed block is regenerated by one command from one record
    (`python -m benchmarks.end_to_end table <record> --readme README.md`): its figures are the record's."""
    from benchmarks.end_to_end import readme_block

    text = README.read_text()
    start, end = "<!-- end-to-end:start -->\n", "<!-- end-to-end:end -->"
    assert start in text and end in text, "README lost its end-to-end block"
    block = text.split(start, 1)[1].split(end, 1)[0]
    record = re.search(r"<!-- record: (\S+) -->", block)
    assert record, "the block names no record"
    monkeypatch.chdir(README.parent)
    assert block == readme_block(pathlib.Path(record.group(1)))


def test_one_command_regenerates_every_readme_table(monkeypatch, tmp_path):
    """`make readme-tables` (`python -m benchmarks.readme_tables`) rewrites every result block of the README from the
    records it names: on a copy of the README it changes nothing, and a block edited by hand is put back."""
    from benchmarks.readme_tables import regenerate

    monkeypatch.chdir(README.parent)
    copy = tmp_path / "README.md"
    text = README.read_text()
    blocks = re.findall(r"<!-- ([a-z-]+):start -->", text)
    assert set(blocks) == {"end-to-end", "replay-regimes", "training-headline"}, "a README block no command renders"
    copy.write_text(text.replace("| page-retrieval ", "| page-retrieval-edited "))
    regenerate(copy)
    assert copy.read_text() == text
