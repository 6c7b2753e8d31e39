"""rift-hf push: a drafter folder is checked (files, plain load and drafting) before anything is uploaded."""

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rift_hf import RiftConfig
from rift_hf.cli import main
from rift_hf.hub import check_folder, push
from tiny import draft_target_pair


def _tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    vocab = {chr(33 + i): i for i in range(vocab_size - 1)} | {"<unk>": vocab_size - 1}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>")


def _folder(tmp_path):
    _, draft = draft_target_pair("llama")
    folder = tmp_path / "model"
    draft.save_pretrained(folder)
    _tokenizer(draft.config.vocab_size).save_pretrained(folder)
    RiftConfig(policy="page-retrieval", budget=0.25).save_pretrained(folder)
    (folder / "README.md").write_text("---\nlibrary_name: transformers\n---\n# drafter\n")
    return folder


def test_a_complete_folder_passes_the_dry_run_in_plain_transformers(tmp_path, capsys):
    folder = _folder(tmp_path)
    assert check_folder(folder) == []
    assert push(folder, "someone/drafter", dry_run=True) is None
    main(["push", str(folder), "someone/drafter", "--dry-run"])
    assert "ready to publish" in capsys.readouterr().out


def test_an_incomplete_folder_is_refused_naming_what_is_missing(tmp_path, capsys):
    folder = _folder(tmp_path)
    (folder / "rift_config.json").unlink()
    (folder / "README.md").unlink()
    with pytest.raises(ValueError, match="rift_config.json.*|README.md"):
        push(folder, "someone/drafter", dry_run=True)
    with pytest.raises(SystemExit) as exit_info:
        main(["push", str(folder), "someone/drafter", "--dry-run"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "README.md" in err and "rift_config.json" in err and "Traceback" not in err


def test_a_folder_with_a_selection_head_must_hold_the_file_its_config_names(tmp_path):
    from rift_hf import RiftConfig, SelectionHead

    folder = _folder(tmp_path)
    RiftConfig(policy="rift-stat", selection_head="selection_head.safetensors").save_pretrained(folder)
    assert any("selection head" in item for item in check_folder(folder))
    _, draft = draft_target_pair("llama")
    SelectionHead.for_model(draft.config).save(folder)
    assert check_folder(folder) == []
    assert RiftConfig.from_pretrained(folder).selection_head == str(folder / "selection_head.safetensors")
    # The head file is not the model's weights.
    for weights in folder.glob("model*.safetensors"):
        weights.unlink()
    assert any("weights" in item for item in check_folder(folder))


def test_a_head_only_folder_publishes_without_model_weights(tmp_path):
    from rift_hf import SelectionHead

    _, draft = draft_target_pair("llama")
    folder = tmp_path / "head"
    SelectionHead.for_model(draft.config).save(folder)
    RiftConfig(policy="rift-stat", selection_head="selection_head.safetensors").save_pretrained(folder)
    assert check_folder(folder) == ["README.md, the card (python -m lab card writes one for a trained head)"]
    (folder / "README.md").write_text("---\nlibrary_name: transformers\n---\n# head\n")
    assert check_folder(folder) == [] and push(folder, "someone/head", dry_run=True) is None


CUSTOM_GENERATE_RUN = """
import sys
# No installed rift_hf: the copy beside custom_generate/generate.py must do everything.
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable___rift")]
import importlib.util
assert importlib.util.find_spec("rift_hf") is None
import torch
from transformers import LlamaConfig, LlamaForCausalLM

def model(layers, seed):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaForCausalLM(config).eval()

target, draft = model(3, 0), model(2, 1)
draft.generation_config.num_assistant_tokens = 4
draft.generation_config.num_assistant_tokens_schedule = "constant"
ids = torch.randint(0, 96, (1, 120), generator=torch.Generator().manual_seed(3))
plain = target.generate(ids, max_new_tokens=16, do_sample=False)
config = {"policy": "page-round", "budget": 32, "window": 4, "block_size": 4}
out = target.generate(ids, assistant_model=draft, max_new_tokens=16, do_sample=False, custom_generate=sys.argv[1],
                      trust_remote_code=True, cache_config=config)
assert torch.equal(out, plain), "custom_generate changed the greedy output"
import rift_hf
assert rift_hf.__file__.startswith(sys.argv[1]), rift_hf.__file__
assert rift_hf.last_stats(target).policy == "page-round" and rift_hf.last_stats(target).rounds
print("ok")
"""


def test_custom_generate_folder_runs_rift_without_the_installed_package(tmp_path):
    import os
    import subprocess
    import sys

    from rift_hf.hub import write_custom_generate

    folder = tmp_path / "repo"
    written = write_custom_generate(folder)
    assert {p.name for p in written.iterdir()} == {"generate.py", "requirements.txt", "rift_hf"}
    assert (written / "rift_hf" / "kernels").is_dir()
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, "-c", CUSTOM_GENERATE_RUN, str(folder.resolve())],
        cwd=tmp_path,  # not the repository: its rift_hf/ must not be importable from here
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_push_can_add_the_custom_generate_folder(tmp_path, capsys):
    folder = _folder(tmp_path)
    main(["push", str(folder), "someone/drafter", "--dry-run", "--custom-generate"])
    printed = capsys.readouterr().out
    assert "ready to publish" in printed and "would write" in printed
    assert not (folder / "custom_generate").exists()  # a dry run writes nothing
    from rift_hf.hub import write_custom_generate

    write_custom_generate(folder, "someone/drafter")  # what the real push writes first
    assert 'SOURCE = "someone/drafter"' in (folder / "custom_generate" / "generate.py").read_text().replace("'", '"')
