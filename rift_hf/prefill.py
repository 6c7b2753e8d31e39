"""Prompt forwards recorded once and handed to any number of caches: replay and decode-phase runs start from them.

A long prompt's forward costs minutes on a CPU (a 32K prompt: ~25 minutes for the 1.5B target, ~8 for the 0.5B
drafter) while the runs that compare policies differ only after it. `record_prompt_forward` runs it once and keeps what
the forward handed to `Cache.update` (per layer) and, on the "rift" attention backend, the last queries each
full-attention layer saw; `load_prefill` hands those records to a fresh cache in the order a forward would, so the cache
then holds exactly what its own prompt forward would have left. Until its first commit a policy changes nothing in what
a forward computes, so one record serves every policy.

`PromptCache` pairs the target's record (the prompt without its last token, the state a decode step continues from)
with the drafter's (the whole prompt, with its last logits, the state the first drafting round starts from), and
saves/loads them as safetensors files.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ._compat import CACHE
from .cache import ACTIVE_LAYER, RiftCache
from .config import RiftConfig


def prompt_digest(input_ids: torch.Tensor) -> str:
    """A short digest of token ids, keying what was computed for a prompt (target outputs, prompt caches)."""
    return hashlib.sha256(input_ids.detach().cpu().to(torch.int64).numpy().tobytes()).hexdigest()[:16]


def prefills_root() -> Path:
    """Where prompt caches are kept by default: `$RIFT_HF_HOME/prefills` (`~/.cache/rift-hf/prefills`)."""
    import os

    return Path(os.environ.get("RIFT_HF_HOME", Path.home() / ".cache" / "rift-hf")) / "prefills"


def prefill_folder(root: Path, preset: str, prompt, dtype: torch.dtype) -> Path:
    """The folder of a prompt's cache (`PromptCache.save`): keyed by model preset, prompt name and digest, dtype."""
    safe = prompt.name.replace(":", "-").replace("/", "-")
    return Path(root) / preset / f"{safe}-{prompt_digest(prompt.input_ids)}-{str(dtype).removeprefix('torch.')}"


@dataclass
class Prefill:
    """One model's prompt forward, recorded once and handed to every cache that starts from it (`load_prefill`)."""

    logits: torch.Tensor  # [1, vocab] at the last prompt position
    states: dict  # layer index -> (key_states, value_states) as the forward handed them to `Cache.update`
    queries: dict  # full-attention layer index -> (last queries, scale, sinks) as the "rift" backend observed them
    backend: str  # the model's attention implementation during the capture
    seconds: float | None = None  # the forward's wall-clock time
    # Which pass made it: "whole" (one forward over the whole prompt, the only kind recorded). A policy that reads the
    # prompt in chunks (`prompt_chunk`) never starts from such a record: it reads the prompt itself.
    made_by: str = "whole"

    @property
    def tokens(self) -> int:
        key, _ = next(iter(self.states.values()))
        return key.shape[-2]

    def serves(self, model, window: int) -> bool:
        """Whether a policy with observation window `window`, on `model`'s current attention backend, can start from
        this record (it holds the queries such a policy scores the prompt with)."""
        return self.backend == model.config._attn_implementation and all(
            q.shape[2] >= min(window, self.tokens) for q, _, _ in self.queries.values()
        )


def record_prompt_forward(model, prompt: torch.Tensor, window: int, mask: torch.Tensor | None = None) -> Prefill | None:
    """
    Run `model` over `prompt` (`[1, T]`, an optional 2-D padding `mask`) once and record what its cache received: the
    states of every layer and, on the "rift" backend, each full-attention layer's last `window` queries. Returns None
    for models with recurrent (linear-attention, SSM, conv) states, which do not pass through `Cache.update`.
    """
    cache = RiftCache(model.config, RiftConfig(policy="full"))
    if cache.state_layers:
        return None
    cache.activate_past_recording()
    states, queries = {}, {}
    update = cache.update

    def recording_update(key_states, value_states, layer_idx, *args, **kwargs):
        states[layer_idx] = (key_states, value_states)
        return update(key_states, value_states, layer_idx, *args, **kwargs)

    cache.update = recording_update
    for layer in cache.rift_layers:

        def observe(query, key, scale, sinks, layer_idx=layer.layer_idx):
            queries[layer_idx] = (query[:, :, -window:].clone(), scale, sinks)

        layer.observe = observe
    prompt = prompt.to(model.device)
    kwargs = {} if mask is None else {"attention_mask": mask.to(model.device)}
    tick = time.perf_counter()
    with torch.no_grad():
        logits = model(
            input_ids=prompt,
            position_ids=torch.arange(prompt.shape[1], device=model.device)[None],
            **{CACHE: cache},
            use_cache=True,
            logits_to_keep=1,
            return_dict=True,
            **kwargs,
        ).logits[0]
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
    seconds = time.perf_counter() - tick
    backend = model.config._attn_implementation
    return Prefill(logits=logits, states=states, queries=queries, backend=backend, seconds=seconds)


def load_prefill(cache, prefill: Prefill) -> None:
    """
    Hand `prefill`'s records to a fresh `cache` in the order a forward would (update, then the backend's observe).
    A `RiftCache` then holds what its own prompt forward would have left; any other `Cache` (`DynamicCache`) gets
    the states.
    """
    for layer_idx, (key_states, value_states) in sorted(prefill.states.items()):
        keys, _ = cache.update(key_states, value_states, layer_idx)
        if layer_idx in prefill.queries and isinstance(cache, RiftCache):
            layer = cache.layers[layer_idx]
            logged = len(layer.mass_log)
            layer.observe(*prefill.queries[layer_idx][:1], keys, *prefill.queries[layer_idx][1:])
            # Only the last queries were recorded, which the attention-mass measurement would take for decode steps;
            # the real prompt forward logs nothing.
            del layer.mass_log[logged:]
    ACTIVE_LAYER.set(None)


