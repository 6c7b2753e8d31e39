import json

import pytest
from huggingface_hub import ModelCard

from rift_hf.training.card import write_card


def _entry(al, retention, lo, hi, prompts=2):
    return {"al": al, "retention": retention, "retention_min": lo, "retention_max": hi, "prompts": prompts}


def _side(full_al, repeat, cont):
    return {
        "full": {
            **_entry(full_al, 1.0, 1.0, 1.0, 4),
            "by_task": {"continue": _entry(full_al, 1.0, 1.0, 1.0), "repeat": _entry(full_al, 1.0, 1.0, 1.0)},
        },
        "rift-stat 4x": {
            **_entry(2.5, (repeat + cont) / 2, 0.4, 0.9, 4),
            "by_task": {"continue": _entry(3.0, cont, 0.7, 0.9), "repeat": _entry(2.0, repeat, 0.4, 0.6)},
        },
    }


RESULT = {
    "base_model": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "teacher": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
    "teacher_top_k": 64,
    "policy": "rift-stat",
    "compressions": [4.0],
    "steps": 3,
    "sequences": 2,
    "seq_tokens": 64,
    "tokens_seen": 192,
    "prompt_tokens": 48,
    "answer_tokens": 16,
    "unmasked_rate": 0.25,
    "trainable_parameters": 1000,
    "learning_rate": 2e-5,
    "train_seconds": 60.0,
    "total_seconds": 120.0,
    "train_modules": ["pathlib"],
    "proxy_modules": ["optparse"],
    "eval": {"method": "replay", "input_tokens": 4096, "new_tokens": 512, "per_task": 2, "gamma": 11, "window": 64},
    "gamma": 11,
    "window": 64,
    "recommended_config": {"policy": "rift-stat", "budget": 0.25, "window": 64},
    "machine": "cpu",
    "date": "2026-11-30",
    "proxy_before": {
        "full": {"agreement": 0.8, "retention": 1.0},
        "rift-stat 4x": {"agreement": 0.6, "retention": 0.75},
    },
    "proxy_after": {
        "full": {"agreement": 0.8, "retention": 1.0},
        "rift-stat 4x": {"agreement": 0.64, "retention": 0.8},
    },
    "before": _side(5.0, 0.5, 0.8),
    "after": _side(4.9, 0.56, 0.82),
}


def _write(tmp_path, result):
    (tmp_path / "eval.json").write_text(json.dumps(result))
    args = ("drafter-x", "qwen-1.5b", "Apache-2.0", "Qwen/Qwen2.5-Coder-0.5B-Instruct")
    write_card(tmp_path / "eval.json", [tmp_path / "hub", tmp_path / "cards"], *args)
    return (tmp_path / "cards" / "README.md").read_text()


def test_card_renders_per_regime_results_the_verdict_and_valid_metadata(tmp_path):
    text = _write(tmp_path, RESULT)
    assert "| rift-stat 4x | repeat | 2.00 | 2.00 | 0.500 (0.40-0.60) | 0.560 (0.40-0.60) |" in text
    assert "| rift-stat 4x | continue | 3.00 | 3.00 | 0.800 (0.70-0.90) | 0.820 (0.70-0.90) |" in text
    assert "Full-cache AL change: -2.0%" in text
    # continue gained only 0.02 and the full-cache AL fell by 2%: the goal is not met, and the card says so.
    assert "is **not met**: retention change continue +0.020, repeat +0.060; full-cache AL -2.0%" in text
    assert "| rift-stat 4x | 0.600 | 0.640 | 0.750 | 0.800 |" in text
    card = ModelCard.load(tmp_path / "hub" / "README.md")
    results = {r.metric_name: r.metric_value for r in card.data.eval_results}
    assert results == {"AL retention, rift-stat 4x": 0.69, "AL, full cache": 4.9}
    assert card.data.base_model == RESULT["base_model"] and "speculative-decoding" in card.data.tags


def test_card_says_met_only_when_every_regime_gains_enough(tmp_path):
    result = {**RESULT, "after": _side(5.0, 0.56, 0.86)}
    assert "is met: continue +0.060, repeat +0.060." in _write(tmp_path, result)


def test_card_refuses_an_eval_without_replay(tmp_path):
    with pytest.raises(ValueError, match="rerun"):
        _write(tmp_path, {**RESULT, "after": None})


def test_headline_is_one_line_with_the_trained_policy_and_the_verdict():
    from rift_hf.training.card import headline

    line = headline(RESULT, "drafter-x")
    assert line == (
        "`drafter-x` (4 prompts, replay): rift-stat 4x retention continue 0.80 → 0.82, repeat 0.50 → 0.56; "
        "full-cache AL -2.0%; goal not met."
    )


