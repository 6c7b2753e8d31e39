"""A policy is a small registered class: what it scores with, how it selects, when it refreshes.

`RiftConfig.policy` names one; `RiftConfig.policy_object` is an instance bound to that config. The cache asks the
policy, never a policy name, so a new policy is one file with a `@register` class (plus its import in
`rift_hf/policies/__init__.py`). Storage is not a policy's business (`rift_hf.storage`).
"""

from __future__ import annotations

import json
import math
from typing import ClassVar

import torch

from .params import CHECKS
from .schedules import Once, Schedule
from .scorers import carry_forward, snapkv_scores
from .selection import select_tokens

_REGISTRY: dict[str, type] = {}  # policies, and resolvers such as `auto` (`register_resolver`)


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make `cls` available as `RiftConfig(policy=cls.name)`."""
    if not getattr(cls, "name", None):
        raise TypeError(f"{cls.__name__} needs a `name` class attribute to be registered as a policy.")
    for flag, base in (("keeps_store", StorePolicy), ("retrieves", RetrievalPolicy)):
        if getattr(cls, flag) != issubclass(cls, base):
            raise TypeError(
                f"{cls.__name__} sets {flag}={getattr(cls, flag)}; the mode follows from the base class: subclass "
                f"{base.__name__} for it (or leave the flag to the base)."
            )
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"A policy named {cls.name!r} is already registered ({_REGISTRY[cls.name].__name__}).")
    _REGISTRY[cls.name] = cls
    return cls


def register_resolver(cls: type) -> type:
    """Class decorator: make `cls` a name `RiftConfig(policy=...)` accepts that is not a policy but picks one once the
    prompt's length is known (`cls.resolve(config, prompt_length)`, `auto`). It carries, as class attributes, what its
    choices share (`mode`, the base class that decides a cache's layers; `scored`, `keeps_store`, `params` ...)."""
    if issubclass(cls, Policy) or not callable(getattr(cls, "resolve", None)):
        raise TypeError(f"{cls.__name__} is registered as a resolver: it must define `resolve` and not be a Policy.")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"A policy named {cls.name!r} is already registered ({_REGISTRY[cls.name].__name__}).")
    _REGISTRY[cls.name] = cls
    return cls


def is_resolver(name: str) -> bool:
    """Whether `name` picks a policy by prompt length (`auto`) instead of being one."""
    return not issubclass(policy_class(name), Policy)


def policy_names() -> tuple[str, ...]:
    """Every name `RiftConfig(policy=...)` accepts: the registered policies and resolvers, in registration order."""
    return tuple(_REGISTRY)


