"""Gradio demo: the same prompt and target, drafter cache policies side by side, streamed live.

    rift-hf demo --preset qwen-coder          # real models (see rift_hf/models.py)
    python demo/app.py --preset tiny-random   # random tiny models, starts in seconds (tests)
    rift-hf demo --space OUT                  # a folder to upload as a Hugging Face Space

The target first runs alone (the speed every policy is compared with), then each chosen policy in turn; the table
shows each row as queued, running or done. A policy's run streams in as the target verifies drafts: accepted draft
tokens and target-corrected tokens are marked differently, with live acceptance length (AL), then its retention
against `full`, end-to-end tokens/s and speed-up over the target alone, drafter tokens/s and drafter KV memory.
Plots show AL over generation, the attention mass the kept positions capture, and AL against drafter memory. The named
API endpoint `compare` returns the per-policy numbers as JSON (for `gradio_client`).
"""

from __future__ import annotations

import argparse
import html
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TypedDict

import gradio as gr
import pandas as pd
import torch
from matplotlib.figure import Figure
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

import rift_hf
from rift_hf.config import policy_settings
from rift_hf.models import ByteTokenizer, fix_draft_length, tiny_random_pair

DRAFT_LENGTHS = ("auto", "fixed")  # rift's cost-aware length (the default), or transformers' constant gamma

POLICY_CHOICES = list(rift_hf.POLICIES)
RECOMMENDED = rift_hf.RiftConfig().policy
# The recommended policy (RiftConfig's default: `auto`, page-round below 16K prompt tokens, rift-dyn with a carry
# from there on) beside the reference, SnapKV, the paper's rift-dyn and our page-round.
DEFAULT_POLICIES = list(dict.fromkeys(["full", "snapkv", "rift-dyn", "page-round", RECOMMENDED]))
DOCUMENTS = ("argparse", "textwrap", "difflib", "configparser")
PRESETS = ["tiny-random", "qwen-coder", "gemma3-self"]
TARGET_ALONE = "target alone"
# One request's work is bounded: the target alone and `full` always run, then at most MAX_POLICIES more policies,
# each for at most MAX_NEW_TOKENS tokens; the queue holds at most QUEUE_SIZE requests (a public Space stays usable).
MAX_POLICIES = 5
MAX_NEW_TOKENS = 256
QUEUE_SIZE = 8
COLUMNS = [
    "policy",
    "status",
    "AL",
    "retention",
    "tokens/s",
    "speed-up vs target",
    "drafter tokens/s",
    "drafter working set MiB",
    "drafter store MiB",
]


@dataclass
class Preset:
    name: str
    target: object
    draft: object
    tokenizer: object
    max_prompt_tokens: int
    chat: bool = False

    def encode(self, text: str) -> torch.Tensor:
        if isinstance(self.tokenizer, ByteTokenizer):
            return self.tokenizer.encode(text)
        if self.chat and getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
        return self.tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]

    def decode(self, ids) -> str:
        if isinstance(self.tokenizer, ByteTokenizer):
            # Random weights emit random bytes: printable ASCII as it is, any other byte as a dot (not mojibake).
            return "".join(chr(b) if 32 <= b < 127 or b in (9, 10) else "·" for b in (int(i) % 256 for i in ids))
        return self.tokenizer.decode(ids)


def tiny_random_preset() -> Preset:
    target, draft, tokenizer = tiny_random_pair()
    return Preset("tiny-random", target, draft, tokenizer, max_prompt_tokens=4096)


def load_preset(name: str) -> Preset:
    if name == "tiny-random":
        return tiny_random_preset()
    from rift_hf.models import load_preset as load_real

    target, draft, tokenizer = load_real(name)
    if target.device.type == "cpu":  # verifications attend the key/value heads in place (rift_hf.gqa_attention)
        from rift_hf import gqa_attention

        gqa_attention(target)
        gqa_attention(draft)
    limit = min(getattr(target.config, "max_position_embeddings", 32768), 32768)
    return Preset(name, target, draft, tokenizer, max_prompt_tokens=limit, chat=True)


