"""Drafter step benchmark: what one drafted token costs with each cache, plain and through the assisted loop.

    python -m benchmarks.step                        # CPU, the real qwen-coder drafter (bf16), every part
    python -m benchmarks.step --random-weights       # the same shapes, random weights (a GPU needs no checkpoint)
    python -m benchmarks.step --dry-run              # tiny random model and lengths, so the script cannot rot

Parts, all in one process so that ratios compare like with like:
- `full`: a plain decode step with transformers' `DynamicCache` at each context length (`--contexts`);
- `plain`: a plain decode step with each policy (`--policies`) at each input length (`--inputs`) and budget
  (`--budgets`), commits and rescorings included (mean over `--steps` steps, so a rift-dyn run of >= delta steps
  pays its rescorings), with the rescoring time on its own;
- `assisted`: ms per drafted token through `generate(assistant_model=...)` (the drafter drafting for a copy of
  itself, so every round drafts its full length), for the policies and inputs of `--assisted-*`, and transformers'
  own assisted generation with a full drafter cache (`policy: "transformers"`);
- `target` (`--target-inputs`): the target's own costs at each input length, a plain decode step (`mode:
  "target-step"`) and a verification forward of gamma + 1 tokens (`mode: "target-verify"`), so `python -m lab table
  <replay folder> --estimate <this file>` can turn replayed AL into an end-to-end speed estimate;
- `refresh` (not in the default parts): for the policies of `--policies` whose refresh chooses every layer's pages
  in one stacked call (`Policy.select_layers`, page-round), ms per refresh that way and one call per layer,
  alternating in one decode run at each input length and budget;
- `compiled` (not in the default parts): for the policies of `--compiled-policies`, a drafter step eager and
  compiled (`compile=True`) at each input length and budget, one step of each in turn on two caches made from one
  prefill (`compiled_over_eager`; the compilation is left out and reported as `warmup_seconds`);
- `graph` (CUDA only): whether the decode step with a rift cache can be captured in a CUDA graph.

Records (`policy`, `input_tokens`, `budget`, `ms_per_step`, `mode`) go to `benchmarks/results/step-<device>.json`
as each finishes; a rerun skips the records already there (delete the file to measure afresh).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

import rift_hf
from lab import records
from lab.cli import split_labels
from lab.compare import LINEARS
from lab.tables import pipe_table
from rift_hf.models import DTYPES, resolve_dtype
from rift_hf.replay import load_prefill, record_prompt_forward

TINY = {"layers": 2, "h_q": 4, "h_kv": 2, "dim": 16, "hidden": 64, "intermediate": 96, "vocab": 96}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load_drafter(args, device, dtype):
    """The qwen-coder drafter (real weights), or a random model of its shape (`--random-weights`/`--dry-run`)."""
    if args.dry_run or args.random_weights:
        from benchmarks.kernels import QWEN_05B, qwen_shaped_model

        shape = TINY if args.dry_run else QWEN_05B
        return qwen_shaped_model(shape, 2 * max(args.contexts + args.inputs), dtype, device), "random"
    from rift_hf.models import PRESETS, load_model

    model = load_model(PRESETS["qwen-coder"][1], dtype).to(device)
    model.set_attn_implementation("rift")
    return model, "qwen2.5-coder-0.5b-instruct"


def load_target(args, device, dtype):
    """The qwen-coder target (real weights), random weights at its shapes (`--random-weights`), or a tiny random
    model (`--dry-run`)."""
    if args.dry_run or args.random_weights:
        from benchmarks.kernels import QWEN_15B, qwen_shaped_model

        target = qwen_shaped_model(TINY if args.dry_run else QWEN_15B, 2 * max(args.target_inputs), dtype, device)
    else:
        from rift_hf.models import PRESETS, load_model

        target = load_model(PRESETS["qwen-coder"][0], dtype).to(device)
    target.set_attn_implementation("sdpa")  # the target attends as it does when verifying (not through rift)
    return target


def use_linear(model, linear: str) -> None:
    """`--linear weight-major`: the model's small-batch linear layers as `weight @ x.T` (`rift_hf.speedups`)."""
    if linear == "weight-major":
        from rift_hf.speedups import weight_major_linear

        weight_major_linear(model)