HEAD_RESULT = {
    "kind": "selection-head",
    "base_model": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "policy": "rift-stat",
    "compressions": [4.0],
    "parameters": 21504,
    "epochs": 8,
    "learning_rate": 0.03,
    "sequences": 2,
    "prompt_tokens": 48,
    "answer_tokens": 16,
    "train_modules": ["pathlib"],
    "proxy_modules": ["optparse"],
    "loss_per_epoch": [0.9, 0.8],
    "recall_before": {"4x": {"repeat": 0.6, "continue": 0.7}},
    "recall_after": {"4x": {"repeat": 0.65, "continue": 0.7}},
    "examples_seconds": 600.0,
    "fit_seconds": 120.0,
    "eval": {"method": "replay", "input_tokens": 4096, "new_tokens": 512, "per_task": 2, "gamma": 11, "window": 64},
    "window": 64,
    "recommended_config": {"policy": "rift-stat", "budget": 0.25, "selection_head": "selection_head.safetensors"},
    "machine": "cpu",
    "date": "2026-12-01",
    "before": _side(5.0, 0.5, 0.8),
    "after": _side(5.0, 0.56, 0.86),
}


def test_head_card_says_the_drafter_is_untouched_and_reports_recall_and_the_verdict(tmp_path):
    text = _write(tmp_path, HEAD_RESULT)
    assert "selection head" in text and "21,504 parameters" in text
    assert "| rift-stat 4x | repeat | 2.00 | 2.00 | 0.500 (0.40-0.60) | 0.560 (0.40-0.60) |" in text
    assert "| 4x | repeat | 0.600 | 0.650 |" in text
    assert "is met: continue +0.060, repeat +0.060." in text
    assert "Loss per epoch: 0.900, 0.800." in text and "10.0 minutes for the forwards" in text
    assert "not recorded" in _write(tmp_path, {**HEAD_RESULT, "examples_seconds": None})
    # The README block reads the card between its Results and Training headings.
    assert text.index("## Results") < text.index("## Training")
    short = {**HEAD_RESULT, "after": _side(5.0, 0.52, 0.9)}
    assert "is **not met**: retention change continue +0.100, repeat +0.020; full-cache AL +0.0%" in _write(
        tmp_path, short
    )


def _snippet(text: str) -> str:
    return text.split("## Use", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("result", [RESULT, HEAD_RESULT], ids=["distilled", "head"])
def test_card_usage_runs_as_written_and_metadata_follows_hub_conventions(tmp_path, result):
    """The snippet defines every name it uses (ruff's undefined-name check) and loads from the given repository; the
    card carries the relation to its base model, languages and a citation."""
    import subprocess
    import sys

    (tmp_path / "eval.json").write_text(json.dumps(result))
    args = ("drafter-x", "Qwen/Qwen2.5-Coder-1.5B-Instruct", "Apache-2.0", "Qwen/Qwen2.5-Coder-0.5B-Instruct")
    write_card(tmp_path / "eval.json", [tmp_path / "hub"], *args, repo_id="me/drafter-x")
    text = (tmp_path / "hub" / "README.md").read_text()
    code = _snippet(text)
    (tmp_path / "snippet.py").write_text(code)
    check = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F", str(tmp_path / "snippet.py")],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout
    assert 'RiftConfig.from_pretrained("me/drafter-x")' in code and "YOUR_NAMESPACE" not in text
    head = result.get("kind") == "selection-head"
    drafter = "Qwen/Qwen2.5-Coder-0.5B-Instruct" if head else "me/drafter-x"  # a head's repository holds no weights
    assert f'drafter = AutoModelForCausalLM.from_pretrained("{drafter}")' in code
    card = ModelCard.load(tmp_path / "hub" / "README.md")
    # A head's repository holds a head file and a rift config, no weights: rift-hf reads it, not transformers alone.
    assert getattr(card.data, "base_model_relation", None) == (None if head else "finetune")
    assert card.data.library_name == ("rift-hf" if head else "transformers")
    assert card.data.language == ["code", "en"]
    assert "## Citation" in text and "@misc{rift2026" in text and "author = {{NVIDIA}}," in text
    write_card(tmp_path / "eval.json", [tmp_path / "placeholder"], *args)  # no repository given: a named placeholder
    assert "YOUR_NAMESPACE/drafter-x" in (tmp_path / "placeholder" / "README.md").read_text()
