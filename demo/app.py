"""Gradio demo: the same prompt and target, drafter cache policies side by side, streamed live.

    rift-hf demo --preset qwen-coder          # real models (see rift_hf/models.py)
    python demo/app.py --preset tiny-random   # random tiny models, starts in seconds (tests)

Each policy's run streams in as the target verifies drafts: accepted draft tokens and target-corrected tokens are
marked differently, with live acceptance length (AL), retention against `full`, drafter tokens/s and drafter KV
memory; plots of AL over generation and of the attention mass the kept positions capture follow. The named API
endpoint `compare` returns the per-policy numbers as JSON (for `gradio_client`).
"""

from __future__ import annotations

import argparse
import html
import queue
import threading
from dataclasses import dataclass, field

import gradio as gr
import matplotlib
import torch
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

import rift_hf
from rift_hf.models import ByteTokenizer, fix_draft_length, tiny_random_pair

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

POLICY_CHOICES = list(rift_hf.POLICIES)
# The recommended policy (RiftConfig's default) beside the reference and the paper's policies.
DEFAULT_POLICIES = ["full", "snapkv", "rift-stat", "rift-dyn", "page-retrieval"]
DOCUMENTS = ("argparse", "textwrap", "difflib", "configparser")


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
        return self.tokenizer.decode(ids)


def tiny_random_preset() -> Preset:
    target, draft, tokenizer = tiny_random_pair()
    return Preset("tiny-random", target, draft, tokenizer, max_prompt_tokens=4096)


def load_preset(name: str) -> Preset:
    if name == "tiny-random":
        return tiny_random_preset()
    from rift_hf.models import load_preset as load_real

    target, draft, tokenizer = load_real(name)
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