def prompt_ids(model, length: int, device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(length)
    return torch.randint(0, model.config.vocab_size, (1, length), generator=generator).to(device)


def decode(model, cache, token, start: int, steps: int, device, between=None) -> list[float]:
    """`steps` greedy decode steps after a prefill of `start` tokens; seconds per step (`between()` runs after each
    step, untimed)."""
    times = []
    with torch.no_grad():
        for i in range(steps):
            if between is not None and i:
                between()
            _sync(device)
            tick = time.perf_counter()
            token = _greedy_step(model, cache, token, start + i, device)
            _sync(device)
            times.append(time.perf_counter() - tick)
    return times


def _greedy_step(model, cache, token, position: int, device) -> torch.Tensor:
    """One decode forward of `token` at `position`; the greedy next token."""
    logits = model(
        input_ids=token, position_ids=torch.tensor([[position]], device=device), past_key_values=cache, use_cache=True
    ).logits
    return logits[:, -1:].argmax(-1)


def full_cache(model, prefill, length: int):
    """A `DynamicCache` holding the first `length` tokens of `prefill` (a causal model's states do not depend on later
    tokens), and the token to decode next."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    for layer_idx, (keys, values) in sorted(prefill.states.items()):
        cache.update(keys[:, :, :length], values[:, :, :length], layer_idx)
    return cache, prefill.logits[-1:].argmax(-1)[None]


class Baseline:
    """A plain full-cache decode step at a fixed context (`--baseline-context`), timed between the steps of every
    record, so each record carries its own side-by-side ratio (immune to load that drifts during a long run)."""

    def __init__(self, model, prefill, context: int, device):
        self.model, self.context, self.device = model, context, device
        self.cache, self.token = full_cache(model, prefill, context)

    def step(self) -> float:
        times = decode(self.model, self.cache, self.token, self.context, 1, self.device)
        self.cache.crop(self.context - self.cache.get_seq_length())  # every baseline step attends `context` entries
        return times[0]


def policy_config(label: str, budget: int, args) -> dict:
    """A policy label (`rift-stat@kv_dtype=int4,kv_equal_bytes=true`, as `python -m lab replay` takes) -> cache
    config."""
    return records.policy_config(label, budget, args.window, args.delta, None)


def run_full(model, prefill, length, args, device) -> dict:
    """Plain step with a `DynamicCache` holding the first `length` prompt tokens."""
    cache, token = full_cache(model, prefill, length)
    times = decode(model, cache, token, length, args.steps, device)
    return {"policy": "full", "input_tokens": length, "budget": None, "mode": "plain", **_times(times)}


def run_policy(model, prefill, length, policy, budget, args, device, baseline: Baseline) -> dict:
    cache = rift_hf.RiftCache(model.config, policy_config(policy, budget, args))
    with torch.no_grad():
        load_prefill(cache, prefill)
        cache.get_mask_sizes(1, 0)  # the first selection, as the next forward would make it
    token = prefill.logits[-1:].argmax(-1)[None]
    rescore_s = sum(e["seconds"] for e in cache.events)
    base = []
    times = decode(model, cache, token, length, args.steps, device, between=lambda: base.append(baseline.step()))
    decode_rescore = sum(e["seconds"] for e in cache.events) - rescore_s
    return {
        "policy": policy,
        "input_tokens": length,
        "budget": budget,
        "mode": "plain",
        **_times(times),
        **_baseline(base, times, baseline),
        "rescorings": len(cache.events) - (1 if rescore_s else 0),
        "rescore_ms_total": 1e3 * decode_rescore,
        "rescore_share": decode_rescore / sum(times),
        "kv_bytes": cache.kv_bytes(),
    }


def run_compiled(model, prefill, length, policy, budget, args, device) -> dict:
    """
    Eager vs compiled drafter steps (`compile=True`, `rift_hf.generation.compiled`) on two caches made from the same
    prefill, one step of each in turn (so both see the same load); the warm-up steps, compilation included, untimed.
    """
    from rift_hf.generation.compiled import CompiledDrafting

    caches, tokens = [], []
    for _ in range(2):
        cache = rift_hf.RiftCache(model.config, {**policy_config(policy, budget, args), "compile": True})
        with torch.no_grad():
            load_prefill(cache, prefill)
            cache.get_mask_sizes(1, 0)  # the first selection
        caches.append(cache)
        tokens.append(prefill.logits[-1:].argmax(-1)[None])
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    warmup = 3
    with torch.no_grad(), CompiledDrafting(model, caches[1]) as drafting:
        tick = time.perf_counter()
        for i in range(warmup + args.steps):
            for index, way in enumerate(("eager", "compiled")):  # caches[1] is the one routed to the compiled step
                _sync(device)
                start = time.perf_counter()
                tokens[index] = _greedy_step(model, caches[index], tokens[index], length + i, device)
                _sync(device)
                if i >= warmup:
                    times[way].append(time.perf_counter() - start)
            if i == warmup - 1:
                warm_s = time.perf_counter() - tick
    eager, compiled = (statistics.median(times[w]) for w in ("eager", "compiled"))
    return {
        "policy": policy,
        "input_tokens": length,
        "budget": budget,
        "mode": "compiled",
        **_times(times["compiled"]),
        "eager_ms_per_step": 1e3 * eager,
        "compiled_over_eager": compiled / eager,
        "compiled_steps": drafting.steps,
        "eager_fallbacks": drafting.eager,
        "compiles": drafting.compiles,
        "warmup_seconds": warm_s,
        "same_tokens": bool(torch.equal(tokens[0], tokens[1])),
    }


def stacks_layers(policy: str, budget: int, length: int, args) -> bool:
    """Whether the policy's refresh (for a `length`-token prompt: `auto` chooses by it) chooses for every layer in one
    call (`Policy.select_layers`): `refresh` times it."""
    chosen = rift_hf.RiftConfig.coerce(policy_config(policy, budget, args)).fitted(length).policy_object
    return type(chosen).select_layers is not rift_hf.Policy.select_layers


def run_refresh(model, prefill, length, policy, budget, args, device) -> dict:
    """A page policy's refresh (`Policy.select_layers`) timed both ways in one decode run: every layer chosen in one
    stacked call, or one call per layer (a `select_layers` that returns None on the cache's policy), alternating every
    four steps; ms per refresh, median of each way (the selections are the same either way)."""
    cache = rift_hf.RiftCache(model.config, policy_config(policy, budget, args))
    with torch.no_grad():
        load_prefill(cache, prefill)
        cache.get_mask_sizes(1, 0)
    token, seconds = prefill.logits[-1:].argmax(-1)[None], {True: [], False: []}
    stacked_hook, per_layer = cache.policy.select_layers, lambda layers, cache: None
    with torch.no_grad():
        for i in range(args.steps):
            stacked = (i // 4) % 2 == 0
            # Read at the commit that starts this forward; a hook that returns None leaves each layer to itself.
            cache.policy.select_layers = stacked_hook if stacked else per_layer
            before = len(cache.events)
            token = _greedy_step(model, cache, token, length + i, device)
            seconds[stacked] += [e["seconds"] for e in cache.events[before:]]
    if not seconds[True] or not seconds[False]:
        raise SystemExit(f"--parts refresh needs refreshes both ways: raise --steps (got {args.steps}; 16 or more).")
    return {
        "policy": policy,
        "input_tokens": length,
        "budget": budget,
        "mode": "refresh",
        "ms_per_step": 1e3 * statistics.median(seconds[True]),
        "per_layer_ms": 1e3 * statistics.median(seconds[False]),
        "refreshes": [len(seconds[True]), len(seconds[False])],
        "layers": len(cache.rift_layers),
    }


def run_assisted(model, target, length, policy, budget, args, device, baseline: Baseline) -> dict:
    """ms per drafted token through transformers' assisted loop (the drafter's time only), with a baseline step timed
    before every verification of the target, so baseline and drafting share the same stretch of time."""
    base = []
    record = _run_assisted(model, target, length, policy, budget, args, device, lambda: base.append(baseline.step()))
    record.update(_baseline(base, [record["ms_per_step"] / 1e3], baseline))
    return record


class ForwardClock:
    """Times the drafter's forward calls (hooks), so a round's time splits into forwards and the loop around them;
    `paused` leaves out forwards that are not drafting (the interleaved baseline steps)."""

    def __init__(self, model, device):
        self.device, self.seconds, self._tick, self.paused = device, [], None, False
        self.handles = [
            model.register_forward_pre_hook(self._start),
            model.register_forward_hook(self._stop),
        ]

    def _start(self, *_):
        if not self.paused:
            _sync(self.device)
            self._tick = time.perf_counter()

    def _stop(self, *_):
        if not self.paused:
            _sync(self.device)
            self.seconds.append(time.perf_counter() - self._tick)

    def close(self):
        for handle in self.handles:
            handle.remove()


def _run_assisted(model, target, length, policy, budget, args, device, between) -> dict:
    prompt = prompt_ids(model, length, device)
    kwargs = {"assistant_model": model, "max_new_tokens": args.assisted_tokens, "do_sample": False}
    # A random prompt may end at once on EOS: generate without one (min_new_tokens would add logits processors
    # whose cost, ~2 ms per drafted token on this vocabulary, is not the loop's).
    eos = target.generation_config.eos_token_id, model.generation_config.eos_token_id
    target.generation_config.eos_token_id = model.generation_config.eos_token_id = None
    clock = ForwardClock(model, device)

    def interleave(*_):  # before each verification (the target's forward), outside the drafter's timed rounds
        if target_forwards[0]:  # not before the target's prefill
            clock.paused = True
            between()
            clock.paused = False
        target_forwards[0] += 1

    target_forwards = [0]
    handle = target.register_forward_pre_hook(interleave)
    try:
        if policy == "transformers":
            per_token, drafted, rounds, first = _transformers_assisted(model, target, prompt, kwargs, device)
        else:
            with torch.no_grad():
                target.generate(
                    prompt, cache_implementation="rift", cache_config=policy_config(policy, budget, args), **kwargs
                )
            stats = rift_hf.last_stats(target)
            first = stats.rounds[0]["drafted"]
            rest = stats.rounds[1:]  # the first round holds the drafter's prefill
            drafted = sum(r["drafted"] for r in rest)
            per_token = sum(r["draft_seconds"] for r in rest) / max(1, drafted)
            rounds = len(rest)
    finally:
        clock.close()
        handle.remove()
        target.generation_config.eos_token_id, model.generation_config.eos_token_id = eos
    record = _assisted_record(policy, length, budget, per_token, drafted, rounds)
    # Share of the drafting time spent outside the drafter's forward calls (generate's loop, processors, commits).
    forwards = sum(clock.seconds[first:])
    record["loop_share"] = 1 - forwards / (per_token * drafted) if drafted else None
    return record


def _transformers_assisted(model, target, prompt, kwargs, device):
    """transformers' own assisted generation (DynamicCache drafter): time the drafter's generate calls."""
    seconds, drafted = [], []
    original = type(model).generate

    def timed(self, *a, **k):
        _sync(device)
        tick = time.perf_counter()
        out = original(self, *a, **k)
        _sync(device)
        seconds.append(time.perf_counter() - tick)
        drafted.append(out.sequences.shape[1] - k["input_ids"].shape[1])
        return out

    model.generate = timed.__get__(model)
    try:
        with torch.no_grad():
            target.generate(prompt, **kwargs)
    finally:
        del model.generate
    # The first call holds the drafter's prefill.
    return sum(seconds[1:]) / max(1, sum(drafted[1:])), sum(drafted[1:]), len(seconds) - 1, drafted[0]


def _assisted_record(policy, length, budget, per_token, drafted, rounds) -> dict:
    return {
        "policy": policy,
        "input_tokens": length,
        "budget": budget,
        "mode": "assisted",
        "ms_per_step": 1e3 * per_token,
        "drafted": drafted,
        "rounds": rounds,
    }


def _baseline(base: list[float], times: list[float], baseline: Baseline) -> dict:
    """The interleaved full-cache steps and the record's ratio to them (mean over mean)."""
    return {
        "baseline_context": baseline.context,
        "baseline_ms": 1e3 * statistics.fmean(base),
        "ratio_to_baseline": statistics.fmean(times) / statistics.fmean(base),
    }


def _times(times: list[float]) -> dict:
    return {
        "ms_per_step": 1e3 * statistics.fmean(times),
        "ms_median": 1e3 * statistics.median(times),
        "steps": len(times),
    }


def run_target(target, length, args, device, baseline: Baseline) -> list[dict]:
    """
    The target at `length` tokens of context, from one prefilled cache, `--target-steps` timed forwards of each kind
    (the first of each kind warms up, untimed):
    - `target-step`: a decode step, back to back as the target alone decodes, with drafter baseline steps timed just
      before and just after the block (the scale of its ratio);
    - `target-verify`: a forward of gamma + 1 tokens, what one assisted round costs the target, with a drafter baseline
      step between forwards as drafting comes between verifications.
    """
    from transformers import DynamicCache

    cache = DynamicCache(config=target.config)
    prompt = prompt_ids(target, length, device)
    with torch.no_grad():
        target(input_ids=prompt, past_key_values=cache, use_cache=True)

    def forward(tokens: int, seed: int) -> float:
        ids = prompt_ids(target, tokens + seed, device)[:, -tokens:]
        positions = torch.arange(length, length + tokens, device=device)[None]
        _sync(device)
        tick = time.perf_counter()
        with torch.no_grad():
            target(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True)
        _sync(device)
        cache.crop(length - cache.get_seq_length())
        return time.perf_counter() - tick

    records = []
    for mode, tokens in (("target-step", 1), ("target-verify", args.gamma + 1)):
        forward(tokens, 0)
        if mode == "target-step":
            base = [baseline.step() for _ in range(3)]
            times = [forward(tokens, i + 1) for i in range(args.target_steps)]
            base += [baseline.step() for _ in range(3)]
        else:
            times, base = [], []
            for i in range(args.target_steps):
                base.append(baseline.step())
                times.append(forward(tokens, i + 1))
        records.append({"policy": "target", "input_tokens": length, "budget": None, "mode": mode, "tokens": tokens,
                        **_times(times), **_baseline(base, times, baseline)})  # fmt: skip
    return records


def try_graph(model, prefill, length, budget, args, device) -> dict:
    """Capture one decode step with a rift-stat cache in a CUDA graph; report what blocks it if it fails."""
    cache = rift_hf.RiftCache(model.config, policy_config("rift-stat", budget, args))
    with torch.no_grad():
        load_prefill(cache, prefill)
        cache.get_mask_sizes(1, 0)
        token = prefill.logits[-1:].argmax(-1)[None]
        position = torch.tensor([[length]], device=device)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                model(input_ids=token, position_ids=position, past_key_values=cache, use_cache=True)
            return {"captured": True}
        except Exception as err:  # report, do not stop the session
            return {"captured": False, "error": f"{type(err).__name__}: {str(err)[:400]}"}


def markdown(result: dict) -> str:
    """The step result as markdown: plain steps per policy, then the assisted loop, each with its interleaved ratio."""
    head = (
        f"{result['weights']} drafter, {result['dtype']}, {result['device']} ({result['machine']}, "
        f"{result['threads']} threads), SDPA {result.get('sdpa_backends', 'torch default')}, "
        f"linear layers {result.get('linear', 'torch')}, {result['date']}; "
        f"window {result['window']}, delta {result['delta']} (`python -m benchmarks.step`). Ratio: against a "
        "full-cache step at 1K context timed between the record's own steps (plain) or between its rounds (assisted)."
    )
    records = result["records"]
    lines = [head, ""]
    full = [r for r in records if r["mode"] == "plain" and r["policy"] == "full"]
    if full:
        lines += [
            "Full cache, plain step (not interleaved): "
            + ", ".join(
                f"{r['input_tokens']} ctx {r['ms_per_step']:.1f} ms"
                for r in sorted(full, key=lambda r: r["input_tokens"])
            )
            + ".",
            "",
        ]
    plain = [r for r in records if r["mode"] == "plain" and r["policy"] != "full"]
    if plain:
        rows = [
            [
                r["policy"],
                r["input_tokens"],
                r["budget"],
                f"{r['ms_per_step']:.1f}",
                f"{r['ms_median']:.1f}" if "ms_median" in r else "-",
                f"{r['ratio_to_baseline']:.3f}",
                r["rescorings"],
                f"{r['rescore_ms_total'] / r['rescorings']:.1f}" if r.get("rescorings") else "-",
                f"{100 * r['rescore_share']:.2f}%",
            ]  # fmt: skip
            for r in sorted(plain, key=lambda r: (r["policy"], r["input_tokens"], r["budget"]))
        ]
        headers = ["policy", "input", "budget", "ms/step", "median ms", "x full step at 1K", "rescorings",
                   "ms/rescoring", "rescoring share"]  # fmt: skip
        lines.append(pipe_table(headers, rows))
        lines.append("")
    refresh = [r for r in records if r["mode"] == "refresh"]
    if refresh:
        lines += [
            "A refresh (all layers), alternating in one decode run: every layer in one stacked call vs one per layer:",
            "",
        ]
        rows = [
            [r["policy"], r["input_tokens"], r["budget"], r["layers"], f"{r['ms_per_step']:.1f}",
             f"{r['per_layer_ms']:.1f}", f"{r['per_layer_ms'] / r['ms_per_step']:.2f}x", sum(r["refreshes"])]
            for r in sorted(refresh, key=lambda r: (r["policy"], r["input_tokens"], r["budget"]))
        ]  # fmt: skip
        headers = ["policy", "input", "budget", "layers", "stacked ms", "per-layer ms", "speed-up", "refreshes"]
        lines.append(pipe_table(headers, rows))
        lines.append("")
    compiled = [r for r in records if r["mode"] == "compiled"]
    if compiled:
        lines += ["A drafter step eager and compiled (`compile=True`), one of each in turn from one prefill:", ""]
        rows = [
            [r["policy"], r["input_tokens"], r["budget"], f"{r['eager_ms_per_step']:.1f}", f"{r['ms_median']:.1f}",
             f"{r['compiled_over_eager']:.3f}", f"{r['warmup_seconds']:.0f}", "yes" if r["same_tokens"] else "no"]
            for r in sorted(compiled, key=lambda r: (r["policy"], r["input_tokens"], r["budget"]))
        ]  # fmt: skip
        headers = ["policy", "input", "budget", "eager ms", "compiled ms", "compiled / eager", "warm-up s",
                   "same tokens"]  # fmt: skip
        lines.append(pipe_table(headers, rows))
        lines.append("")
    assisted = [r for r in records if r["mode"] == "assisted"]
    if assisted:
        lines += [
            "Through the assisted loop (ms per drafted token, drafter only; loop: time outside its forwards):",
            "",
        ]
        # transformers' own loop with a full cache at the baseline's context, where measured: what the loop costs
        # over a plain step before any cache does anything (each record over it, both ratios to their own steps).
        loop = next(
            (r for r in assisted if r["policy"] == "transformers" and r["input_tokens"] == r["baseline_context"]),
            None,
        )
        rows = [
            [
                r["policy"],
                r["input_tokens"],
                r["budget"] or "-",
                f"{r['ms_per_step']:.1f}",
                f"{r['ratio_to_baseline']:.3f}",
                *([f"{r['ratio_to_baseline'] / loop['ratio_to_baseline']:.3f}"] if loop else []),
                "-" if r.get("loop_share") is None else f"{100 * r['loop_share']:.1f}%",
                r["drafted"],
            ]  # fmt: skip
            for r in assisted
        ]
        headers = ["cache", "input", "budget", "ms/drafted token", "x full step at 1K"]
        headers += [f"x transformers' loop at {loop['input_tokens']}"] if loop else []
        lines.append(pipe_table(headers + ["loop share", "drafted"], rows))
        lines.append("")
    target = {(r["mode"], r["input_tokens"]): r for r in records if r["policy"] == "target"}
    if target:
        lines += [
            "The target alone (sdpa, full cache): "
            + ", ".join(
                f"{n} ctx: step {target['target-step', n]['ms_per_step']:.1f} ms, verification of "
                f"{target['target-verify', n]['tokens']} tokens {target['target-verify', n]['ms_per_step']:.1f} ms"
                for n in sorted({n for _, n in target})
                if ("target-step", n) in target and ("target-verify", n) in target
            )
            + ".",
            "",
        ]
    return "\n".join(lines)


def key(record: dict) -> tuple:
    return record["mode"], record["policy"], record["input_tokens"], record["budget"], record.get("tokens")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    parser.add_argument("--contexts", type=ints, default=[1024, 2048, 4096, 8192, 16384], help="full-cache contexts")
    parser.add_argument("--inputs", type=ints, default=[4096, 8192, 16384], help="input lengths for the policies")
    parser.add_argument("--budgets", type=ints, default=[1024, 2048], help="budgets in tokens")
    parser.add_argument("--policies", default="swa,snapkv,rift-stat,rift-dyn,rift-ada", help="comma-separated")
    parser.add_argument("--steps", type=int, default=160, help="decode steps timed per record (>= delta)")
    parser.add_argument("--window", type=int, default=64, help="observation window")
    parser.add_argument("--delta", type=int, default=128, help="rift-dyn rescoring interval")
    parser.add_argument("--assisted-inputs", type=ints, default=[4096, 8192], help="input lengths, assisted part")
    parser.add_argument("--assisted-policies", default="full,rift-stat,rift-dyn,transformers", help="assisted part")
    parser.add_argument("--assisted-budget", type=int, default=1024, help="budget of the assisted part")
    parser.add_argument(
        "--assisted-tokens", type=int, default=160, help="new tokens per assisted run (> delta, so rift-dyn rescores)"
    )
    parser.add_argument("--parts", default="full,plain,assisted,target,graph", help="which parts to run")
    parser.add_argument(
        "--compiled-policies", default="rift-stat,page-round", help="policies of the compiled part (eager vs compiled)"
    )
    parser.add_argument("--target-inputs", type=ints, default=[4096], help="input lengths, target part")
    parser.add_argument("--target-steps", type=int, default=8, help="timed forwards per record, target part")
    parser.add_argument("--gamma", type=int, default=8, help="drafted tokens per round (constant), assisted part")
    parser.add_argument("--baseline-context", type=int, default=1024, help="context of the interleaved full step")
    parser.add_argument(
        "--sdpa-backends",
        help="restrict torch's SDPA to these backends (comma-separated: flash, efficient, cudnn, math), e.g. to see "
        "what a backend that plans per shape costs a cache whose length changes every step",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="drafter and target dtype; auto: bfloat16 on a GPU or a CPU with native bf16, else float32",
    )
    parser.add_argument(
        "--linear",
        default="torch",
        choices=LINEARS,
        help="weight-major: small-batch linear layers as weight @ x.T on a CPU (rift_hf.speedups.weight_major_linear)",
    )
    parser.add_argument("--random-weights", action="store_true", help="random weights at the drafter's shapes")
    parser.add_argument("--dry-run", action="store_true", help="tiny model, tiny lengths (CI)")
    parser.add_argument("--out", type=Path, help="result file (default benchmarks/results/step-<device>.json)")
    parser.add_argument("--table", type=Path, help="print an existing result file as markdown, measure nothing")
    parser.add_argument("--readme", type=Path, help="with --table: also write it into this file's block")
    parser.add_argument("--block", default="step-cpu", help="with --readme: the <!-- NAME:start --> block to fill")
    args = parser.parse_args(argv)
    if args.table:
        from lab.tables import write_into_readme

        text = markdown(json.loads(args.table.read_text()))
        print(text)
        if args.readme:
            write_into_readme(text, args.readme, args.block)
        return
    if args.dry_run:
        args.contexts, args.inputs, args.budgets, args.assisted_inputs = [64, 128], [128], [48], [96]
        args.steps, args.window, args.delta, args.assisted_tokens, args.assisted_budget = 6, 8, 4, 8, 48
        args.baseline_context, args.gamma, args.target_inputs, args.target_steps = 64, 3, [96], 2
    parts = set(args.parts.split(","))
    device = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    dtype = torch.float32 if args.dry_run else resolve_dtype(args.dtype, device.type)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    tag = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()
    path = args.out or Path("benchmarks/results") / f"step-{'dry-run' if args.dry_run else tag}.json"
    result = json.loads(path.read_text()) if path.exists() else {"records": []}
    if result["records"] and result.get("dtype") != str(dtype).split(".")[-1]:
        raise SystemExit(
            f"{path} holds {result.get('dtype')} records and this run is {str(dtype).split('.')[-1]}: pass --dtype "
            f"{result.get('dtype')} to add to it, or --out a new file."
        )
    if result["records"] and result.get("linear", "torch") != args.linear:
        raise SystemExit(
            f"{path} holds records with {result.get('linear', 'torch')} linear layers and this run uses "
            f"{args.linear}: pass --linear {result.get('linear', 'torch')} to add to it, or --out a new file."
        )
    done = {key(r) for r in result["records"]}
    if args.sdpa_backends:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        names = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION"}
        backends = [getattr(SDPBackend, names.get(n, n.upper())) for n in args.sdpa_backends.split(",")]
        args.sdpa_guard = sdpa_kernel(backends)  # kept: a discarded context manager restores the backends
        args.sdpa_guard.__enter__()  # for the whole process
    model, weights = load_drafter(args, device, dtype)
    use_linear(model, args.linear)
    baseline = Baseline(
        model,
        record_prompt_forward(model, prompt_ids(model, args.baseline_context, device), args.window),
        args.baseline_context,
        device,
    )
    result.update(
        {
            "device": name,
            "dtype": str(dtype).split(".")[-1],
            "threads": torch.get_num_threads(),
            "date": datetime.date.today().isoformat(),
            "weights": weights,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "window": args.window,
            "delta": args.delta,
            "gamma": args.gamma,
            "sdpa_backends": args.sdpa_backends or "torch default",
            "linear": args.linear,
            "command": "python -m benchmarks.step " + " ".join(argv if argv is not None else os.sys.argv[1:]),
        }
    )

    def save(record: dict) -> None:
        result["records"] = [r for r in result["records"] if key(r) != key(record)] + [record]  # a rerun replaces
        done.add(key(record))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        ratio = record.get("ratio_to_baseline")
        tqdm.write(
            f"{record['mode']:8} {record['policy']:12} {record['input_tokens']:6} {record['budget']}: "
            f"{record['ms_per_step']:.2f} ms/step" + (f", {ratio:.3f}x the interleaved full step" if ratio else "")
        )

    policies = split_labels(args.policies)
    # One prompt forward per input length, shared by every cache of that length; each full-cache context reads the
    # first tokens of the shortest prefill that covers it (a causal model's states do not depend on later tokens).
    plain_lengths = args.inputs if parts & {"plain", "refresh", "compiled"} else []
    full_contexts = args.contexts if "full" in parts else []
    lengths = sorted(set(plain_lengths) | ({max(full_contexts)} if full_contexts else set()))
    for length in tqdm(lengths, desc="prefills"):
        shorter = [x for x in lengths if x < length]
        todo_full = [
            c
            for c in full_contexts
            if ("plain", "full", c, None, None) not in done and c <= length and not any(c <= x for x in shorter)
        ]
        todo = [
            (mode, p, b)
            for mode in ("plain", "refresh", "compiled")
            if mode in parts
            for p in (split_labels(args.compiled_policies) if mode == "compiled" else policies)
            for b in args.budgets
            if length in plain_lengths and b < length and (mode, p, length, b, None) not in done
            and (mode != "refresh" or stacks_layers(p, b, length, args))
        ]  # fmt: skip
        if not todo_full and not todo:
            continue
        prefill = record_prompt_forward(model, prompt_ids(model, length, device), args.window)
        for context in todo_full:
            save(run_full(model, prefill, context, args, device))
        for mode, policy, budget in todo:
            if mode == "plain":
                save(run_policy(model, prefill, length, policy, budget, args, device, baseline))
            elif mode == "compiled":
                save(run_compiled(model, prefill, length, policy, budget, args, device))
            else:
                save(run_refresh(model, prefill, length, policy, budget, args, device))
        del prefill
    if "graph" in parts and device.type == "cuda":
        length = args.inputs[0]
        prefill = record_prompt_forward(model, prompt_ids(model, length, device), args.window)
        result["cuda_graph"] = try_graph(model, prefill, length, args.budgets[0], args, device)
        path.write_text(json.dumps(result, indent=2) + "\n")
    if "assisted" in parts:
        target = None
        for length in args.assisted_inputs:
            for policy in split_labels(args.assisted_policies):
                budget = None if policy == "transformers" else args.assisted_budget
                if ("assisted", policy, length, budget, None) in done:
                    continue
                if target is None:
                    from rift_hf.models import fix_draft_length

                    target, _ = load_drafter(args, device, dtype)
                    if weights == "random":
                        target.load_state_dict(model.state_dict())  # the drafter's copy: (nearly) every draft accepted
                    fix_draft_length(model, target, gamma=args.gamma)
                    use_linear(target, args.linear)
                budget = None if policy == "transformers" else args.assisted_budget
                save(run_assisted(model, target, length, policy, budget, args, device, baseline))
    if "target" in parts:
        todo = [n for n in args.target_inputs if ("target-verify", "target", n, None, args.gamma + 1) not in done]
        if todo:
            real_target = load_target(args, device, dtype)
            use_linear(real_target, args.linear)
            for length in todo:
                for record in run_target(real_target, length, args, device, baseline):
                    save(record)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
