"""
Compiled drafting (`RiftConfig(compile=True)`): the drafter's one-token forward over its fixed-size working set,
compiled once by `torch.compile` and replayed for every drafting step.

Once every compressed layer has made its first selection, a layer's working set is a buffer of fixed capacity
(sinks and selection, the recent ring, room for one round of drafts) of which the first `length` rows are used. A
drafting step writes one row at `length` and attends rows `[0, length]`. So the step is a function of tensors of
fixed shape: the token, its position, the write index, and the layers' key/value buffers. `CompiledStep` compiles
that function (`fullgraph=True`, static shapes; inductor on a CPU, CUDA graphs with `mode="reduce-overhead"` on a
GPU) and `CompiledDrafting` routes the drafter's forwards to it while a round drafts. What changes between steps (the
write index, the position, the mask built from the index) is a tensor input, so steps and rounds replay one graph.

Everything else stays eager and in Python: the round's first forward (it re-feeds verified tokens), commits and
refreshes (which rebuild the working set in place, at the same capacity), the bookkeeping after each step (lengths,
positions, the store's copy of the new row, the recorded queries), and any forward the step cannot take (a prompt
shorter than the budget, a round longer than the headroom). `CompiledDrafting.compiles` and `.eager` count both.

It applies to the policies whose working set has a fixed size (not `full`, `page-retrieval` or `snapkv_grow`),
without `kv_dtype`, `attend_in_place` or `track_attention_mass`, and to drafters whose every layer is full attention;
`RiftConfig(compile=True)` refuses the others, naming why.
"""

from __future__ import annotations

import functools

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from .._compat import CACHE, pop_cache
from ..cache import RiftCache, RiftLayer

# The attention backends whose mask argument the step's additive `[1, 1, 1, capacity]` mask suits.
BACKENDS = ("rift", "sdpa", "eager")


def check_compilable(model, cache: RiftCache) -> None:
    """Raise a `ValueError` naming the fix when `model` with `cache` cannot draft through a compiled step."""
    if len(cache.rift_layers) != len(cache.layers):
        kinds = {type(layer).__name__ for layer in cache.layers if not isinstance(layer, RiftLayer)}
        raise ValueError(
            f"compile=True needs a drafter whose every layer is full attention; {type(model).__name__} also has "
            f"{', '.join(sorted(kinds))} layers. Drop compile=True for this drafter."
        )
    backend = model.config._attn_implementation
    if backend not in BACKENDS:
        raise ValueError(
            f"compile=True runs the drafter's attention with an additive mask, which the {backend!r} backend does not "
            f"take; load the drafter with attn_implementation='sdpa' (or drop compile=True)."
        )


class _View:
    """The cache as the compiled forward sees it: `update` writes the new row at `index` of each layer's buffer and
    returns the whole buffer (rows past the index are masked)."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], index: torch.Tensor):
        self.keys, self.values, self.index = keys, values, index

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        self.keys[layer_idx].index_copy_(2, self.index, key_states)
        self.values[layer_idx].index_copy_(2, self.index, value_states)
        return self.keys[layer_idx], self.values[layer_idx]


class CompiledStep:
    """One drafter's compiled one-token forward: `(token, position, index, keys, values) -> (logits, queries)`."""

    def __init__(self, model):
        self.forward = model.forward  # the bound method, before any `CompiledDrafting` replaces it
        self.layers = model.config.get_text_config(decoder=True).num_hidden_layers
        mode = "reduce-overhead" if model.device.type == "cuda" else None
        self.compiled = torch.compile(self._step, fullgraph=True, dynamic=False, mode=mode)
        self.compiles = 0

    def _step(self, input_ids, position_ids, index, keys, values, record: bool):
        capacity = keys[0].shape[2]
        visible = torch.arange(capacity, device=index.device) <= index
        dtype = keys[0].dtype
        mask = torch.zeros((), dtype=dtype, device=index.device).masked_fill(~visible, torch.finfo(dtype).min)
        queries: dict | None = {} if record else None
        out = self.forward(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=mask.view(1, 1, 1, capacity),
            use_cache=True,
            **{CACHE: _View(keys, values, index)},
            rift_queries=queries,
        )
        recorded = [queries[i] for i in range(self.layers)] if record else []
        return out.logits, recorded

    def __call__(self, *args):
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        out = self.compiled(*args)
        self.compiles += torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
        return out


