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