@dataclass
class PolicyRun:
    policy: str
    spans: list = field(default_factory=list)  # (text, accepted: bool)
    al: float | None = None
    retention: float | None = None
    draft_tokens_per_s: float | None = None
    kv_mib: float | None = None
    store_mib: float | None = None
    rounds: list = field(default_factory=list)
    mass: list = field(default_factory=list)
    done: bool = False

    def summary(self) -> dict:
        return {
            "policy": self.policy,
            "al": self.al,
            "retention": self.retention,
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
    unknown = [p for p in policies if p not in rift_hf.POLICIES]
    if unknown:
        raise gr.Error(f"Unknown policies {unknown}; choose from {', '.join(rift_hf.POLICIES)}.")
    if not 0.0 < float(budget) < 1.0:
        raise gr.Error(f"The budget must be a fraction of the prompt in (0, 1), got {budget}.")
    if not 1 <= int(gamma) <= 32:
        raise gr.Error(f"The draft length must be between 1 and 32, got {gamma}.")
    if not 1 <= int(new_tokens) <= 2048:
        raise gr.Error(f"New tokens must be between 1 and 2048, got {new_tokens}.")
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
):
    """Generator: runs one policy in a thread, yielding as each round arrives; closing it cancels the run."""
    fix_draft_length(preset.draft, gamma=int(gamma))
    budget_tokens = max(1, int(budget * ids.shape[1]))
    config = {
        "policy": policy,
        "budget": float(budget),
        "window": max(1, min(window, budget_tokens // 2)),
        "delta": 32,
        "track_attention_mass": policy != "full",
    }
    streamer = RoundStreamer()
    error: list = []
    cancelled = threading.Event()

    def work():
        try:
            with torch.no_grad():
                preset.target.generate(
                    ids.to(preset.target.device),
                    assistant_model=preset.draft,
                    max_new_tokens=int(new_tokens),
                    min_new_tokens=int(new_tokens),
                    do_sample=False,
                    streamer=streamer,
                    stopping_criteria=StoppingCriteriaList([StopOn(cancelled)]),
                    cache_implementation="rift",
                    cache_config=config,
                )
        except Exception as err:  # reported in the page, the app keeps serving
            error.append(err)
            streamer.end()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    try:
        yield from _follow(preset, streamer, result)
    finally:
        # Cancelled (the page's Cancel closes this generator) or done: stop generate and wait for it, so the next
        # queued run never shares the models with a running one.
        cancelled.set()
        thread.join()
    if error:
        raise gr.Error(f"{policy} failed: {error[0]}")
    stats = rift_hf.last_stats(preset.target)
    decode = stats.rounds[1:]
    seconds = sum(r["draft_seconds"] for r in decode)
    result.draft_tokens_per_s = sum(r["drafted"] for r in decode) / seconds if seconds else None
    result.kv_mib = stats.peak_kv_bytes / 2**20
    result.store_mib = stats.peak_store_bytes / 2**20
    result.mass = stats.attention_mass
    result.al = stats.acceptance_length
    result.done = True
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


def render(runs: list[PolicyRun]) -> str:
    blocks = []
    for run in runs:
        text = "".join(f'<span class="{"acc" if ok else "tgt"}">{html.escape(piece)}</span>' for piece, ok in run.spans)
        fmt = lambda v, spec: "—" if v is None else format(v, spec)  # noqa: E731
        stats = (
            f'AL <b class="al" data-policy="{run.policy}">{fmt(run.al, ".2f")}</b> · retention '
            f"{fmt(run.retention, '.2f')} · drafter {fmt(run.draft_tokens_per_s, '.1f')} tok/s · "
            f"drafter KV {fmt(run.kv_mib, '.2f')} MiB (+ full store {fmt(run.store_mib, '.2f')} MiB, kept for "
            "rescoring or the attention-mass plot)"
            f"{'' if run.done else ' · running…'}"
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


def plot(runs: list[PolicyRun]):
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    for run in runs:
        if run.rounds:
            position, xs, ys = 0, [], []
            for accepted in run.rounds:
                position += accepted + 1
                xs.append(position)
                ys.append(accepted + 1)
            window = max(1, len(ys) // 10)
            smooth = [
                sum(ys[max(0, i - window + 1) : i + 1]) / len(ys[max(0, i - window + 1) : i + 1])
                for i in range(len(ys))
            ]
            left.plot(xs, smooth, label=run.policy)
        if run.mass:
            right.plot([p for p, _ in run.mass], [s for _, s in run.mass], label=run.policy)
    left.set(title="AL over generation (moving mean)", xlabel="generated tokens", ylabel="tokens per round")
    right.set(title="Attention mass on kept positions", xlabel="position", ylabel="share", ylim=(0, 1.05))
    for axis in (left, right):
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=8)
    fig.tight_layout()
    return fig


def build_app(default_preset: str = "tiny-random") -> gr.Blocks:
    presets: dict[str, Preset] = {}
    lock = threading.Lock()

    def get(name: str) -> Preset:
        with lock:
            if name not in presets:
                presets[name] = load_preset(name)
            return presets[name]

    def compare_stream(preset_name, prompt, document, budget, gamma, policies, new_tokens):
        preset = get(preset_name)
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
        order = ["full"] + [p for p in policies if p != "full"]  # retention needs the full-cache reference
        runs = [PolicyRun(p) for p in order]
        for run in runs:
            for _ in run_policy(preset, ids, run.policy, budget, gamma, new_tokens, 64, run):
                yield render(runs), None, None
            if run.policy != "full" and runs[0].al:
                run.retention = run.al / runs[0].al
            elif run.policy == "full":
                run.retention = 1.0
        shown = [r for r in runs if r.policy in policies]
        yield render(shown), plot(shown), [r.summary() for r in shown]

    def compare(
        preset_name: str, prompt: str, budget: float, gamma: int, policies: list[str], new_tokens: int
    ) -> list[dict]:
        """Per-policy AL, retention, drafter tokens/s and KV memory, as JSON."""
        *_, last = compare_stream(preset_name, prompt, "(none)", budget, gamma, policies, new_tokens)
        return last[2]

    css = (
        ".acc{background:#c8f7c5} .tgt{background:#ffd8a8} pre.gen{white-space:pre-wrap;max-height:14em;"
        "overflow:auto} .policy{border-top:1px solid #ddd;padding-top:4px}"
    )
    with gr.Blocks(title="rift-hf: drafter cache policies, live") as app:
        gr.Markdown(
            "# rift-hf — drafter KV-cache policies side by side\nSame prompt, same target; the drafter's "
            "cache is compressed to a budget by each policy. Output is always the target's own."
        )
        with gr.Row():
            preset = gr.Dropdown(["tiny-random", "qwen-coder", "gemma3-self"], value=default_preset, label="preset")
            document = gr.Dropdown(["(none)", *DOCUMENTS], value="(none)", label="bundled long document")
            budget = gr.Slider(0.05, 0.9, value=0.25, step=0.05, label="budget (fraction of the prompt)")
            gamma = gr.Slider(1, 16, value=11, step=1, label="draft length γ")
            new_tokens = gr.Number(value=64, precision=0, label="new tokens")
        prompt = gr.Textbox(lines=6, label="prompt (or leave empty and pick a document)", elem_id="prompt")
        policies = gr.CheckboxGroup(POLICY_CHOICES, value=DEFAULT_POLICIES, label="policies")
        with gr.Row():
            run = gr.Button("Run", variant="primary", elem_id="run")
            cancel = gr.Button("Cancel", elem_id="cancel")
        output = gr.HTML(elem_id="output")
        figure = gr.Plot(elem_id="plot", format="png")
        table = gr.JSON(label="summary", elem_id="summary")
        event = run.click(
            compare_stream,
            [preset, prompt, document, budget, gamma, policies, new_tokens],
            [output, figure, table],
            api_name="compare_stream",
        )
        cancel.click(None, None, None, cancels=[event])
        gr.api(compare, api_name="compare")
    app.queue(default_concurrency_limit=1)
    app.rift_css = css
    return app


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="rift-hf demo",
        description="rift-hf policy comparison demo (Gradio)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--preset",
        default="tiny-random",
        choices=["tiny-random", "qwen-coder", "gemma3-self"],
        help="model preset (tiny-random starts in seconds and only shows the mechanics)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address the server listens on")
    parser.add_argument("--port", type=int, default=7860, help="port the server listens on")
    args = parser.parse_args(argv)
    app = build_app(args.preset)
    app.launch(server_name=args.host, server_port=args.port, css=app.rift_css)


if __name__ == "__main__":
    main()