def compiled_step(model) -> CompiledStep:
    """The drafter's `CompiledStep`, shared by every generate call on it: made on first use and kept on the drafter
    itself (it holds the drafter's bound forward, so a table keyed by the drafter would keep it alive forever)."""
    step = model.__dict__.get("_rift_compiled_step")
    if step is None:
        step = model.__dict__["_rift_compiled_step"] = CompiledStep(model)
    return step


class CompiledDrafting:
    """
    While entered, route `model`'s one-token forwards over `cache` through its compiled step (when the working sets
    allow one); every other forward runs eagerly. A context manager around the drafting of a round.

    Example:

    ```python
    >>> with CompiledDrafting(drafter, cache) as drafting:
    ...     drafter.generate(ids, past_key_values=cache, max_new_tokens=8)
    >>> drafting.steps, drafting.eager
    ```
    """

    def __init__(self, model, cache: RiftCache):
        check_compilable(model, cache)
        self.model, self.cache = model, cache
        self.step = compiled_step(model)
        self._compiles_before = self.step.compiles
        self.steps = 0  # forwards through the compiled step
        self.eager = 0  # drafting forwards that could not take it (before the first compression, past the headroom)
        device = model.device
        self._position = torch.zeros(1, 1, dtype=torch.long, device=device)
        self._index = torch.zeros(1, dtype=torch.long, device=device)

    @property
    def compiles(self) -> int:
        """Graphs compiled since this object was made: one per working-set shape the drafter had not met before."""
        return self.step.compiles - self._compiles_before

    def __enter__(self):
        self._saved = self.model.__dict__.get("forward")  # an instance forward (accelerate's hooks) comes back after

        @functools.wraps(self.step.forward)  # generate reads the forward's signature
        def forward(*args, **kwargs):
            return self._forward(*args, **kwargs)

        self.model.forward = forward
        return self

    def __exit__(self, *exc):
        if self._saved is None:
            del self.model.forward  # the class's own forward again
        else:
            self.model.forward = self._saved
        return False

    def _fits(self, input_ids, given, kwargs) -> bool:
        cache = self.cache
        if (
            given is not cache
            or input_ids is None
            or input_ids.shape != (1, 1)
            or cache._awaiting_verified  # the round's first forward re-feeds verified tokens
            or kwargs.get("inputs_embeds") is not None
            or kwargs.get("output_attentions")
            or kwargs.get("output_hidden_states")
        ):
            return False
        cache.begin_forward()  # the commit the mask's sizing would make in an eager forward (may refresh)
        first = cache.rift_layers[0].working
        return (
            all(
                layer.compressed
                and layer.working.length == first.length
                and layer.working.capacity == first.capacity
                and layer.working.keys is not None
                for layer in cache.rift_layers
            )
            and first.length < first.capacity
        )

    def _forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
        given = pop_cache(kwargs)  # `past_key_values` before transformers 5.24, `cache` from it on
        drafting = given is self.cache and not self.cache._awaiting_verified
        if not self._fits(input_ids, given, kwargs):
            if drafting and input_ids is not None and input_ids.shape[-1] == 1:
                self.eager += 1
            return self.step.forward(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                **{CACHE: given},
                **kwargs,
            )
        cache, layers = self.cache, self.cache.rift_layers
        at, seen = layers[0].working.length, layers[0].seen
        self._index.fill_(at)
        if position_ids is None:
            self._position.fill_(seen)
        else:
            self._position.copy_(position_ids)
        keys = [layer.working.keys for layer in layers]
        values = [layer.working.values for layer in layers]
        logits, queries = self.step(input_ids, self._position, self._index, keys, values, cache.records_queries)
        if logits.device.type == "cuda":
            logits = logits.clone()  # a CUDA graph's output is overwritten by its next replay; generate keeps scores
        self.steps += 1
        for i, layer in enumerate(layers):  # what `RiftLayer.update` and `observe` record for an eager step
            working = layer.working
            working.positions[:, at].fill_(seen)
            working.length = at + 1
            if layer.store is not None:
                layer.store.append(working.keys[:, :, at : at + 1], working.values[:, :, at : at + 1])
            layer.seen = seen + 1
            if queries:
                layer.recent_queries.append(queries[i].detach())
        return CausalLMOutputWithPast(logits=logits, **{CACHE: cache})