def policy_class(name: str) -> type:
    """The class `name` stands for: a registered `Policy`, or a resolver (`register_resolver`), whose class attributes
    answer the same questions (mode, scored, keeps_store, params ...) for the policies it may pick."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"Unknown RIFT policy {name!r}; choose one of {', '.join(_REGISTRY)}.{_label_hint(name)}"
        ) from None


def label_fields(label: str) -> dict:
    """A benchmark label as config fields: `page-round@pages_ahead=1` -> `{"policy": "page-round", "pages_ahead": 1}`
    (values parsed as JSON where they parse)."""
    policy, _, overrides = label.partition("@")
    config = {"policy": policy}
    for key, _, value in (item.partition("=") for item in filter(None, overrides.split(","))):
        try:
            config[key] = json.loads(value)
        except json.JSONDecodeError:
            config[key] = value
    return config


def _label_hint(name) -> str:
    """For a benchmark label given as a policy name: how to write it as fields."""
    if not isinstance(name, str) or "@" not in name:
        return ""
    return f" {name!r} is a benchmark label (policy@field=value); as a config it is {label_fields(name)!r}."


class Policy:
    """
    What a compressed full-attention layer keeps: `n_sink` first tokens, a rolling window of the most recent tokens
    (`recent_tokens`), and a selection of older ones chosen by `select` from `score`.

    A policy's base is its mode, and the mode is the layer the cache builds for it: a plain `Policy` selects once,
    from the prompt (`RiftSelectLayer`); a `StorePolicy` keeps every token and selects again from it
    (`RiftStoreLayer`); a `RetrievalPolicy` lets each query choose its own rows (`RiftRetrievalLayer`). Each base
    defines every method the cache calls on a policy of its mode.

    Class attributes:
        name: the `RiftConfig.policy` string.
        compresses: `False` only for the uncompressed baseline.
        scored: the selection comes from queries, so the drafter needs the "rift" attention backend.
        keeps_store: (set by `StorePolicy`) the full KV store is kept so the selection can be refreshed from every
            token; the first selection is then also made from the store (right after the prompt: SnapKV on it).
        rho: default share of the budget given to the recent window.
        block_size: default block (page) length, for policies that select whole blocks.
        pages_ahead: default number of pages a chosen page brings with it (the next ones), for page policies.
        rechoose_after: default number of drafted tokens after which the selection is chosen again inside a round
            (0: never), for policies that read the field (page-round).
        retrieves: (set by `RetrievalPolicy`) the layer keeps every token and each new query attends its own
            `budget` rows, chosen by `retrieve` at every forward (per-step retrieval); nothing is evicted at commits.
        summarises_pages: the layer keeps a summary of every committed page (`summarise`), and a refresh selects from
            them with `select_pages` instead of scoring every key with `score` (page-round).
        store_dtype: what `RiftConfig(store_dtype="auto")` (the default) keeps the full store in: None (the model's
            dtype) or a quantised dtype (`int8`, `int4`, `int2`).
        guided: the candidate generator captures the target's attention at each verification and hands the drafter's
            cache its newest verified query's weights over positions (`RiftCache.guide`, `generation/guide.py`), which
            `select_layers` chooses from (page-round with `guide="target"`).
        refresh_at_rollback: the schedule is also consulted at the commit that follows a rollback (assisted
            generation commits twice per round: after the rollback, and after the forward that re-feeds the verified
            tokens; a policy that refreshes every round wants only the second, which has the newest query).
        params: the `RiftConfig` fields of its own this policy reads (beside the common ones: budget, rho, n_sink,
            storage and drafting fields, checked by `RiftConfig`), checked by `check_params` (`policies/params.py`
            says what each must hold). A field some other policy reads, set away from its default for a policy that
            does not list it, is refused (`RiftConfig`), so a setting never silently does nothing.
    """

    name: ClassVar[str] = ""
    compresses: ClassVar[bool] = True
    scored: ClassVar[bool] = True
    keeps_store: ClassVar[bool] = False
    rho: ClassVar[float] = 0.5
    block_size: ClassVar[int] = 16
    pages_ahead: ClassVar[int] = 0
    rechoose_after: ClassVar[int] = 0
    retrieves: ClassVar[bool] = False
    summarises_pages: ClassVar[bool] = False
    refresh_at_rollback: ClassVar[bool] = True
    guided: bool = False
    store_dtype: ClassVar[str | None] = None
    params: ClassVar[frozenset[str]] = frozenset({"window", "pool", "pool_kernel", "tokens_ahead"})

    def __init__(self, config):
        self.config = config  # the `RiftConfig` naming this policy (not imported here: config.py imports policies)

    def check_params(self) -> None:
        """Raise if a field this policy reads holds what it cannot use (a policy adds its own cross-field rules)."""
        for name in sorted(self.params):
            CHECKS[name](name, getattr(self.config, name))

    # Budget layout ---------------------------------------------------------------------------------------------
    def default_rho(self, budget: int) -> float:
        return self.rho

    def round_budget(self, budget: int) -> int:
        """The budget actually used for a requested one (a block policy rounds to whole blocks)."""
        return budget

    def round_selection(self, count: int) -> int:
        """The largest selection of at most `count` rows this policy can make (whole blocks for block policies)."""
        return count

    def recent_tokens(self, budget: int) -> int:
        """Size of the rolling recent window for a resolved `budget`."""
        rho = self.default_rho(budget) if self.config.rho is None else self.config.rho
        return min(math.floor(rho * budget), budget - self.config.n_sink)

    def check_budget(self, budget: int) -> None:
        """Raise if `budget` tokens cannot hold what the policy always keeps."""
        needed = self.config.n_sink + (self.config.window if self.scored else 0)
        if needed > budget:
            raise ValueError(
                f"The budget ({budget} tokens) is smaller than n_sink + window = {needed} for policy "
                f"{self.name!r}; raise `budget` or lower `window`/`n_sink`."
            )

    # Scoring and selection -------------------------------------------------------------------------------------
    def score(self, query: torch.Tensor, keys: torch.Tensor, scale: float, sinks: torch.Tensor | None):
        """`[B, H_kv, T]` importance of each key position from the latest queries `[B, H_q, W, D]` (carried
        `tokens_ahead` positions forward)."""
        config = self.config
        return carry_forward(
            snapkv_scores(query, keys, scale, config.pool, config.pool_kernel, sinks), config.tokens_ahead
        )

    def select(self, scores: torch.Tensor, lo: int, hi: int, count: int) -> torch.Tensor:
        """`scores` `[B, H_kv, T]` -> up to `count` positions per KV head among `[lo, hi)`, `[H_kv, S]` ascending."""
        return select_tokens(scores[0], lo, hi, count)

    # Refresh ---------------------------------------------------------------------------------------------------
    def schedule(self) -> Schedule:
        """When the selection is refreshed from the store (only meaningful with `keeps_store`)."""
        return Once()

    def select_layers(self, layers: list, cache) -> tuple[torch.Tensor, ...] | None:
        """A refresh's new selection for every compressed layer of `cache` at once (`[H_kv, S]` each), or None: each
        layer then re-selects for itself (`RiftStoreLayer`)."""
        return None


class StorePolicy(Policy):
    """
    The mode that refreshes: every token is kept in a store (`RiftStoreLayer`) and the selection made again from it
    on the policy's `schedule`. Two options a store policy turns on by defining their methods: page summaries
    (`summarises_pages = True`: `summarise` and `select_pages`, page-round) and choosing again inside a round (a
    `rechoose_after` field: `rechoose_layers`).
    """

    keeps_store = True

    def summarise(self, pages: torch.Tensor) -> torch.Tensor:
        """`[B, H_kv, n_pages, block_size, D]` keys -> one summary row per page, `[B, H_kv, n_pages, D]`."""
        raise NotImplementedError(f"{type(self).__name__} sets summarises_pages but defines no `summarise`.")

    def select_pages(self, query, summaries, scale, n_sink, hi, count, newest) -> torch.Tensor:
        """A refresh's selection (`[H_kv, S]` positions) chosen from page summaries instead of every key's score."""
        raise NotImplementedError(f"{type(self).__name__} sets summarises_pages but defines no `select_pages`.")

    def rechoose_layers(self, layers: list, cache, drafted: int) -> tuple[torch.Tensor | None, ...]:
        """Every compressed layer's selection chosen again `drafted` tokens into a round (None: a layer keeps its)."""
        raise NotImplementedError(f"{type(self).__name__} reads rechoose_after but defines no `rechoose_layers`.")


