"""A drafter folder that carries a RiftConfig loads and drafts in plain transformers, and drafts inside rift."""

import subprocess
import sys
import textwrap

import torch

import rift_hf
from rift_hf import RiftConfig
from tiny import draft_target_pair, make_prompt

CONFIG = {"policy": "rift-stat", "budget": 16, "window": 4, "step_aside": False}  # drafts even where it cannot pay


def _save(tmp_path):
    target, draft = draft_target_pair("llama")
    target.save_pretrained(tmp_path / "target")
    draft.save_pretrained(tmp_path / "drafter")  # as `python -m lab train` writes it: generation config untouched
    RiftConfig.from_dict(CONFIG).save_pretrained(tmp_path / "drafter")
    return target, draft


def test_the_folder_loads_and_drafts_without_rift_hf(tmp_path):
    _save(tmp_path)
    script = textwrap.dedent(
        f"""
        import sys
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig

        GenerationConfig.from_pretrained({str(tmp_path / "drafter")!r})
        target = AutoModelForCausalLM.from_pretrained({str(tmp_path / "target")!r})
        draft = AutoModelForCausalLM.from_pretrained({str(tmp_path / "drafter")!r})
        ids = torch.randint(3, 96, (1, 30), generator=torch.Generator().manual_seed(0))
        plain = target.generate(ids, max_new_tokens=12, do_sample=False)
        out = target.generate(ids, assistant_model=draft, max_new_tokens=12, do_sample=False)
        assert torch.equal(out, plain)
        assert "rift_hf" not in sys.modules
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")


def test_the_folder_drafts_inside_rift_with_its_own_config(tmp_path):
    target, draft = _save(tmp_path)
    ids = make_prompt(40, seed=2)
    config = RiftConfig.from_pretrained(tmp_path / "drafter")
    assert config == RiftConfig.from_dict(CONFIG)
    out = target.generate(
        ids, assistant_model=draft, max_new_tokens=16, do_sample=False, cache_implementation="rift", cache_config=config
    )
    assert torch.equal(out, target.generate(ids, max_new_tokens=16, do_sample=False))
    assert rift_hf.last_stats(target).budget == 16


def test_a_drafter_whose_generation_config_asks_for_rift_drafts_in_a_plain_assisted_loop():
    target, draft = draft_target_pair("llama")
    draft.generation_config.cache_implementation = "rift"
    draft.generation_config.cache_config = CONFIG
    try:
        ids = make_prompt(40, seed=3)
        out = target.generate(ids, assistant_model=draft, max_new_tokens=16, do_sample=False)
        assert torch.equal(out, target.generate(ids, max_new_tokens=16, do_sample=False))
        # ... and inside rift as well
        out = target.generate(
            ids, assistant_model=draft, max_new_tokens=16, do_sample=False, cache_implementation="rift"
        )
        assert torch.equal(out, target.generate(ids, max_new_tokens=16, do_sample=False))
    finally:
        draft.generation_config.cache_implementation = None
        draft.generation_config.cache_config = None


def test_missing_config_file_names_the_fix(tmp_path):
    import pytest

    with pytest.raises(FileNotFoundError, match="save_pretrained"):
        RiftConfig.from_pretrained(tmp_path)