class RoundStreamer(BaseStreamer):
    """Receives each verification round's tokens from `generate` (the first `put` is the prompt)."""

    def __init__(self):
        self.rounds: queue.Queue = queue.Queue()
        self._prompt_seen = False

    def put(self, value):
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.rounds.put(value.reshape(-1).tolist())

    def end(self):
        self.rounds.put(None)


class PolicySummary(TypedDict):
    """One policy's row of the `compare` API (None where a figure does not apply or the run did not finish)."""

    policy: str
    status: str
    al: float | None
    retention: float | None
    tokens_per_s: float | None
    speedup_vs_target: float | None
    draft_tokens_per_s: float | None
    drafter_kv_mib: float | None
    store_mib: float | None


@dataclass
class PolicyRun:
    policy: str  # a policy name, or TARGET_ALONE for the target without a drafter
    status: str = "queued"  # queued -> running -> done
    spans: list = field(default_factory=list)  # (text, accepted: bool)
    al: float | None = None
    retention: float | None = None
    tokens_per_s: float | None = None  # end to end: new tokens / wall time of generate
    speedup: float | None = None  # tokens_per_s / the target alone's
    draft_tokens_per_s: float | None = None
    kv_mib: float | None = None
    store_mib: float | None = None
    rounds: list = field(default_factory=list)
    mass: list = field(default_factory=list)

    def summary(self) -> PolicySummary:
        return {
            "policy": self.policy,
            "status": self.status,
            "al": self.al,
            "retention": self.retention,
            "tokens_per_s": self.tokens_per_s,
            "speedup_vs_target": self.speedup,
            "draft_tokens_per_s": self.draft_tokens_per_s,
            "drafter_kv_mib": self.kv_mib,
            "store_mib": self.store_mib,
        }


def validate(preset: Preset, prompt: str, budget: float, gamma: int, policies, new_tokens: int) -> torch.Tensor:
    """Input checks with messages that say what to do; returns the prompt ids."""
    if not prompt or not prompt.strip():
        raise gr.Error("The prompt is empty: paste a text or pick a bundled document.")
    if not policies:
        raise gr.Error("Choose at least one policy.")
    if len(policies) > MAX_POLICIES:
        raise gr.Error(f"Choose at most {MAX_POLICIES} policies per run ({len(policies)} chosen).")
    unknown = [p for p in policies if p not in rift_hf.POLICIES]
    if unknown:
        raise gr.Error(f"Unknown policies {unknown}; choose from {', '.join(rift_hf.POLICIES)}.")
    if not 0.0 < float(budget) < 1.0:
        raise gr.Error(f"The budget must be a fraction of the prompt in (0, 1), got {budget}.")
    if not 1 <= int(gamma) <= 32:
        raise gr.Error(f"The draft length must be between 1 and 32, got {gamma}.")
    if not 1 <= int(new_tokens) <= MAX_NEW_TOKENS:
        raise gr.Error(f"New tokens must be between 1 and {MAX_NEW_TOKENS}, got {new_tokens}.")
    ids = preset.encode(prompt)
    if ids.shape[1] + int(new_tokens) > preset.max_prompt_tokens:
        raise gr.Error(
            f"The prompt has {ids.shape[1]} tokens; with {new_tokens} new tokens it exceeds this model's "
            f"{preset.max_prompt_tokens}. Shorten it."
        )
    return ids