class RetrievalPolicy(Policy):
    """
    The mode that retrieves per query: every token is kept in order (`RiftRetrievalLayer`, which evicts nothing) with
    a summary of each committed page (`summarise`), and at every forward each new query attends its own `budget`
    rows, chosen by `retrieve`.
    """

    retrieves = True

    def summarise(self, pages: torch.Tensor) -> torch.Tensor:
        """`[B, H_kv, n_pages, block_size, D]` keys -> one summary row per page, `[B, H_kv, n_pages, D]`."""
        raise NotImplementedError(f"{type(self).__name__} defines no `summarise`.")

    def retrieve(self, query, summaries, first: int, scale: float, recent: int, selected: int) -> torch.Tensor:
        """Rows each new query attends, `[B, H_kv, L, budget]` (sinks, the chosen pages, the recent window)."""
        raise NotImplementedError(f"{type(self).__name__} defines no `retrieve`.")


def policy_fields() -> set[str]:
    """The `RiftConfig` fields some policy reads and others do not (the union of every `Policy.params`)."""
    return {field for name in policy_names() for field in policy_class(name).params}


def policy_settings(policy: str, fields: dict) -> dict:
    """
    `{"policy": policy, **fields}` without the policy-specific fields `policy` does not read: one run's settings
    (window, delta, block size ...) applied to several policies. `RiftConfig` itself refuses such a field.

    >>> policy_settings("swa", {"budget": 0.25, "window": 32, "delta": 16})
    {'policy': 'swa', 'budget': 0.25}
    """
    params, specific = policy_class(policy).params, policy_fields()
    return {"policy": policy, **{k: v for k, v in fields.items() if k in params or k not in specific}}
