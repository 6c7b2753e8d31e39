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

{{ use }}

The recommended config sits in the folder's `rift_config.json`, which plain transformers ignores: the drafter loads
and drafts like any other model without rift-hf. Greedy output is always the target's own: compression only changes
how many drafted tokens are accepted.

## Results

Acceptance length (AL: tokens per target verification, bonus token included) by exact replay (the target's cached
greedy output; same AL as real assisted generation) on {{ n_eval }} held-out prompts ({{ per_task }} per regime:
`repeat` copies text from the prompt, `continue` writes new code; ~{{ eval_tokens }} prompt tokens from
standard-library modules not used in training, {{ new_tokens }} new tokens, γ = {{ gamma }}, drafter fp32), before
and after training. Retention = AL / the same drafter's full-cache AL on the same prompt, mean over prompts, with
the per-prompt range.

| drafter cache | regime | AL before | AL after | retention before | retention after |
|---|---|---|---|---|---|
{{ table }}

Full-cache AL change: {{ full_change }}.
{{ verdict }}

Proxy used for the hyper-parameter look (teacher-forced: share of answer positions where the drafter's argmax
equals the target's, {{ proxy_n }} sequences from {{ proxy_modules }}):

| drafter cache | agreement before | agreement after | proxy retention before | proxy retention after |
|---|---|---|---|---|
{{ proxy_table }}

## Training

- Recipe: rift-hf compressibility distillation. Each sequence is a `repeat` or `continue` chat prompt
  ({{ prompt_tokens }} source tokens) followed by {{ answer_tokens }} tokens of its known answer. Each step samples a
  budget ({{ budgets }} of the prompt) for `{{ policy }}`, or an unmasked step ({{ unmasked }} of steps); after the
  prompt the drafter sees exactly the positions the compressed cache keeps (masks read off `RiftCache`) and is
  trained on KL(teacher || drafter) there.{{ alignment }}
- Teacher: {{ teacher }}.
- Trained parameters: attention projections only ({{ trainable }} parameters), fp32, AdamW, constant learning rate
  {{ learning_rate }}, {{ steps }} steps of one ~{{ seq_tokens }}-token sequence ({{ tokens_seen }} tokens,
  {{ sequences }} distinct sequences).
- Data: source of Python standard-library modules ({{ train_modules }}), disjoint from the evaluation and proxy
  modules.
- Compute: {{ machine }}, {{ train_minutes }} minutes of training ({{ total_minutes }} minutes with evaluation),
  {{ date }}.

## Intended use and limits

For drafting with a compressed cache inside `transformers` assisted generation with rift-hf. It is not meant
to be used on its own as a chat model. The training run is small (a CPU, about an hour): treat its numbers as a
measurement of this run, not of the method's ceiling. Licence: that of the base model ({{ license }}).

{{ citation }}
"""


HEAD_TEMPLATE = """---
{{ card_data }}
---

# {{ model_name }}

A **selection head** for the speculative-decoding drafter `{{ base_model_name }}` (unchanged) of `{{ target }}`: a
small file (`selection_head.safetensors`, {{ parameters }} parameters) that rift-hf's `{{ policy }}` policy
scores the drafter's queries through when it chooses which prompt tokens to keep in the compressed KV cache. The head
re-weights each rotary frequency pair of each query head by a learnt complex factor (it commutes with the rotary
embedding); it is read only by the scorer, so the drafter's own attention and its full-cache output are untouched.

## Use

{{ use }}

This repository holds only the head and `rift_config.json` (which names it by a path relative to the repository):
the drafter is `{{ base_model_name }}` itself, loaded from its own repository. Greedy output is always the
target's own.

## Results

Acceptance length (AL: tokens per target verification, bonus token included) by exact replay (the target's cached
greedy output; same AL as real assisted generation) on {{ n_eval }} held-out prompts ({{ per_task }} per regime:
`repeat` copies text from the prompt, `continue` writes new code; ~{{ eval_tokens }} prompt tokens from
standard-library modules not used in training, {{ new_tokens }} new tokens, γ = {{ gamma }}, drafter fp32), without
("before") and with ("after") the head. Retention = AL / the drafter's full-cache AL on the same prompt, mean over
prompts, with the per-prompt range. The full-cache rows are the same rows both ways: the head does not act there.

| drafter cache | regime | AL before | AL after | retention before | retention after |
|---|---|---|---|---|---|
{{ table }}

{{ verdict }}

Proxy used to choose the fit (selection recall: the share of the answer's full-cache attention on the prompt
positions a selection of the budget's size keeps at each example's point, {{ proxy_n }} sequences from
{{ proxy_modules }}):

| compression | regime | recall without head | recall with head |
|---|---|---|---|
{{ proxy_table }}

## Training

- Data: {{ sequences }} `repeat` and `continue` chat prompts ({{ prompt_tokens }} source tokens of Python
  standard-library modules: {{ train_modules }}; disjoint from the evaluation and proxy modules), each followed by
  {{ answer_tokens }} tokens of its known answer. One full-cache forward of the drafter per sequence records, per
  attention layer and selection point ({{ points }}; {{ examples }} examples), the {{ window }} queries before the
  point, the keys before it, and the share of the later tokens' attention on each evictable position.
- Fit: per layer and KV head, KL(answer's attention || the window's pooled SnapKV scores through the head) over the
  evictable positions; Adam, learning rate {{ learning_rate }} with cosine decay, {{ epochs }} epochs of one sequence
  per step. Loss per epoch: {{ losses }}.
- Compute: {{ machine }}, {{ forwards }}, {{ fit_minutes }} minutes to fit,
  {{ date }}.

## Intended use and limits

For drafting with a compressed cache inside `transformers` assisted generation with rift-hf, with `{{ policy }}`
or another policy that scores with its recent queries. The head was fitted on {{ prompt_tokens }}-token prompts and
evaluated at ~{{ eval_tokens }}; treat its numbers as a measurement of this run. Licence: that of the base model
({{ license }}).

{{ citation }}
"""


# Passed as a value, not written into the templates: Jinja would read BibTeX's `{{NVIDIA}}` as a variable.
CITATION = """## Citation

The method is RIFT (NVIDIA, 2026); this drafter was trained and evaluated with rift-hf.

```bibtex
@misc{rift2026,
  title  = {RIFT: KV Cache Compression for Draft Models with Complementary Compressibility Training},
  author = {{NVIDIA}},
  year   = {2026},
  note   = {arXiv preprint, October 2026}
}
```"""

PLACEHOLDER_NAMESPACE = "YOUR_NAMESPACE"


def _use(result: dict, repo_id: str, target: str, base_model: str) -> str:
    """The card's usage snippet: runnable as it stands (every name defined), the drafter from this repository (or,
    for a selection head, from its base model's), the config from this repository."""
    head = result.get("kind") == "selection-head"
    lines = [
        "```python",
        'import rift_hf  # registers cache_implementation="rift"',
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f'tokenizer = AutoTokenizer.from_pretrained("{target}")',
        f'target = AutoModelForCausalLM.from_pretrained("{target}")',
        f'drafter = AutoModelForCausalLM.from_pretrained("{base_model if head else repo_id}")',
        f'config = rift_hf.RiftConfig.from_pretrained("{repo_id}")  # {result["recommended_config"]}',
        "",
        'messages = [{"role": "user", "content": "Write a Python function that merges overlapping intervals."}]',
        "inputs = tokenizer.apply_chat_template(",
        '    messages, add_generation_prompt=True, return_tensors="pt", return_dict=True',
        ")",
        "out = target.generate(",
        "    **inputs,",
        "    assistant_model=drafter,",
        "    max_new_tokens=256,",
        "    do_sample=False,",
        '    cache_implementation="rift",',
        "    cache_config=config,",
        ")",
        'print(tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))',
        "```",
    ]
    if repo_id.startswith(PLACEHOLDER_NAMESPACE + "/"):
        lines.append(
            f"\n(`{PLACEHOLDER_NAMESPACE}`: the namespace this folder was pushed to; `python -m lab card --repo-id` "
            "writes it in.)"
        )
    return "\n".join(lines)


def _teacher(result: dict) -> str:
    if result.get("teacher_top_k"):  # eval.json files written before the target teacher existed have no key
        return f"the target `{result['teacher']}`, its top-{result['teacher_top_k']} log-probabilities per position"
    return "the drafter's own full-context logits from a frozen copy (self-distillation)"


TARGET_GAIN = 0.05  # the recipe's goal: retention at the smallest compression up by this much on every regime
FULL_DROP = 0.01  # ... with the full-cache AL not lower by more than this share


def _rows(before: dict, after: dict) -> list[str]:
    def cell(entry: dict) -> str:
        return f"{entry['retention']:.3f} ({entry['retention_min']:.2f}-{entry['retention_max']:.2f})"

    rows = []
    for name, entry in after.items():
        for task, part in [*entry["by_task"].items(), ("all", entry)]:
            old = before[name] if task == "all" else before[name]["by_task"][task]
            rows.append(f"| {name} | {task} | {old['al']:.2f} | {part['al']:.2f} | {cell(old)} | {cell(part)} |")
    return rows


def _goal(result: dict) -> tuple[str, dict, float, bool]:
    """The trained-for label, its retention gain per regime, the full-cache AL change, and whether the goal is met."""
    before, after = result["before"], result["after"]
    full_change = after["full"]["al"] / before["full"]["al"] - 1
    trained = f"{result['policy']} {min(result['compressions']):g}x"
    gains = {
        task: after[trained]["by_task"][task]["retention"] - before[trained]["by_task"][task]["retention"]
        for task in after[trained]["by_task"]
    }
    met = all(gain >= TARGET_GAIN for gain in gains.values()) and full_change >= -FULL_DROP
    return trained, gains, full_change, met


def _verdict(result: dict) -> str:
    trained, gains, full_change, met = _goal(result)
    changes = ", ".join(f"{task} {gain:+.3f}" for task, gain in gains.items())
    goal = (
        f"The recipe's goal (retention of {trained} up by at least {TARGET_GAIN} on every regime, full-cache AL not "
        f"lower by more than {FULL_DROP:.0%})"
    )
    if met:
        return f"{goal} is met: {changes}."
    return f"{goal} is **not met**: retention change {changes}; full-cache AL {full_change:+.1%}."


def headline(result: dict, model_name: str) -> str:
    """One line for the README: the trained-for policy's retention before -> after per regime, and the verdict."""
    before, after = result["before"], result["after"]
    trained, _, full_change, met = _goal(result)
    parts = ", ".join(
        f"{task} {before[trained]['by_task'][task]['retention']:.2f} → {entry['retention']:.2f}"
        for task, entry in after[trained]["by_task"].items()
    )
    return (
        f"`{model_name}` ({after['full']['prompts']} prompts, replay): {trained} retention {parts}; full-cache AL "
        f"{full_change:+.1%}; goal {'met' if met else 'not met'}."
    )


def build_card(
    result: dict, model_name: str, target: str, license: str, base_model: str, repo_id: str | None = None
) -> ModelCard:
    if result.get("eval", {}).get("method") != "replay" or not result.get("after"):
        raise ValueError(
            "This eval.json has no replay evaluation (written by an older recipe, or with --no-replay): rerun "
            "`python -m lab train` with the same --out to evaluate it by replay."
        )
    if result.get("kind") == "selection-head":
        return _head_card(result, model_name, target, license, base_model, repo_id)
    before, after = result["before"], result["after"]
    data = _card_data(result, model_name, license, base_model)
    proxy_before, proxy_after = result["proxy_before"], result["proxy_after"]
    proxy_table = "\n".join(
        f"| {name} | {proxy_before[name]['agreement']:.3f} | {proxy_after[name]['agreement']:.3f} | "
        f"{proxy_before[name]['retention']:.3f} | {proxy_after[name]['retention']:.3f} |"
        for name in proxy_after
    )
    compressions = sorted(result["compressions"])
    return ModelCard.from_template(
        data,
        template_str=TEMPLATE,
        **_shared(result, model_name, target, license, base_model, repo_id),
        full_change=f"{after['full']['al'] / before['full']['al'] - 1:+.1%}",
        proxy_table=proxy_table,
        budgets=f"1/{compressions[-1]:g}-1/{compressions[0]:g}",
        unmasked=f"{result['unmasked_rate']:.0%}",
        alignment=_alignment(result),
        teacher=_teacher(result),
        trainable=f"{result['trainable_parameters']:,}",
        steps=result["steps"],
        seq_tokens=result["seq_tokens"],
        tokens_seen=f"{result['tokens_seen']:,}",
        train_minutes=f"{result['train_seconds'] / 60:.1f}",
        total_minutes=f"{result['total_seconds'] / 60:.1f}",
    )


def _head_card(
    result: dict, model_name: str, target: str, license: str, base_model: str, repo_id: str | None
) -> ModelCard:
    proxy_table = "\n".join(
        f"| {c} | {task} | {value:.3f} | {result['recall_after'][c][task]:.3f} |"
        for c, by_task in result["recall_before"].items()
        for task, value in by_task.items()
    )
    return ModelCard.from_template(
        _card_data(result, model_name, license, base_model),
        template_str=HEAD_TEMPLATE,
        **_shared(result, model_name, target, license, base_model, repo_id),
        parameters=f"{result['parameters']:,}",
        proxy_table=proxy_table,
        window=result["window"],
        epochs=result["epochs"],
        losses=", ".join(f"{value:.3f}" for value in result["loss_per_epoch"]),
        forwards=(
            "the forwards' time not recorded (cached by an earlier run)"
            if result.get("examples_seconds") is None
            else f"{result['examples_seconds'] / 60:.1f} minutes for the forwards"
        ),
        fit_minutes=f"{result['fit_seconds'] / 60:.1f}",
        points=result.get("points", "the prefill (the whole answer's attention)"),
        examples=result.get("examples", result["sequences"]),
    )


def _shared(result: dict, model_name: str, target: str, license: str, base_model: str, repo_id: str | None) -> dict:
    """The template fields both cards fill the same way: names, the evaluation's setting, results and verdict."""
    before, after, evaluation = result["before"], result["after"], result["eval"]
    repo_id = repo_id or f"{PLACEHOLDER_NAMESPACE}/{model_name}"
    return dict(
        model_name=model_name,
        target=target,
        base_model_name=base_model,
        recommended=result["recommended_config"],
        repo_id=repo_id,
        use=_use(result, repo_id, target, base_model),
        citation=CITATION,
        n_eval=after["full"]["prompts"],
        per_task=evaluation["per_task"],
        eval_tokens=evaluation["input_tokens"],
        new_tokens=evaluation["new_tokens"],
        gamma=evaluation["gamma"],
        table="\n".join(_rows(before, after)),
        verdict=_verdict(result),
        proxy_n=len(result["proxy_modules"]) * 2,
        proxy_modules=", ".join(result["proxy_modules"]),
        policy=result["policy"],
        prompt_tokens=result["prompt_tokens"],
        answer_tokens=result["answer_tokens"],
        sequences=result["sequences"],
        train_modules=", ".join(result["train_modules"]),
        learning_rate=result["learning_rate"],
        machine=result["machine"],
        date=result["date"],
        license=license,
    )


def _card_data(result: dict, model_name: str, license: str, base_model: str) -> ModelCardData:
    """The card's metadata: licence, tags and the after-evaluation's retention per label as eval results."""
    after = result["after"]
    dataset = {
        "task_type": "text-generation",
        "task_name": "speculative decoding (drafter)",
        "dataset_type": "python-stdlib-source",
        "dataset_name": "held-out standard-library modules (repeat and continue prompts)",
    }
    eval_results = [
        EvalResult(
            **dataset,
            metric_type="acceptance_length_retention",
            metric_name=f"AL retention, {name}",
            metric_value=round(after[name]["retention"], 4),
        )
        for name in after
        if name != "full"
    ] + [
        EvalResult(
            **dataset,
            metric_type="acceptance_length",
            metric_name="AL, full cache",
            metric_value=round(after["full"]["al"], 4),
        )
    ]
    head = result.get("kind") == "selection-head"
    return ModelCardData(
        model_name=model_name,
        base_model=base_model,
        **(
            {"license": "apache-2.0"}
            if license.lower().startswith("apache-2.0")
            else {"license": "other", "license_name": license.split(" (")[0].lower().replace(" ", "-")}
        ),
        # A selection head's repository holds a head file and a rift config, read by rift-hf beside the unchanged base
        # model (no weights: transformers alone loads nothing from it); a distilled drafter is a fine-tune.
        **({} if head else {"base_model_relation": "finetune"}),
        language=["code", "en"],
        library_name="rift-hf" if head else "transformers",
        pipeline_tag="text-generation",
        tags=["speculative-decoding", "drafter", "kv-cache-compression", "rift-hf"],
        eval_results=eval_results,
    )


def _alignment(result: dict) -> str:
    weight = result.get("alignment_weight") or 0
    if not weight:
        return ""
    log = result.get("alignment_log") or []
    trend = ""
    if len(log) >= 20:
        first, last = sum(log[:10]) / 10, sum(log[-10:]) / 10
        trend = f" (mean of the first ten sequences {first:.3f}, of the last ten {last:.3f})"
    return (
        f"\n- Selection alignment (weight {weight:g}): on every step, KL(answer's attention || prefill window's "
        "scores) over the evictable prompt positions, per layer and KV head, the answer's attention taken once from "
        f"the untrained drafter with the full cache (`rift_hf/training/selection.py`){trend}."
    )


def write_card(
    eval_json: Path,
    out_dirs: list[Path],
    model_name: str,
    target: str,
    license: str,
    base_model: str,
    repo_id: str | None = None,
) -> ModelCard:
    """Render the card from `eval.json` into each of `out_dirs` (the Hub-ready folder, `model_cards/<name>/`);
    `repo_id` is the repository its usage snippet loads from (default `YOUR_NAMESPACE/<model_name>`)."""
    result = json.loads(Path(eval_json).read_text())
    card = build_card(result, model_name, target, license, base_model, repo_id)
    for folder in out_dirs:
        folder.mkdir(parents=True, exist_ok=True)
        card.save(folder / "README.md")
        (folder / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    return card
