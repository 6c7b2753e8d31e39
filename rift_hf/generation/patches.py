"""Every patch of transformers that rift_hf applies, in one place (written against transformers 5.23; see `_compat`).

transformers has no registry for `cache_implementation` names nor a `candidate_generator=` argument, so
`import rift_hf` adds "rift" to the valid names and wraps three `GenerationMixin` methods
(`_prepare_cache_for_generation`, `_get_candidate_generator`, `_validate_generation_mode`). Each wrapper handles
`cache_implementation="rift"` and delegates everything else, unchanged, to the original. The only other patch is
per instance and opt-in: a stateful target's `forward` / `prepare_inputs_for_generation` wrappers (`stateful.py`),
installed the first time such a target runs with rift, and transparent for every other call.
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path

from transformers import DynamicCache, StaticCache
from transformers.generation import configuration_utils
from transformers.generation.candidate_generator import AssistedCandidateGenerator
from transformers.generation.configuration_utils import GenerationMode
from transformers.generation.utils import GenerationMixin

from .._compat import CACHE
from ..attention import use_rift_attention
from ..cache import RiftCache
from ..config import RiftConfig
from ..prefill import load_prefill
from .candidate import RiftCandidateGenerator
from .decode import recorded_draft
from .recorded import RecordedPromptGenerator
from .stateful import VerifierCache, needs_verifier, verifier_cache
from .stats import RiftStats

NAME = "rift"
_ORIGINALS: dict[str, object] = {}
# model -> {thread id: the last call's RiftStats}: calls in different threads on the same model keep their own.
_LAST_STATS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _set_stats(model, stats: RiftStats | None) -> None:
    per_thread = _LAST_STATS.setdefault(model, {})
    if stats is None:
        per_thread.pop(threading.get_ident(), None)
    else:
        per_thread[threading.get_ident()] = stats


_RIFT_KEYS = {"policy", "budget", "rho", "delta"}


def last_stats(model) -> RiftStats | None:
    """
    Statistics of the last `generate(..., cache_implementation="rift")` call on `model` (the target) made in this
    thread: calls running in other threads on the same model keep their own.

    >>> out = target.generate(ids, assistant_model=draft, cache_implementation="rift", cache_config={"budget": 512})
    >>> rift_hf.last_stats(target).acceptance_length
    """
    return _LAST_STATS.get(model, {}).get(threading.get_ident())


def rift_config_of(generation_config, model) -> RiftConfig:
    """The call's `cache_config` as a `RiftConfig`. A dict (the user's, or one a model's `generation_config.json`
    carried) may name a selection head only inside the model's own folder, as a saved `rift_config.json` may; a
    `RiftConfig` made in code names any file."""
    value = generation_config.cache_config
    head = value.get("selection_head") if isinstance(value, dict) else None
    if not head:
        return RiftConfig.coerce(value)
    folder = Path(str(getattr(model, "name_or_path", "") or ""))
    if not folder.is_dir():
        raise ValueError(
            f"cache_config names selection_head {head!r}, but {type(model).__name__} was not loaded from a local "
            "folder to read it from; pass cache_config=RiftConfig(selection_head=...) made in your own code, or "
            "RiftConfig.from_pretrained(<folder>) for a head saved beside its config."
        )
    return RiftConfig.coerce(value, folder=folder)


def _looks_like_rift(cache_config) -> bool:
    return isinstance(cache_config, RiftConfig) or (
        isinstance(cache_config, dict) and bool(_RIFT_KEYS & set(cache_config))
    )


def _check_request(generation_config, model_kwargs) -> None:
    """Everything about a `cache_implementation="rift"` call that can be refused before any forward runs."""
    for name in ("num_beams", "num_return_sequences"):
        value = getattr(generation_config, name, None) or 1
        if value > 1:
            raise ValueError(
                f"cache_implementation='rift' decodes one sequence per prompt, got {name}={value}; drop `{name}` (or "
                "call generate once per sequence)."
            )
    for name in ("prompt_lookup_num_tokens", "assistant_early_exit"):
        if getattr(generation_config, name, None) is not None:
            raise ValueError(
                f"cache_implementation='rift' compresses a drafter model's cache, but `{name}` drafts without one "
                f"(rift would be silently unused); drop `{name}`, or pass assistant_model= to draft with a model."
            )
    mask = model_kwargs.get("attention_mask")
    if mask is not None and mask.ndim == 2 and mask.shape[-1] and not bool(mask[:, 0].all()):
        raise ValueError(
            "cache_implementation='rift' takes one unpadded prompt, but the attention_mask starts with padding; pass "
            "the prompt without padding (batch size 1 needs none)."
        )


def _prepare_cache_for_generation(self, generation_config, model_kwargs, generation_mode, batch_size, max_cache_length):
    original = _ORIGINALS["_prepare_cache_for_generation"]
    user_cache = model_kwargs.get(CACHE)
    compressing = isinstance(user_cache, RiftCache) and not isinstance(user_cache, VerifierCache)
    assisted_target = generation_mode == GenerationMode.ASSISTED_GENERATION and not generation_config.is_assistant
    if assisted_target and compressing:
        raise ValueError(
            "In assisted generation only the drafter's cache is compressed, so a RiftCache cannot be the target's "
            f"`{CACHE}`; drop it and pass cache_implementation='rift' (and cache_config=...) instead."
        )
    if compressing and not generation_config.is_assistant:
        rift_config = user_cache.config
        if (rift_config.is_scored or rift_config.track_attention_mass) and self.config._attn_implementation != NAME:
            raise ValueError(
                f"This RiftCache's policy {rift_config.policy!r} scores with the queries only the 'rift' attention "
                f"backend hands it, but the model runs {self.config._attn_implementation!r}; call "
                "model.set_attn_implementation('rift') first, or pass cache_implementation='rift' instead of a cache."
            )
    if generation_config.cache_implementation != NAME:
        if _looks_like_rift(generation_config.cache_config):
            raise ValueError(
                "`cache_config` holds a RIFT config but `cache_implementation` is not 'rift': pass "
                "cache_implementation='rift' to generate (or set it on the GenerationConfig)."
            )
        return original(self, generation_config, model_kwargs, generation_mode, batch_size, max_cache_length)
    if not generation_config.is_assistant:
        _set_stats(self, None)  # statistics belong to the call that made them
        _check_request(generation_config, model_kwargs)
    rift_config = rift_config_of(generation_config, self)
    if isinstance(user_cache, StaticCache):
        raise ValueError(f"A StaticCache cannot be combined with cache_implementation='rift'; drop `{CACHE}`.")
    if generation_config.is_assistant and isinstance(user_cache, RiftCache):
        return None  # the drafter of a RiftCandidateGenerator: its cache is already in place
    if generation_config.is_assistant and user_cache is None:
        # A drafter whose own generation config asks for rift, inside transformers' own assisted loop (the target
        # did not ask for rift): compress its cache as asked. That loop crops the drafter's cache after every round,
        # so the cache records the past, as RiftCandidateGenerator's does; the target still verifies every token.
        use_rift_attention(self, rift_config)
        cache = RiftCache(self.config, rift_config)
        cache.activate_past_recording()
        model_kwargs[CACHE] = cache
        return None
    if batch_size > 1:
        raise ValueError(
            f"cache_implementation='rift' supports batch size 1, got {batch_size}: call generate once per prompt."
        )
    if user_cache is not None and generation_mode == GenerationMode.ASSISTED_GENERATION and recorded_draft(user_cache):
        return None  # `generate_from`: the target's recorded prompt, in a DynamicCache
    if user_cache is not None:
        raise ValueError(
            f"Passing both cache_implementation='rift' and `{CACHE}` is unsupported: pass one of the two "
            f"(a RiftCache instance can be passed as `{CACHE}` alone)."
        )
    if generation_mode == GenerationMode.ASSISTED_GENERATION:
        # The target verifies with a full cache: only the drafter is compressed (RiftCandidateGenerator). A stateful
        # target gets a full RiftCache that rolls its states back (stateful.py).
        if needs_verifier(self):
            model_kwargs[CACHE] = verifier_cache(self)
        else:
            model_kwargs[CACHE] = DynamicCache(config=self.config.get_text_config(decoder=True))
        return None
    # Without a drafter there is no one else's cache to compress: rift would compress this model's own, and change
    # its output. That is a lossy choice only a cache object passed on purpose makes.
    raise ValueError(
        "cache_implementation='rift' compresses the drafter's cache in assisted generation, so the output stays the "
        "target's own; this call has no drafter, so it would compress this model's own cache and could change its "
        "output. Pass assistant_model=<a smaller model of the same family>, or, to compress this model's own cache "
        "knowingly (lossy), pass past_key_values=rift_hf.RiftCache(model.config, {...}) instead of "
        "cache_implementation."
    )


def _get_candidate_generator(
    self,
    generation_config,
    input_ids,
    inputs_tensor,
    logits_processor,
    model_kwargs,
    assistant_model=None,
    target_tokenizer=None,
    assistant_tokenizer=None,
):
    original = _ORIGINALS["_get_candidate_generator"]
    if generation_config.cache_implementation != NAME or assistant_model is None:
        generator = original(
            self,
            generation_config,
            input_ids,
            inputs_tensor,
            logits_processor,
            model_kwargs,
            assistant_model,
            target_tokenizer,
            assistant_tokenizer,
        )
        prefill = recorded_draft(model_kwargs.get(CACHE))
        if prefill is not None and assistant_model is not None:
            # `generate_from` with transformers' own drafter loop: its DynamicCache starts from the recorded prompt
            # (the first round crops it by two tokens and re-feeds them, as every later round does).
            if type(generator) is not AssistedCandidateGenerator:
                raise ValueError(
                    f"generate_from reuses a drafter's prompt forward with same-tokenizer assisted generation only, "
                    f"not {type(generator).__name__}; drop the option that selects it."
                )
            cache = DynamicCache(config=assistant_model.config.get_text_config(decoder=True))
            cache.activate_past_recording()
            load_prefill(cache, prefill)
            if hasattr(generator, "_last_ids_length"):
                # 5.25 crops by the last round's draft (none before the first): two tokens go now, as 5.23 crops.
                cache.crop(-2)
            generator.assistant_kwargs[CACHE] = cache
        return generator
    if input_ids.shape[-1] == 0:
        raise ValueError(
            "cache_implementation='rift' drafts from the prompt's token ids, but only `inputs_embeds` were given; pass "
            "input_ids= (together with inputs_embeds= if the target needs them)."
        )
    if generation_config.output_attentions and self.config._attn_implementation != "eager":
        raise ValueError(
            "output_attentions=True in assisted generation returns the target's attention weights, which only "
            f"attn_implementation='eager' computes (the target runs {self.config._attn_implementation!r}); call "
            "target.set_attn_implementation('eager') first, or drop output_attentions."
        )
    if target_tokenizer is not None and assistant_tokenizer is not None:
        raise ValueError(
            "cache_implementation='rift' does not support drafters with another tokenizer yet; use a drafter that "
            "shares the target's vocabulary, or drop cache_implementation='rift'."
        )
    target_vocab = self.config.get_text_config().vocab_size
    draft_vocab = assistant_model.config.get_text_config().vocab_size
    if target_vocab != draft_vocab:
        raise ValueError(
            f"The drafter's vocabulary ({draft_vocab}) differs from the target's ({target_vocab}); pass "
            "`tokenizer=` and `assistant_tokenizer=` to generate for a cross-tokenizer drafter, or pick a drafter of "
            "the same family."
        )
    arguments = {
        "input_ids": input_ids,
        "assistant_model": assistant_model,
        "generation_config": generation_config,
        "model_kwargs": model_kwargs,
        "inputs_tensor": inputs_tensor,
        "logits_processor": logits_processor,
        "rift_config": rift_config_of(generation_config, self),
        "target": self,
    }
    prefill = recorded_draft(model_kwargs.get(CACHE))  # `generate_from`: the drafter's recorded prompt forward
    if prefill is None:
        generator = RiftCandidateGenerator(**arguments)
    else:
        generator = RecordedPromptGenerator(**arguments, prefill=prefill)
    _set_stats(self, generator.stats)
    return generator


def _validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs):
    original = _ORIGINALS["_validate_generation_mode"]
    rift_assisted = (
        generation_mode == GenerationMode.ASSISTED_GENERATION and generation_config.cache_implementation == NAME
    )
    if not (rift_assisted and getattr(self, "_is_stateful", False)):  # 5.25 has no such check
        return original(self, generation_mode, generation_config, generation_mode_kwargs)
    # transformers refuses stateful targets because a rejection cannot be rolled back; rift's verifier cache does
    # roll back, so the check runs on a view of the model that reads as stateless (the model itself is not touched,
    # so concurrent calls sharing it see no change).
    return original(_StatelessView(self), generation_mode, generation_config, generation_mode_kwargs)


class _StatelessView:
    """Reads through to `model`, except `_is_stateful` (False); `__class__` stays the model's for messages."""

    _is_stateful = False

    def __init__(self, model):
        object.__setattr__(self, "_model", model)

    @property
    def __class__(self):
        return type(self._model)

    def __getattr__(self, name):
        return getattr(self._model, name)


def apply() -> None:
    """Install the patches (idempotent)."""
    if _ORIGINALS:
        return
    if NAME not in configuration_utils.ALL_CACHE_IMPLEMENTATIONS:
        configuration_utils.ALL_CACHE_IMPLEMENTATIONS = configuration_utils.ALL_CACHE_IMPLEMENTATIONS + (NAME,)
    for name, wrapper in (
        ("_prepare_cache_for_generation", _prepare_cache_for_generation),
        ("_get_candidate_generator", _get_candidate_generator),
        ("_validate_generation_mode", _validate_generation_mode),
    ):
        _ORIGINALS[name] = getattr(GenerationMixin, name)
        setattr(GenerationMixin, name, wrapper)
