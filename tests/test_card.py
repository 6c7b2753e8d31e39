from huggingface_hub import ModelCard

from rift_hf.training.card import write_card

RESULT = {
    "base_model": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "steps": 3,
    "seq_tokens": 64,
    "tokens_seen": 192,
    "trainable_parameters": 1000,
    "learning_rate": 2e-5,
    "train_seconds": 60.0,
    "total_seconds": 120.0,
    "train_modules": ["pathlib"],
    "eval_modules": ["continue:argparse", "continue:textwrap"],
    "eval_tokens": [700, 710],
    "new_tokens": 48,
    "gamma": 11,
    "recommended_config": {"policy": "rift-stat", "budget": 0.25, "window": 32},
    "machine": "cpu",
    "date": "2026-11-29",
    "before": {"full": {"al": 5.0, "retention": 1.0}, "rift-stat 4x": {"al": 2.5, "retention": 0.5}},
    "after": {"full": {"al": 4.9, "retention": 1.0}, "rift-stat 4x": {"al": 3.0, "retention": 0.6}},
}


def test_card_renders_with_results_and_valid_metadata(tmp_path):
    import json

    (tmp_path / "eval.json").write_text(json.dumps(RESULT))
    write_card(
        tmp_path / "eval.json",
        [tmp_path / "hub", tmp_path / "cards"],
        "drafter-x",
        "qwen-1.5b",
        "Apache-2.0",
        "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    )
    text = (tmp_path / "cards" / "README.md").read_text()
    assert "| rift-stat 4x | 2.50 | 3.00 | 0.500 | 0.600 |" in text
    assert "Full-cache AL change: -2.0%" in text and "does not meet" in text
    assert "Retention change: rift-stat 4x +0.100. Retention improved for rift-stat 4x." in text
    card = ModelCard.load(tmp_path / "hub" / "README.md")
    results = {r.metric_name: r.metric_value for r in card.data.eval_results}
    assert results == {"AL retention, rift-stat 4x": 0.6, "AL, full cache": 4.9}
    assert card.data.base_model == RESULT["base_model"] and "speculative-decoding" in card.data.tags