def save_prefill(prefill: Prefill, path: Path, **meta) -> None:
    """Write a record as one safetensors file (tensors; backend, scales, seconds and `meta` in its metadata)."""
    from safetensors.torch import save_file

    tensors = {"logits": prefill.logits.contiguous()}
    for i, (key, value) in prefill.states.items():
        tensors[f"states.{i}.key"], tensors[f"states.{i}.value"] = key.contiguous(), value.contiguous()
    scales = {}
    for i, (query, scale, sinks) in prefill.queries.items():
        tensors[f"queries.{i}"] = query.contiguous()
        if sinks is not None:
            tensors[f"sinks.{i}"] = sinks.detach().contiguous()
        scales[i] = scale
    info = {"backend": prefill.backend, "seconds": prefill.seconds, "scales": scales, "pass": prefill.made_by, **meta}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"rift_hf": json.dumps(info)})
    tmp.replace(path)


def load_prefill_file(path: Path, device: torch.device | str = "cpu") -> tuple[Prefill, dict]:
    """A record written by `save_prefill`, and the metadata it was saved with."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device=str(device)) as handle:
        info = json.loads(handle.metadata()["rift_hf"])
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (not a dict)
    states, queries = {}, {}
    for name, tensor in tensors.items():
        kind, _, rest = name.partition(".")
        if kind == "states":
            index, part = rest.split(".")
            pair = states.setdefault(int(index), [None, None])
            pair[part == "value"] = tensor
        elif kind == "queries":
            queries[int(rest)] = (tensor, info["scales"][rest], tensors.get(f"sinks.{rest}"))
    prefill = Prefill(
        logits=tensors["logits"],
        states={i: tuple(pair) for i, pair in sorted(states.items())},
        queries=dict(sorted(queries.items())),
        backend=info["backend"],
        seconds=info["seconds"],
        made_by=info.get("pass", "whole"),  # records saved before passes were named are whole ones
    )
    return prefill, info


@dataclass
class PromptCache:
    """
    A prompt's two forwards, computed once for any number of decode-phase runs (`rift_hf.generation.decode`).

    Attributes:
        input_ids: `[1, P]`, the prompt.
        target: the target's forward over `input_ids[:, :-1]`; a run feeds the last prompt token as its first
            decode step (greedy output then equals plain `generate`'s up to the rounding of one chunk boundary).
        draft: the drafter's forward over the whole prompt, with its last logits (the first draft comes from them)
            and, on the "rift" backend, the last queries every scoring policy needs; None without a drafter.
    """

    input_ids: torch.Tensor
    target: Prefill
    draft: Prefill | None = None

    @classmethod
    def compute(cls, target, input_ids: torch.Tensor, draft=None, window: int = 64) -> PromptCache:
        """
        Record the target's forward over `input_ids[:, :-1]` and the drafter's over `input_ids` (`[1, P]`, P >= 2).
        The drafter is switched to the "rift" attention backend first (its arithmetic is sdpa's), so the record holds
        the last `window` queries that scoring policies select with.
        """
        if input_ids.ndim != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 2:
            raise ValueError(
                f"A prompt cache needs one prompt of at least 2 tokens, `[1, P]`; got {tuple(input_ids.shape)}."
            )
        pad = target.generation_config.pad_token_id
        if pad is not None and bool((input_ids == pad).any()):
            raise ValueError(
                f"The prompt holds the pad token ({pad}), which generate would mask as padding; a prompt cache records "
                "unpadded prompts only: remove it from the prompt."
            )
        recorded = record_prompt_forward(target, input_ids[:, :-1], window)
        if recorded is None:
            raise ValueError(
                f"{type(target).__name__} keeps recurrent (linear-attention, SSM or conv) states, which a prompt cache "
                "cannot record; run it with plain generate."
            )
        prefill = None
        if draft is not None:
            from .attention import use_rift_attention

            use_rift_attention(draft, RiftConfig(policy="rift-stat", window=window))
            prefill = record_prompt_forward(draft, input_ids, window)
            if prefill is None:
                raise ValueError(
                    f"{type(draft).__name__} keeps recurrent (linear-attention, SSM or conv) states, which a prompt "
                    "cache cannot record; use a drafter with attention layers only."
                )
        return cls(input_ids=input_ids.cpu(), target=recorded, draft=prefill)

    def save(self, folder: Path, **meta) -> None:
        """Write `target.safetensors` (and `draft.safetensors`) into `folder`, with the prompt and `meta`."""
        meta = {**meta, "prompt_sha": prompt_digest(self.input_ids), "input_ids": self.input_ids[0].tolist()}
        save_prefill(self.target, Path(folder) / "target.safetensors", **meta)
        if self.draft is not None:
            save_prefill(self.draft, Path(folder) / "draft.safetensors", **meta)

    @classmethod
    def load(cls, folder: Path, device: torch.device | str = "cpu", draft: bool = True) -> PromptCache:
        """A prompt cache written by `save` (the drafter's record too, unless `draft=False`)."""
        folder = Path(folder)
        if not (folder / "target.safetensors").is_file():
            raise FileNotFoundError(f"No prompt cache in {folder} (no target.safetensors); compute it and `save` it.")
        target, info = load_prefill_file(folder / "target.safetensors", device)
        recorded = None
        if draft and (folder / "draft.safetensors").is_file():
            recorded, _ = load_prefill_file(folder / "draft.safetensors", device)
        return cls(input_ids=torch.tensor([info["input_ids"]], dtype=torch.long), target=target, draft=recorded)
