"""Model cards for compressibility-trained drafters, written from the evaluation file the recipe produced."""

from __future__ import annotations

import json
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

TEMPLATE = """---
{{ card_data }}
---

# {{ model_name }}

A speculative-decoding **drafter** for `{{ target }}`, distilled to keep drafting well when its KV cache is
compressed with RIFT policies (rift-hf). Base model: `{{ base_model_name }}`.

## Use

```python
import rift_hf  # registers cache_implementation="rift"
from transformers import AutoModelForCausalLM

drafter = AutoModelForCausalLM.from_pretrained("{{ repo_id }}")
config = rift_hf.RiftConfig.from_pretrained("{{ repo_id }}")  # {{ recommended }}
out = target.generate(ids, assistant_model=drafter, do_sample=False, cache_implementation="rift", cache_config=config)
```

The recommended config sits in the folder's `rift_config.json`, which plain transformers ignores: the drafter loads
and drafts like any other model without rift-hf. Greedy output is always the target's own: compression only changes
how many drafted tokens are accepted.

## Results

Acceptance length (AL: tokens per target verification, bonus token included) on {{ n_eval }} held-out prompts
({{ eval_modules }}, {{ eval_tokens }} prompt tokens, {{ new_tokens }} new tokens, γ = {{ gamma }}), before and after
training; retention = AL / full-cache AL of the same drafter on the same prompt.

| drafter cache | AL before | AL after | retention before | retention after |
|---|---|---|---|---|
{{ table }}

Full-cache AL change: {{ full_change }} (the recipe's requirement: no drop of more than 1%).
{{ verdict }}

## Training

- Recipe: rift-hf compressibility distillation. Each step samples a prefill boundary (60-80% of the sequence), a
  budget (1/8-1/4 of the prefill) and a policy shape (rift-stat or swa; 25% of steps unmasked); the drafter sees,
  after the boundary, exactly the positions a compressed cache keeps (masks read off `RiftCache`), and is trained
  on KL(teacher || drafter) there.
- Teacher: {{ teacher }}.
- Trained parameters: attention projections only ({{ trainable }} parameters), fp32, learning rate
  {{ learning_rate }}, {{ steps }} steps of one {{ seq_tokens }}-token sequence ({{ tokens_seen }} tokens).
- Data: source of Python standard-library modules ({{ train_modules }}), disjoint from the evaluation modules.
- Compute: {{ machine }}, {{ train_minutes }} minutes of training ({{ total_minutes }} minutes with evaluation),
  {{ date }}.

## Intended use and limits

For drafting with a compressed cache inside `transformers` assisted generation with rift-hf. It is not meant
to be used on its own as a chat model. The training run is small (minutes on a CPU): treat its numbers as a
measurement of this run, not of the method's ceiling. Licence: that of the base model ({{ license }}).
"""


def _teacher(result: dict) -> str:
    if result.get("teacher_top_k"):  # eval.json files written before the target teacher existed have no key
        return f"the target `{result['teacher']}`, its top-{result['teacher_top_k']} log-probabilities per position"
    return "the drafter's own full-context logits from a frozen copy (self-distillation)"


def _row(name: str, before: dict, after: dict) -> str:
    return f"| {name} | {before['al']:.2f} | {after['al']:.2f} | {before['retention']:.3f} | {after['retention']:.3f} |"


def build_card(result: dict, model_name: str, target: str, license: str, base_model: str) -> ModelCard:
    before, after = result["before"], result["after"]
    eval_results = [
        EvalResult(
            task_type="text-generation",
            task_name="speculative decoding (drafter)",
            dataset_type="python-stdlib-source",
            dataset_name="held-out standard-library modules",
            metric_type="acceptance_length_retention",
            metric_name=f"AL retention, {name}",
            metric_value=round(after[name]["retention"], 4),
        )
        for name in after
        if name != "full"
    ] + [
        EvalResult(
            task_type="text-generation",
            task_name="speculative decoding (drafter)",
            dataset_type="python-stdlib-source",
            dataset_name="held-out standard-library modules",
            metric_type="acceptance_length",
            metric_name="AL, full cache",
            metric_value=round(after["full"]["al"], 4),
        )
    ]
    data = ModelCardData(
        model_name=model_name,
        base_model=base_model,
        **(
            {"license": "apache-2.0"}
            if license.lower().startswith("apache-2.0")
            else {"license": "other", "license_name": license.split(" (")[0].lower().replace(" ", "-")}
        ),
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=["speculative-decoding", "drafter", "kv-cache-compression", "rift-hf"],
        eval_results=eval_results,
    )
    full_change = after["full"]["al"] / before["full"]["al"] - 1
    compressed = [n for n in after if n != "full"]
    changes = ", ".join(f"{n} {after[n]['retention'] - before[n]['retention']:+.3f}" for n in compressed)
    improved = [n for n in compressed if after[n]["retention"] > before[n]["retention"]]
    verdict = f"Retention change: {changes}. " + (
        f"Retention improved for {', '.join(improved)}."
        if improved
        else "Training did not improve retention on these prompts."
    )
    if full_change < -0.01:
        verdict += " The full-cache AL fell by more than 1%: this run does not meet the recipe's requirement."
    return ModelCard.from_template(
        data,
        template_str=TEMPLATE,
        model_name=model_name,
        target=target,
        base_model_name=base_model,
        recommended=result["recommended_config"],
        repo_id=model_name,
        n_eval=len(result["eval_modules"]),
        eval_modules=", ".join(result["eval_modules"]),
        eval_tokens="-".join(str(t) for t in sorted({min(result["eval_tokens"]), max(result["eval_tokens"])})),
        new_tokens=result["new_tokens"],
        gamma=result["gamma"],
        table="\n".join(_row(name, before[name], after[name]) for name in after),
        full_change=f"{full_change:+.1%}",
        verdict=verdict,
        teacher=_teacher(result),
        trainable=f"{result['trainable_parameters']:,}",
        learning_rate=result["learning_rate"],
        steps=result["steps"],
        seq_tokens=result["seq_tokens"],
        tokens_seen=result["tokens_seen"],
        train_modules=", ".join(result["train_modules"]),
        machine=result["machine"],
        train_minutes=f"{result['train_seconds'] / 60:.1f}",
        total_minutes=f"{result['total_seconds'] / 60:.1f}",
        date=result["date"],
        license=license,
    )


def write_card(
    eval_json: Path, out_dirs: list[Path], model_name: str, target: str, license: str, base_model: str
) -> ModelCard:
    """Render the card from `eval.json` into each of `out_dirs` (the Hub-ready folder, `model_cards/<name>/`)."""
    result = json.loads(Path(eval_json).read_text())
    card = build_card(result, model_name, target, license, base_model)
    for folder in out_dirs:
        folder.mkdir(parents=True, exist_ok=True)
        card.save(folder / "README.md")
        (folder / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    return card