def run_policy(
    preset: Preset,
    ids: torch.Tensor,
    policy: str,
    budget: float,
    gamma: int,
    new_tokens: int,
    window: int,
    result: PolicyRun,
    attention_mass: bool = False,
    draft_length: str = "auto",
):
    """Generator: runs one policy (or the target alone) in a thread, yielding as each round arrives; closing it
    cancels the run. `draft_length`: "auto" (rift's default: each round drafts what pays, up to γ) or "fixed" (γ every
    round)."""
    alone = policy == TARGET_ALONE
    kwargs = {}
    if not alone:
        fix_draft_length(preset.draft, gamma=int(gamma))
        budget_tokens = max(1, int(budget * ids.shape[1]))
        config = policy_settings(
            policy,
            {
                "budget": float(budget),
                "window": max(1, min(window, budget_tokens // 2)),
                "delta": 32,
                "track_attention_mass": attention_mass and policy != "full",  # a measurement: slower, off unless asked
                "draft_length": draft_length,  # "auto": up to the gamma chosen on the page; "fixed": gamma
                # The page compares drafter policies: each drafts, even where the default would let the target
                # decode alone because speculation cannot repay the drafter's prompt pass.
                **({"step_aside": False} if draft_length == "auto" else {}),
            },
        )
        kwargs = {"assistant_model": preset.draft, "cache_implementation": "rift", "cache_config": config}
    streamer = None if alone else RoundStreamer()
    error: list = []
    seconds: list = []
    stats_box: list = []
    cancelled = threading.Event()
    finished = threading.Event()

    def work():
        try:
            with torch.no_grad():
                start = time.perf_counter()
                preset.target.generate(
                    ids.to(preset.target.device),
                    max_new_tokens=int(new_tokens),
                    min_new_tokens=int(new_tokens),
                    do_sample=False,
                    streamer=streamer,
                    stopping_criteria=StoppingCriteriaList([StopOn(cancelled)]),
                    **kwargs,
                )
                seconds.append(time.perf_counter() - start)
                stats_box.append(rift_hf.last_stats(preset.target))  # per thread: read where generate ran
        except Exception as err:  # reported in the page, the app keeps serving
            error.append(err)
            if streamer is not None:
                streamer.end()
        finally:
            finished.set()

    result.status = "running"
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    try:
        if alone:  # nothing streams: yield now and then so that a cancel can close this generator
            while not finished.wait(0.25):
                yield
        else:
            yield from _follow(preset, streamer, result)
    finally:
        # Cancelled (the page's Cancel closes this generator) or done: stop generate and wait for it, so the next
        # queued run never shares the models with a running one.
        cancelled.set()
        thread.join()
    if error:
        result.status = "failed"
        raise gr.Error(f"{policy} failed: {error[0]}")
    result.tokens_per_s = int(new_tokens) / seconds[0]
    if not alone:
        stats = stats_box[0]
        decode = stats.rounds[1:]
        drafted = sum(r["draft_seconds"] for r in decode)
        result.draft_tokens_per_s = sum(r["drafted"] for r in decode) / drafted if drafted else None
        result.kv_mib = stats.peak_kv_bytes / 2**20
        result.store_mib = stats.peak_store_bytes / 2**20
        result.mass = stats.attention_mass
        result.al = stats.acceptance_length
    result.status = "done"
    yield


def _follow(preset: Preset, streamer: RoundStreamer, result: PolicyRun):
    """Yield once per verification round, recording accepted drafts and the target's own token."""
    while (tokens := streamer.rounds.get()) is not None:
        accepted, corrected = tokens[:-1], tokens[-1:]
        if accepted:
            result.spans.append((preset.decode(accepted), True))
        result.spans.append((preset.decode(corrected), False))
        result.rounds.append(len(accepted))
        result.al = sum(a + 1 for a in result.rounds) / len(result.rounds)
        yield


class StopOn(StoppingCriteria):
    """Stops generation once `event` is set (a cancelled run)."""

    def __init__(self, event: threading.Event):
        self.event = event

    def __call__(self, input_ids, scores, **kwargs) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


def _fmt(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def render(runs: list[PolicyRun]) -> str:
    """Each policy's text, accepted drafts and target tokens marked, under a line of live numbers."""
    blocks = []
    for run in runs:
        if run.policy == TARGET_ALONE:
            continue
        text = "".join(f'<span class="{"acc" if ok else "tgt"}">{html.escape(piece)}</span>' for piece, ok in run.spans)
        stats = (
            f'<span class="status" data-policy="{run.policy}">{run.status}</span> · '
            f'AL <b class="al" data-policy="{run.policy}">{_fmt(run.al, ".2f")}</b> · retention '
            f"{_fmt(run.retention, '.2f')} · {_fmt(run.speedup, '.2f')}x the target alone · drafter "
            f"{_fmt(run.draft_tokens_per_s, '.1f')} tok/s · drafter working set {_fmt(run.kv_mib, '.2f')} MiB + store "
            f"{_fmt(run.store_mib, '.2f')} MiB (what the policy keeps to select from again, or the attention-mass "
            "measurement's copy when ticked)"
        )
        blocks.append(
            f'<div class="policy"><h4>{run.policy}</h4><div class="stats">{stats}</div>'
            f'<pre class="gen">{text}</pre></div>'
        )
    legend = (
        '<p><span class="acc">accepted draft tokens</span> · <span class="tgt">tokens from the target '
        "(correction or bonus)</span></p>"
    )
    return legend + "".join(blocks)


def table(runs: list[PolicyRun]) -> pd.DataFrame:
    """One row per run (the target alone first), with its status; numbers rounded for reading."""

    def num(value, digits):
        return None if value is None else round(value, digits)

    rows = [
        [
            run.policy,
            run.status,
            num(run.al, 2),
            num(run.retention, 2),
            num(run.tokens_per_s, 1),
            num(run.speedup, 2),
            num(run.draft_tokens_per_s, 1),
            num(run.kv_mib, 2),
            num(run.store_mib, 2),
        ]
        for run in runs
    ]
    return pd.DataFrame(rows, columns=COLUMNS)


def al_curve(runs: list[PolicyRun]) -> pd.DataFrame:
    """AL over generation: tokens per round, a moving mean over a tenth of the rounds, against generated tokens."""
    rows = []
    for run in runs:
        position, per_round = 0, []
        for accepted in run.rounds:
            position += accepted + 1
            per_round.append(accepted + 1)
            window = per_round[-max(1, len(run.rounds) // 10) :]
            rows.append((run.policy, position, sum(window) / len(window)))
    return pd.DataFrame(rows, columns=["policy", "generated tokens", "tokens per round"])


def mass_curve(runs: list[PolicyRun]) -> pd.DataFrame:
    rows = [(run.policy, position, share) for run in runs for position, share in run.mass]
    return pd.DataFrame(rows, columns=["policy", "position", "attention mass kept"])


def memory_points(runs: list[PolicyRun]) -> pd.DataFrame:
    """AL against the drafter's KV bytes (working set, and working set plus the full store where one is kept)."""
    rows = []
    for run in runs:
        if run.status == "done" and run.kv_mib is not None:
            rows.append((run.policy, "working set", run.kv_mib, run.al))
            if run.store_mib:
                rows.append((run.policy, "working set + store", run.kv_mib + run.store_mib, run.al))
    return pd.DataFrame(rows, columns=["policy", "memory", "drafter KV MiB", "AL"])


def plot(runs: list[PolicyRun]):
    """Three panels from the DataFrames above: AL over generation, attention mass kept, AL against drafter memory.
    (matplotlib: Gradio 6.31's native LinePlot/ScatterPlot left series out, or drew none, when updated while a
    comparison streamed.)"""
    fig = Figure(figsize=(13, 3.6))  # not pyplot's: a figure per finished run would otherwise stay open there
    left, middle, right = fig.subplots(1, 3)
    color = {run.policy: f"C{i}" for i, run in enumerate(runs)}  # one colour per policy in every panel
    for name, rows in al_curve(runs).groupby("policy", sort=False):
        left.plot(rows["generated tokens"], rows["tokens per round"], label=name, color=color[name])
    for name, rows in mass_curve(runs).groupby("policy", sort=False):
        middle.plot(rows["position"], rows["attention mass kept"], label=name, color=color[name])
    named = set()
    for (name, memory), rows in memory_points(runs).groupby(["policy", "memory"], sort=False):
        # Points of several policies often sit together: a legend names them, labels beside them would overlap.
        label = None if name in named else name
        named.add(name)
        marker = "o" if memory == "working set" else "x"
        right.scatter(rows["drafter KV MiB"], rows["AL"], marker=marker, color=color[name], label=label)
    if mass_curve(runs).empty:
        middle.text(0.5, 0.5, "not measured\n(tick the attention-mass box)", ha="center", va="center", alpha=0.6)
    left.set(title="AL over generation (moving mean)", xlabel="generated tokens", ylabel="tokens per round")
    middle.set(title="Attention mass on kept positions", xlabel="position", ylabel="share", ylim=(0, 1.05))
    right.set(title="AL against drafter KV\n(o: working set, x: with store)", xlabel="MiB", ylabel="AL")
    for axis in (left, middle, right):
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 0.93))  # room above the titles for the page's label of the plot block
    return fig


def views(runs: list[PolicyRun], shown: list[str], plots: bool = True):
    """The page's outputs: the text, the table and the plots (`gr.skip()` for them unless `plots`)."""
    picked = [r for r in runs if r.policy in shown]
    drafted = [r for r in picked if r.policy != TARGET_ALONE]
    return render(picked), table(picked), plot(drafted) if plots else gr.skip()


def build_app(default_preset: str = "tiny-random") -> gr.Blocks:
    presets: dict[str, Preset] = {}
    lock = threading.Lock()

    def get(name: str) -> Preset:
        if name not in PRESETS:  # never a free string: it would name a Hub download
            raise gr.Error(f"Unknown preset {name!r}; choose from {', '.join(PRESETS)}.")
        with lock:
            if name not in presets:
                presets[name] = load_preset(name)
            return presets[name]

    def runs_stream(
        preset_name, prompt, document, budget, gamma, policies, new_tokens, attention_mass=False, draft_length="auto"
    ):
        """Yields the runs (the target alone, full, then the other policies) as they progress."""
        if draft_length not in DRAFT_LENGTHS:
            raise gr.Error(f"Unknown draft length {draft_length!r}; choose from {', '.join(DRAFT_LENGTHS)}.")
        preset = get(preset_name)
        if document and document not in ("(none)", *DOCUMENTS):
            raise gr.Error(f"Unknown document {document!r}; choose from {', '.join(DOCUMENTS)}.")
        if document and document != "(none)" and not (prompt or "").strip():
            from rift_hf.prompts import build_prompt

            if isinstance(preset.tokenizer, ByteTokenizer):
                import importlib
                import inspect

                prompt = inspect.getsource(importlib.import_module(document))[:3000]
            else:
                ids = build_prompt(preset.tokenizer, document, "repeat", 2048).input_ids
                prompt = preset.tokenizer.decode(ids[0])
        ids = validate(preset, prompt, budget, gamma, policies, new_tokens)
        # The target alone gives the speed-up's reference; full (run first of the policies) gives retention's.
        runs = [PolicyRun(p) for p in [TARGET_ALONE, "full"] + [p for p in policies if p != "full"]]
        yield runs
        alone, full = runs[0], runs[1]
        for run in runs:
            args = (preset, ids, run.policy, budget, gamma, new_tokens, 64, run, bool(attention_mass), draft_length)
            for _ in run_policy(*args):
                yield runs
            if run is not alone:
                run.speedup = run.tokens_per_s / alone.tokens_per_s
                run.retention = run.al / full.al if full.al else None
            yield runs

    def compare_stream(
        preset_name, prompt, document, budget, gamma, policies, new_tokens, attention_mass=False, draft_length="auto"
    ):
        drawn = -1
        streamed = (preset_name, prompt, document, budget, gamma, policies, new_tokens, attention_mass, draft_length)
        for runs in runs_stream(*streamed):
            # The figure is redrawn when a run ends (drawing it every round would cost more than the round).
            done = sum(run.status == "done" for run in runs)
            yield views(runs, [TARGET_ALONE, *policies], plots=done != drawn)
            drawn = done

    def compare(
        preset_name: str,
        prompt: str,
        budget: float,
        gamma: int,
        policies: list[str],
        new_tokens: int,
        attention_mass: bool = False,
        draft_length: str = "auto",
    ) -> list[PolicySummary]:
        """Per-policy AL, retention, end-to-end tokens/s and speed-up over the target alone, drafter tokens/s and
        KV memory, as JSON. `attention_mass` also measures the attention mass on kept positions (slower);
        `draft_length` is "auto" (cost-aware, up to γ: rift's default) or "fixed" (γ every round)."""
        args = (preset_name, prompt, "(none)", budget, gamma, policies, new_tokens, attention_mass, draft_length)
        *_, runs = runs_stream(*args)
        return [run.summary() for run in runs if run.policy in policies]

    # gradio types the API from the annotation object; this module's annotations are strings (postponed evaluation)
    compare.__annotations__["return"] = list[PolicySummary]

    css = (
        ".acc{background:#c8f7c5} .tgt{background:#ffd8a8} pre.gen{white-space:pre-wrap;max-height:14em;"
        "overflow:auto} .policy{border-top:1px solid #ddd;padding-top:4px}"
    )
    with gr.Blocks(title="rift-hf: drafter cache policies, live") as app:
        gr.Markdown(
            "# rift-hf — drafter KV-cache policies side by side\nSame prompt, same target; the drafter's "
            "cache is compressed to a budget by each policy. Output is always the target's own. The target first "
            f"runs alone (the speed-up's reference). `{RECOMMENDED}` is the recommended policy.\n\n"
            "**AL**: tokens per target verification round (accepted drafts + the target's own). **Retention**: a "
            "policy's AL / the full cache's. **γ**: tokens the drafter proposes per round. **Budget**: the share of "
            "the prompt the drafter's cache keeps. **Speed-up**: tokens/s against the target alone."
        )
        with gr.Row():
            preset = gr.Dropdown(
                PRESETS,
                value=default_preset,
                label="preset",
                info="tiny-random has random weights: it shows the mechanics only, its numbers mean nothing",
            )
            document = gr.Dropdown(["(none)", *DOCUMENTS], value="(none)", label="bundled long document")
            budget = gr.Slider(0.05, 0.9, value=0.25, step=0.05, label="budget (fraction of the prompt)")
            gamma = gr.Slider(1, 16, value=11, step=1, label="draft length γ (the longest, with cost-aware)")
            draft_length = gr.Radio(
                list(DRAFT_LENGTHS),
                value="auto",
                label="draft length",
                info="auto: each round drafts what its measured costs say pays (rift's default); fixed: γ every round",
            )
            new_tokens = gr.Number(
                value=64, precision=0, minimum=1, maximum=MAX_NEW_TOKENS, label=f"new tokens (at most {MAX_NEW_TOKENS})"
            )
        prompt = gr.Textbox(lines=6, label="prompt (or leave empty and pick a document)", elem_id="prompt")
        policies = gr.CheckboxGroup(
            POLICY_CHOICES, value=DEFAULT_POLICIES, label=f"policies (at most {MAX_POLICIES}; full always runs)"
        )
        attention_mass = gr.Checkbox(False, label="measure the attention mass on kept positions (slower)")
        with gr.Row():
            run = gr.Button("Run", variant="primary", elem_id="run")
            cancel = gr.Button("Cancel", elem_id="cancel")
        summary = gr.Dataframe(
            table([]),
            label="summary (end-to-end tokens/s include the drafter; speed-up against the target alone)",
            elem_id="summary",
            interactive=False,
        )
        figure = gr.Plot(label="AL per round and drafter memory, per policy", elem_id="plot", format="png")
        output = gr.HTML(label="generated text per policy (accepted drafts highlighted)", elem_id="output")
        event = run.click(
            compare_stream,
            [preset, prompt, document, budget, gamma, policies, new_tokens, attention_mass, draft_length],
            [output, summary, figure],
            api_name="compare_stream",
        )
        cancel.click(None, None, None, cancels=[event])
        gr.api(compare, api_name="compare")
    app.queue(default_concurrency_limit=1, max_size=QUEUE_SIZE)
    app.rift_css = css
    return app


SPACE_APP = """# A Hugging Face Space running the rift-hf demo (written by `rift-hf demo --space`).
import os

from rift_hf.demo.app import build_app

demo = build_app(os.environ.get("RIFT_DEMO_PRESET", "{preset}"))

if __name__ == "__main__":
    demo.launch(css=demo.rift_css)
"""

SPACE_README = """---
title: rift-hf drafter cache policies
emoji: ✂️
sdk: gradio
sdk_version: {gradio}
app_file: app.py
python_version: "3.11"
---

The rift-hf demo: one prompt, one target, the drafter's KV cache compressed by each policy, side by side. The Space
runs the `{preset}` preset (set the `RIFT_DEMO_PRESET` variable to change it); the package is vendored in `rift_hf/`.
"""


def write_space(out, preset: str = "qwen-coder"):
    """Write a folder to upload as a Gradio Space: `app.py`, `requirements.txt`, a README with the Space's metadata,
    and the rift_hf package itself (kernels and demo included), so the Space needs nothing but PyPI."""
    import importlib.metadata as metadata
    from pathlib import Path

    from rift_hf.hub import copy_package

    if preset not in PRESETS:
        raise ValueError(f"Unknown preset {preset!r}; choose from {', '.join(PRESETS)}.")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty: pass a new folder.")
    copy_package(out / "rift_hf", demo=True)
    requires = [r.split(";")[0].strip() for r in metadata.requires("rift-hf") or [] if "extra ==" not in r]
    lines = [*requires, f"gradio=={gr.__version__}", "pandas", "matplotlib"]  # the demo extra
    (out / "requirements.txt").write_text("\n".join(dict.fromkeys(lines)) + "\n")
    (out / "app.py").write_text(SPACE_APP.format(preset=preset))
    (out / "README.md").write_text(SPACE_README.format(preset=preset, gradio=gr.__version__))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="rift-hf demo",
        description="rift-hf policy comparison demo (Gradio)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--preset",
        default=os.environ.get("RIFT_DEMO_PRESET", "tiny-random"),
        choices=PRESETS,
        help="model preset (tiny-random starts in seconds and only shows the mechanics)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address the server listens on")
    parser.add_argument("--port", type=int, default=7860, help="port the server listens on")
    parser.add_argument(
        "--space",
        metavar="OUT",
        default=None,
        help="write a Hugging Face Space folder (app.py, requirements.txt, README, the package) for --preset "
        "to OUT instead of serving",
    )
    args = parser.parse_args(argv)
    if args.space:
        try:
            out = write_space(args.space, args.preset)
        except ValueError as err:
            parser.exit(2, f"rift-hf demo: error: {err}\n")
        print(f"wrote a Space folder to {out}: upload it with `hf upload <you>/<space> {out} --repo-type space`")
        return
    app = build_app(args.preset)
    app.launch(server_name=args.host, server_port=args.port, css=app.rift_css)


if __name__ == "__main__":
    main()
