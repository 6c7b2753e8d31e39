"""`RiftConfig`: which positions a compressed drafter cache keeps, validated at construction.

The fields and their defaults follow `shared/notes/rift-spec.md`; every choice the paper leaves open is a
field here, so a run can be reproduced from its config alone.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .policies import Policy, policy_class, policy_names
from .policies.auto import Auto
from .policies.base import _label_hint
from .policies.params import positive_int


def _store_policies() -> str:
    """The registered policies that keep a full store, for error messages."""
    return ", ".join(name for name in policy_names() if policy_class(name).keeps_store)


CONFIG_NAME = "rift_config.json"
# The built-in policies, one file each under `rift_hf/policies/` (a registered policy added later is valid too).
POLICIES = policy_names()
# What a quantised full store may be kept in (optimum-quanto); None keeps the model's dtype.
STORE_DTYPES = ("int8", "int4", "int2")
EQUAL_BYTES_DTYPES = ("bfloat16", "float16", "float32")  # `kv_equal_bytes` may count bytes as if in one of these
# Fields that size something in tokens (rows held, buffers, pooling spans): none may exceed the context of the model a
# cache is built for (`RiftConfig.check_context`), nor, before any model is known, `MAX_TOKENS`. Periods (`delta`,
# `a_max`, `check_interval`, `rechoose_after`) are not sizes: a huge one only means "never".
TOKEN_FIELDS = (
    "budget", "window", "n_sink", "pool_kernel", "block_size", "score_queries", "tokens_ahead", "store_group_size",
    "store_residual", "kv_group_size", "prompt_chunk", "prompt_budget",
)  # fmt: skip
MAX_TOKENS = 1 << 24  # 16.8M tokens: beyond any model's context
# The drafter reads a prompt in chunks of this many tokens by default (`RiftConfig.prompt_chunk`): on the ~4K standard
# library prompts its retention stayed within 0.02 of one forward's, and at ~32K the pass took 0.47-0.72x the time
# (docs/results/prompt-pass.md).
DEFAULT_CHUNK = 1024


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


@dataclass(frozen=True)
class RiftConfig:
    """
    What a RIFT-compressed cache keeps in each full-attention layer, per KV head.

    Every compressed layer keeps `n_sink` first tokens, the `floor(rho * budget)` most recent tokens and
    `budget - recent - n_sink` older tokens selected by the SnapKV scorer; the schedule (once at prefill, every
    `delta` tokens, or adaptively) decides when the selection is refreshed.

    Args:
        policy (`str`, defaults to `"auto"`):
            A registered policy (`rift_hf.policies.policy_names()`): built in `full`, `swa`, `snapkv`, `rift-stat`,
            `rift-stat-block`, `rift-dyn`, `rift-ada` (the paper's), `page-ahead`, `page-retrieval` and `page-round`
            (ours: retention >= 0.93 at 4x and 8x on our pair at ~4K and ~8K inputs with a step about as cheap as
            rift-dyn's, docs/results/e1-scale.md; `page-retrieval` keeps a little more AL at a dearer step), and
            `auto`, the default: `page-round` below 16,384 prompt tokens, `rift-dyn` with `tokens_ahead=128` and an
            int4 store from there on (where page-round loses AL: `rift_hf/policies/auto.py`), chosen when the cache
            sees the prompt (`fitted`). `auto` takes only the fields both read; name a policy to set the others.
        budget (`int` or `float`, defaults to `0.25`):
            Past-token entries kept per layer and KV head: an `int` number of tokens, or a `float` in (0, 1) taken
            as a fraction of the prompt length (0.25 = "4x compression").
        rho (`float`, *optional*):
            Share of the budget given to the most recent tokens. Defaults per policy: 1.0 for `swa`, `window/budget`
            for `snapkv`, 0.5 for the RIFT policies, 0.25 for `page-ahead`.
        n_sink (`int`, defaults to 0): first tokens always kept (attention sinks).
        window (`int`, defaults to 64): observation window `w`, the number of latest queries the scorer uses.
        pool (`str`, defaults to `"avg"`) and pool_kernel (`int`, defaults to 5): 1-D pooling of the scores.
        block_size (`int`, *optional*): block length of `rift-stat-block`, page length of `page-ahead` and
            `page-retrieval`; defaults to the policy's own (8 for `page-retrieval`, 16 otherwise).
        pages_ahead (`int`, *optional*): for `page-ahead` and `page-round`, how many following pages a chosen page
            brings with it (copying reads forward); defaults to the policy's own (1 for `page-ahead`, 2 for
            `page-round`, 0 otherwise).
        score_queries (`int`, defaults to 1): for `page-round`, how many of the newest verified queries score the
            pages at a refresh (each page's attention share averaged over them; at most `window`).
        rechoose_after (`int`, *optional*): for `page-round`, choose the pages once more inside a drafting round,
            after this many drafted tokens, scored with the round's queries so far (the newest `score_queries`
            verified ones and the drafted ones); only the selection's rows are swapped (0: once per round only);
            defaults to the policy's own (2 for `page-round`, 0 otherwise).
        tokens_ahead (`int`, defaults to 0): for policies that select tokens by score (snapkv, rift-stat,
            rift-stat-block, rift-dyn, rift-ada, page-ahead), each position's score is raised to the highest among
            it and the `tokens_ahead` positions before it, so a chosen token brings the ones after it (copying reads
            forward; `pages_ahead` is the page-level counterpart).
        delta (`int`, defaults to 128): committed tokens between two rescorings of `rift-dyn`.
        store_device (`str`, *optional*): where `rift-dyn`/`rift-ada` keep the full store (`"cpu"` to offload);
            defaults to the model's device.
        check_interval, a_min, a_max, al_alpha, al_threshold, entropy_threshold, drift_threshold:
            the `rift-ada` schedule; a threshold of `None` disables that signal.
        snapkv_grow (`bool`, defaults to `False`): original SnapKV, which appends every generated token instead of
            rolling a window (the budget then only bounds the prompt part).
        track_attention_mass (`bool`, defaults to `False`): keep a shadow full store and record the share of the
            full-cache attention mass that falls on the retained positions (a measurement mode, slower).
        attend_in_place (`bool`, defaults to `False`): store policies with the store on the compute device and Triton
            kernels: attend the kept rows of the store in place (Triton `indexed_attention`) instead of keeping a
            working-set copy. Saves the working set's memory; slower per step on an H200 (one program per query
            head at decode: rift-dyn in place 4.4 ms of kernel time per drafter step, rift-stat with its working-set
            copy 2.3 ms, 2026-11-30).
        store_dtype (`str`, *optional*, defaults to `"auto"`), store_group_size (`int`, defaults to 64), store_residual
            (`int`, defaults to 64): keep a store policy's full store in `int8`/`int4`/`int2` (keys per channel over
            groups of `store_group_size` tokens, values per token over groups of `store_group_size` channels), the
            newest `store_residual` committed rows in the model's dtype; `None` keeps it in the model's dtype.
            `"auto"` is the policy's own choice: `int4` for `page-round` and `auto`, `None` for the others.
        kv_dtype (`str`, *optional*) and kv_group_size (`int`, defaults to 64): keep the *selected* rows of the
            working set in `int8`/`int4`/`int2` (optimum-quanto); sinks and the recent window stay in the model's
            dtype, and attention reads the selection dequantised. For the policies that select (not `full`, `swa`,
            `page-retrieval`).
        kv_equal_bytes (`bool` or `str`, defaults to `False`): with `kv_dtype`, read `budget` as the bytes of that many
            tokens in the model's dtype: the selection gets as many quantised rows as its share of those bytes holds
            (about 1.9x at int8 and 3.6x at int4 for 64-dim heads in bf16), so "4x" compares precisions at equal
            memory. A dtype name (`"bfloat16"`, `"float16"`, `"float32"`) counts the bytes as if the model ran in that
            dtype: an fp32 drafter (exact replay) then holds the rows a bf16 drafter would.
        selection_head (`str`, *optional*): a trained `rift_hf.SelectionHead` (a `.safetensors` file, or a folder
            holding `selection_head.safetensors`) through which the scorer reads the queries of a policy that scores
            with them; the drafter's own attention is unchanged. A relative path in a saved config is read relative
            to the folder it was saved in (`from_pretrained`).
        draft_length (`str`, defaults to `"auto"`): in assisted generation, `"auto"` drafts each round the number of
            tokens that maximises expected tokens per second (measured drafter and verification costs, acceptance
            per draft position; up to the drafter's `num_assistant_tokens`), and lets the target decode alone when no
            length beats it (`rift_hf.generation.draft_length`); `"fixed"` keeps transformers' schedule
            (`num_assistant_tokens`, `num_assistant_tokens_schedule`), as acceptance measurements need.
        step_aside (`bool`, defaults to `True`): with `draft_length="auto"`, time the target alone for the first two
            rounds and let it decode the whole call alone (the drafter never runs) when speculation cannot repay the
            drafter's prompt pass in the tokens left (`rift_hf.generation.payoff`; `last_stats(...).stepped_aside`).
            False always drafts.
        prompt_chunk (`int`, *optional*): read the prompt into the drafter's cache in chunks of this many tokens,
            the policy choosing its working set after each, instead of in one forward over the whole prompt
            (`rift_hf.cache.reading`): the drafter then never holds more than its working set plus one chunk at full
            precision, and its attention over the prompt costs time linear in the prompt. Its keys and values are
            then approximate, which costs acceptance, never correctness. 0 reads the prompt in one forward (as
            `page-retrieval`, which keeps every token, always does). Defaults to `DEFAULT_CHUNK` (1024, or the
            observation window if longer) where the policy can read in chunks, and 0 with `kv_dtype` (`reading_chunk`
            is the chunk in effect).
        prompt_budget (`int` or `float`, *optional*): with `prompt_chunk`, the working set a store policy reads with
            (tokens, or a fraction of the prompt; at most `budget`); its real working set is chosen from the store
            once the prompt is read. Policies without a store read with `budget`. Defaults to `budget`.
        compile (`bool`, defaults to `False`): in assisted generation, draft through a `torch.compile`d one-token
            step over the fixed-size working set (`rift_hf.generation.compiled`; inductor on a CPU, CUDA graphs on
            a GPU); the round's first forward, commits and refreshes stay eager. For the policies whose working set
            has a fixed size (not `full`, `page-retrieval`, `snapkv_grow`), without `kv_dtype`, `attend_in_place` or
            `track_attention_mass`, and drafters whose every layer is full attention. The first step compiles (tens
            of seconds); later steps, rounds and calls on the same drafter replay it.

    A config is frozen once made (every field checked together); `replace(**changes)` makes a checked copy.

    Example:

    ```python
    >>> from rift_hf import RiftConfig
    >>> RiftConfig(policy="rift-dyn", budget=0.25, delta=128).recent_tokens(1024)
    128
    ```
    """

    policy: str = "auto"
    budget: int | float = 0.25
    rho: float | None = None
    n_sink: int = 0
    window: int = 64
    pool: str = "avg"
    pool_kernel: int = 5
    block_size: int | None = None
    pages_ahead: int | None = None
    score_queries: int = 1
    rechoose_after: int | None = None
    tokens_ahead: int = 0
    delta: int = 128
    store_device: str | None = None
    check_interval: int = 8
    a_min: int = 32
    a_max: int = 512
    al_alpha: float = 0.3
    al_threshold: float | None = None
    entropy_threshold: float | None = None
    drift_threshold: float | None = None
    snapkv_grow: bool = False
    track_attention_mass: bool = False
    attend_in_place: bool = False
    store_dtype: str | None = "auto"
    store_group_size: int = 64
    store_residual: int = 64
    kv_dtype: str | None = None
    kv_group_size: int = 64
    kv_equal_bytes: bool | str = False
    selection_head: str | None = None
    draft_length: str = "auto"
    step_aside: bool = True
    prompt_chunk: int | None = None
    prompt_budget: int | float | None = None
    compile: bool = False

    def __post_init__(self):
        for item in dataclasses.fields(self):  # numpy (or other) scalars are numbers like Python's own
            value = getattr(self, item.name)
            if isinstance(value, numbers.Number) and type(value) not in (int, float, bool):
                if isinstance(value, numbers.Integral):
                    self._set(item.name, bool(value) if type(value).__name__.startswith("bool") else int(value))
                elif isinstance(value, numbers.Real):
                    self._set(item.name, float(value))
        if not isinstance(self.policy, str):
            raise TypeError(f"`policy` must be a policy name such as 'rift-stat', got {self.policy!r}.")
        policy_class(self.policy)  # raises on an unknown name
        self._check_sizes(MAX_TOKENS, "any model's context")
        if self.block_size is None:
            self._set("block_size", policy_class(self.policy).block_size)
        if self.pages_ahead is None:
            self._set("pages_ahead", policy_class(self.policy).pages_ahead)
        if self.rechoose_after is None:
            self._set("rechoose_after", policy_class(self.policy).rechoose_after)
        self._check_policy_fields()  # a field the policy does not read, set, is refused before anything else
        if isinstance(self.budget, bool) or not isinstance(self.budget, (int, float)):
            raise TypeError(
                f"`budget` must be an int (tokens) or a float in (0, 1) (fraction of the prompt), got {self.budget!r}."
            )
        if isinstance(self.budget, float) and not 0.0 < self.budget < 1.0:
            raise ValueError(
                f"A float `budget` is a fraction of the prompt in (0, 1), got {self.budget}; pass an int for a token "
                "count (budget=1.0 would keep everything: use policy='full')."
            )
        if isinstance(self.budget, int) and self.budget <= 0:
            raise ValueError(f"`budget` must be a positive number of tokens, got {self.budget}.")
        if self.rho is not None and (isinstance(self.rho, bool) or not isinstance(self.rho, (int, float))):
            raise TypeError(f"`rho` must be a number or None, got {self.rho!r}.")
        if self.rho is not None and not 0.0 <= self.rho <= 1.0:
            raise ValueError(f"`rho` must lie in [0, 1], got {self.rho}.")
        if isinstance(self.n_sink, bool) or not isinstance(self.n_sink, int):
            raise TypeError(f"`n_sink` must be an int, got {self.n_sink!r}.")
        if self.n_sink < 0:
            raise ValueError(f"`n_sink` must be >= 0, got {self.n_sink}.")
        if self.kv_equal_bytes not in (True, False, *EQUAL_BYTES_DTYPES):
            raise TypeError(
                f"`kv_equal_bytes` must be True, False or one of {', '.join(EQUAL_BYTES_DTYPES)} (count the budget's "
                f"bytes as if the model ran in that dtype), got {self.kv_equal_bytes!r}."
            )
        for name in ("track_attention_mass", "attend_in_place", "compile", "step_aside"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"`{name}` must be True or False, got {getattr(self, name)!r}.")
        if self.selection_head is not None:
            if not isinstance(self.selection_head, str) or not self.selection_head:
                raise TypeError(f"`selection_head` must be a path (str) or None, got {self.selection_head!r}.")
            if not policy_class(self.policy).scored or policy_class(self.policy).retrieves:
                raise ValueError(
                    f"Policy {self.policy!r} does not select with its recent queries, so a `selection_head` has "
                    "nothing to act on; drop it, or use a scored policy such as 'rift-stat'."
                )
        if self.store_dtype == "auto":  # the policy's choice, unless attending the store in place (full precision)
            self._set("store_dtype", None if self.attend_in_place else policy_class(self.policy).store_dtype)
        if self.store_device is not None:
            self._check_store_device()
        if self.store_dtype is not None:
            self._check_store_dtype()
        if self.kv_dtype is not None or self.kv_equal_bytes:
            self._check_kv_dtype()
        if self.attend_in_place and not policy_class(self.policy).keeps_store:
            raise ValueError(
                f"`attend_in_place` attends the rows of the full store, which policy {self.policy!r} does not keep; "
                f"drop it, or use a store policy ({_store_policies()})."
            )
        for name in ("store_group_size", "store_residual", "kv_group_size"):
            positive_int(name, getattr(self, name))
        self._check_reading()
        if self.draft_length not in ("auto", "fixed"):
            raise ValueError(
                f"`draft_length` must be 'auto' (cost-aware, per round) or 'fixed' (transformers' "
                f"num_assistant_tokens schedule), got {self.draft_length!r}."
            )
        self.policy_object.check_params()  # the fields the policy reads, and its own rules between them
        if self.compile:
            self._check_compile()
        if isinstance(self.budget, int):
            self.check_budget(self.budget)

    def _set(self, name: str, value) -> None:
        """Fill in a field while the config is being checked (it is frozen afterwards)."""
        object.__setattr__(self, name, value)

    def replace(self, **changes) -> RiftConfig:
        """A copy with `changes`, checked as a new config is (a config never changes once made, so what a cache or a
        saved file holds stays what was checked):

        >>> RiftConfig(policy="page-round").replace(budget=0.125).budget
        0.125
        """
        return dataclasses.replace(self, **changes)

    def check_context(self, context: int | None) -> None:
        """Refuse a size no model of `context` tokens (its `max_position_embeddings`) could use: a window, budget,
        chunk ... longer than the model can read would only reserve memory for it."""
        if context:
            self._check_sizes(context, f"the model's context ({context} tokens, max_position_embeddings)")

    def _check_sizes(self, limit: int, what: str) -> None:
        for name in TOKEN_FIELDS:
            value = getattr(self, name)
            if isinstance(value, int) and not isinstance(value, bool) and value > limit:
                raise ValueError(f"`{name}` = {value} exceeds {what}; lower it.")
        ahead, block = self.pages_ahead, self.block_size
        pages = ahead * block if all(isinstance(v, int) and not isinstance(v, bool) for v in (ahead, block)) else 0
        if pages > limit:
            raise ValueError(f"`pages_ahead` x `block_size` = {pages} tokens exceeds {what}; lower `pages_ahead`.")

    @property
    def reading_chunk(self) -> int:
        """The chunk the prompt is read in (`prompt_chunk`, or its default); 0: one forward."""
        if self.prompt_chunk is not None:
            return self.prompt_chunk
        return 0 if self.kv_dtype is not None else max(DEFAULT_CHUNK, self.window)

    def _check_reading(self) -> None:
        """`prompt_chunk` (0 or a chunk of at least the observation window) and `prompt_budget` (like `budget`)."""
        chunk = self.prompt_chunk
        if chunk is None:
            chunk = self.reading_chunk
        elif isinstance(chunk, bool) or not isinstance(chunk, int):
            raise TypeError(f"`prompt_chunk` must be an int (tokens per chunk, 0 for one forward), got {chunk!r}.")
        least = self.window if self.is_scored else 1  # a scored policy chooses with a chunk's last `window` queries
        if chunk < 0 or 0 < chunk < least:
            raise ValueError(
                f"`prompt_chunk` must be 0 (read the prompt in one forward) or at least {least} tokens (policy "
                f"{self.policy!r} chooses with a chunk's last `window` queries), got {chunk}."
            )
        if self.prompt_chunk and self.kv_dtype is not None:
            raise ValueError(
                "A chunked prompt pass (`prompt_chunk`) chooses among full-precision rows; drop `kv_dtype` or set "
                "prompt_chunk=0."
            )
        reading = self.prompt_budget
        if reading is None:
            return
        if not chunk:
            raise ValueError("`prompt_budget` sizes the working set of a chunked prompt pass; set `prompt_chunk` too.")
        if isinstance(reading, bool) or not isinstance(reading, (int, float)):
            raise TypeError(f"`prompt_budget` must be an int (tokens), a float in (0, 1) or None, got {reading!r}.")
        if isinstance(reading, float) and not 0.0 < reading < 1.0:
            raise ValueError(f"A float `prompt_budget` is a fraction of the prompt in (0, 1), got {reading}.")
        if isinstance(reading, int) and reading <= 0:
            raise ValueError(f"`prompt_budget` must be a positive number of tokens, got {reading}.")

    def _check_compile(self) -> None:
        """`compile=True` needs a working set of fixed size that the compiled step can read and write as it is."""
        chosen = policy_class(self.policy)
        reasons = [
            (not chosen.compresses, f"policy {self.policy!r} keeps every token (its cache grows each step)"),
            (chosen.retrieves, f"policy {self.policy!r} attends rows retrieved per query"),
            (self.snapkv_grow, "`snapkv_grow` appends every generated token"),
            (self.kv_dtype is not None, "a quantised selection (`kv_dtype`) is dequantised at each step"),
            (self.attend_in_place, "`attend_in_place` attends the store through the Triton kernel"),
            (self.track_attention_mass, "`track_attention_mass` measures every step against the full store"),
        ]
        for refused, why in reasons:
            if refused:
                raise ValueError(
                    f"compile=True needs a fixed-size working set, but {why}. Drop compile=True, or use a policy "
                    "such as 'page-round', 'rift-stat' or 'swa' without that option."
                )

    def _check_policy_fields(self) -> None:
        """Refuse a field some policy reads, set away from its default for this policy, which does not read it."""
        chosen = policy_class(self.policy)
        users: dict[str, list[str]] = {}
        for name in policy_names():
            for field in policy_class(name).params:
                users.setdefault(field, []).append(name)
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for field, readers in users.items():
            value = getattr(self, field)
            # `block_size`/`pages_ahead` left unset are filled with the policy's own (what a saved config holds).
            if field in chosen.params or value == defaults[field] or value == getattr(chosen, field, defaults[field]):
                continue
            raise ValueError(
                f"Policy {self.policy!r} does not read `{field}` (set to {value!r}); only {', '.join(readers)} do. "
                f"Drop `{field}`, or choose one of those policies."
            )

    def _check_store_dtype(self) -> None:
        if self.store_dtype not in STORE_DTYPES:
            raise ValueError(
                f"`store_dtype` must be one of {', '.join(STORE_DTYPES)} (or None: the model's dtype), got "
                f"{self.store_dtype!r}."
            )
        if not self.keeps_store:
            raise ValueError(
                f"`store_dtype` quantises the full store, which policy {self.policy!r} does not keep; drop it, or use "
                f"a store policy ({_store_policies()})."
            )
        if self.attend_in_place:
            raise ValueError(
                "`attend_in_place` attends the store's rows as they are and cannot read a quantised store; drop one."
            )

    def _check_kv_dtype(self) -> None:
        if self.kv_dtype is None:
            raise ValueError(
                "`kv_equal_bytes` reads the budget as bytes so that a quantised selection holds more rows; set "
                "`kv_dtype` ('int8', 'int4' or 'int2') too, or drop it."
            )
        if self.kv_dtype not in STORE_DTYPES:
            raise ValueError(
                f"`kv_dtype` must be one of {', '.join(STORE_DTYPES)} (or None: the model's dtype), got "
                f"{self.kv_dtype!r}."
            )
        cls = policy_class(self.policy)
        if not cls.compresses or not cls.scored or cls.retrieves:
            selecting = [
                name
                for name in policy_names()
                if policy_class(name).compresses and policy_class(name).scored and not policy_class(name).retrieves
            ]
            raise ValueError(
                f"`kv_dtype` quantises the selected rows of the working set, which policy {self.policy!r} does not "
                f"keep; drop it, or use a selecting policy ({', '.join(selecting)}). For a store policy's full store "
                "use `store_dtype`."
            )
        if self.attend_in_place:
            raise ValueError(
                "`attend_in_place` attends the store's rows and keeps no working set to quantise; drop one of them."
            )

    def _check_store_device(self) -> None:
        import torch

        if not self.keeps_store:
            raise ValueError(
                f"`store_device` places the full store, which policy {self.policy!r} does not keep; drop it, or use "
                f"{_store_policies()} (or track_attention_mass=True)."
            )
        try:
            device = torch.device(self.store_device)
        except (RuntimeError, TypeError) as err:
            raise ValueError(
                f"`store_device` must name a torch device such as 'cpu' or 'cuda:0', got {self.store_device!r}."
            ) from err
        if device.type == "meta":
            raise ValueError("`store_device='meta'` holds no data; use 'cpu' or the model's device.")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                f"`store_device={self.store_device!r}` but this machine has no CUDA device; use 'cpu' or drop it."
            )

    @property
    def policy_object(self) -> Policy:
        """The registered policy class named by `policy`, bound to this config."""
        return policy_class(self.policy)(self)

    @property
    def is_scored(self) -> bool:
        return policy_class(self.policy).scored

    @property
    def keeps_store(self) -> bool:
        """Whether the full draft KV is kept (rescoring policies, or the staleness measurement)."""
        return policy_class(self.policy).keeps_store or self.track_attention_mass

    def check_budget(self, budget: int) -> None:
        """Raise if `budget` tokens cannot hold the sinks and the observation window."""
        self.policy_object.check_budget(budget)

    def fitted(self, prompt_length: int) -> RiftConfig:
        """
        This config for a prompt of `prompt_length` tokens. A fractional budget can be smaller than the observation
        window (or a block) on a short prompt; the window and block size then shrink to fit it (and `n_sink` to below
        it), so the defaults work on any prompt. An int budget is checked at construction and never changed.
        """
        if self.policy == "auto":  # the policy for this prompt's length, with its own defaults
            unset = {"block_size": None, "pages_ahead": None, "rechoose_after": None}  # the chosen policy's own
            return dataclasses.replace(self, **unset, **Auto.choice(prompt_length)).fitted(prompt_length)
        if not policy_class(self.policy).compresses or isinstance(self.budget, int):
            return self
        budget = self._budget_tokens(prompt_length)
        room = max(1, budget - self.n_sink)
        window = min(self.window, room) if self.is_scored else self.window
        block_size = min(self.block_size, room) if "block_size" in policy_class(self.policy).params else self.block_size
        if (window, block_size) == (self.window, self.block_size) and self.n_sink < budget:
            return self
        return dataclasses.replace(self, window=window, block_size=block_size, n_sink=min(self.n_sink, budget - 1))

    def _budget_tokens(self, prompt_length: int) -> int:
        return self.budget if isinstance(self.budget, int) else max(1, int(self.budget * prompt_length))

    def resolve_budget(self, prompt_length: int) -> int | float:
        """The budget in tokens for a prompt of `prompt_length` tokens (validated; see `fitted` for short prompts);
        `math.inf` for a policy that does not compress."""
        if self.policy == "auto":
            return self.fitted(prompt_length).resolve_budget(prompt_length)
        policy = self.policy_object
        if not policy.compresses:
            return math.inf
        budget = self._budget_tokens(prompt_length)
        policy.check_budget(budget)
        return policy.round_budget(budget)

    def effective_rho(self, budget: int) -> float:
        return self.rho if self.rho is not None else self.policy_object.default_rho(budget)

    def recent_tokens(self, budget: int) -> int:
        """R: the size of the rolling window of most recent tokens for a resolved `budget`."""
        return self.policy_object.recent_tokens(budget)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json_string(self) -> str:
        """The config as JSON (what `save_pretrained` writes), as transformers' configs give theirs."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def to_json_file(self, path) -> None:
        """Write `to_json_string()` to `path` (`save_pretrained(folder)` writes `<folder>/rift_config.json`)."""
        Path(path).write_text(self.to_json_string())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RiftConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"Unknown RiftConfig field(s) {unknown}; valid fields: {sorted(names)}.")
        return cls(**data)

    def save_pretrained(self, folder, push_to_hub: bool = False, **hub_kwargs) -> Path:
        """Write this config to `<folder>/rift_config.json`, a file plain transformers ignores (a drafter's folder
        stays loadable everywhere; rift reads it with `RiftConfig.from_pretrained`). A `selection_head` given by an
        absolute path is written relative to the folder (copied into it when it lies elsewhere). With
        `push_to_hub=True` the folder's config (and head) is then uploaded: `hub_kwargs` go to `push_to_hub`
        (`repo_id` defaults to the folder's name)."""
        path = Path(folder) / CONFIG_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.to_dict()
        head = data.get("selection_head")
        if head and Path(head).is_absolute():
            # Named relative to the folder, inside it (`from_pretrained` reads nothing outside): a head elsewhere is
            # copied in. A relative path already means "in the folder".
            source = Path(head) / "selection_head.safetensors" if Path(head).is_dir() else Path(head)
            try:
                data["selection_head"] = str(source.resolve().relative_to(Path(folder).resolve()))
            except ValueError:
                import shutil

                shutil.copyfile(source, Path(folder) / "selection_head.safetensors")
                data["selection_head"] = "selection_head.safetensors"
        path.write_text(json.dumps(data, indent=2) + "\n")
        if push_to_hub:
            hub_kwargs.setdefault("repo_id", Path(folder).resolve().name)
            RiftConfig.from_pretrained(folder).push_to_hub(**hub_kwargs)
        return path

    def push_to_hub(
        self,
        repo_id: str,
        *,
        token: str | bool | None = None,
        revision: str | None = None,
        private: bool | None = None,
        commit_message: str = "Upload rift_config.json",
        create_pr: bool = False,
    ):
        """Upload this config (and its selection head) to the Hub repository `repo_id`, created if missing: the
        drafter repository it belongs beside, or a small one of its own. Returns the commit's info."""
        import tempfile

        from huggingface_hub import HfApi

        api = HfApi(token=token)
        api.create_repo(repo_id, private=private, exist_ok=True)
        with tempfile.TemporaryDirectory() as folder:
            self.save_pretrained(folder)
            return api.upload_folder(
                repo_id=repo_id,
                folder_path=folder,
                revision=revision,
                commit_message=commit_message,
                create_pr=create_pr,
            )

    @classmethod
    def from_pretrained(
        cls,
        folder,
        *,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_dir: str | None = None,
        local_files_only: bool = False,
        **overrides,
    ) -> RiftConfig:
        """The config a folder or a Hub repository id carries in `rift_config.json` (see `save_pretrained`), with
        `overrides` (`RiftConfig` fields) replacing what it holds, as transformers' configs take them;
        `revision`, `token`, `cache_dir` and `local_files_only` as in `transformers`' `from_pretrained`."""
        local = Path(folder).is_dir()

        def fetch(name: str) -> Path:
            from huggingface_hub import hf_hub_download
            from huggingface_hub.errors import (
                EntryNotFoundError,
                HFValidationError,
                LocalEntryNotFoundError,
                RepositoryNotFoundError,
            )

            try:
                return Path(
                    hf_hub_download(
                        str(folder),
                        name,
                        revision=revision,
                        token=token,
                        cache_dir=cache_dir,
                        local_files_only=local_files_only,
                    )
                )
            except HFValidationError:
                raise FileNotFoundError(
                    f"No folder {folder!s}, and it is not a Hub repository id (namespace/name); give the path of "
                    "a folder written by RiftConfig.save_pretrained, or a repository id."
                ) from None
            except LocalEntryNotFoundError:  # offline (or local_files_only) and not in the Hub cache
                raise FileNotFoundError(
                    f"No folder {folder!s} here, and no cached copy of a Hub repository of that name (the Hub was not "
                    "reached: offline or local_files_only=True); check the path, or connect once to download it."
                ) from None
            except RepositoryNotFoundError:
                raise FileNotFoundError(
                    f"No folder {folder!s} here, and no Hub repository of that name (or it is private: pass token=)."
                ) from None
            except EntryNotFoundError:
                raise FileNotFoundError(
                    f"The Hub repository {folder!s}{'@' + revision if revision else ''} has no {name}; save one "
                    "with RiftConfig(...).save_pretrained(folder, push_to_hub=True)."
                ) from None

        path = Path(folder) / CONFIG_NAME if local else fetch(CONFIG_NAME)
        if not path.is_file():
            raise FileNotFoundError(
                f"{folder} has no {CONFIG_NAME}; pass a RiftConfig or a dict as cache_config, or save one with "
                "RiftConfig(...).save_pretrained(folder)."
            )
        data = json.loads(path.read_text())
        head = data.get("selection_head")
        if isinstance(head, str) and head:  # saved relative to the folder, and read from inside it only
            data["selection_head"] = str(confined(folder, head, path) if local else fetch(_relative(head, path)))
        return cls.from_dict({**data, **overrides})

    @classmethod
    def coerce(cls, value: RiftConfig | dict[str, Any] | str | None, folder=None) -> RiftConfig:
        """Accept a `RiftConfig`, a dict of its fields, a preset name, or `None` (the default preset). With `folder`
        (the model folder a dict came with, e.g. in its `generation_config.json`), a `selection_head` the dict names
        is read from inside that folder only, as `from_pretrained` reads one (`confined`)."""
        if value is None:
            return cls()
        if isinstance(value, RiftConfig):
            return value
        if isinstance(value, str):
            return preset(value)
        if isinstance(value, dict):
            data = dict(value)
            head = data.get("selection_head")
            if folder is not None and isinstance(head, str) and head:
                data["selection_head"] = str(confined(folder, head, "cache_config"))
            return cls.from_dict(data)
        raise TypeError(f"`cache_config` must be a RiftConfig, a dict or a preset name, got {type(value).__name__}.")


def _relative(head: str, source) -> str:
    """`head` if it is a path relative to the folder it came with and stays inside it, else a ValueError."""
    if Path(head).is_absolute() or ".." in Path(head).parts:
        raise ValueError(
            f"{source} names selection_head {head!r}, outside the folder it came with; a config read from a file or "
            "a dict may only name a head inside the model's own folder (or Hub repository), by a relative path. To "
            "use a head elsewhere, pass cache_config=RiftConfig(selection_head=...) made in your own code."
        )
    return head


def confined(folder, head: str, source) -> Path:
    """The file `head` names inside `folder`, refused (ValueError) if the name or a symlink on the way leads outside
    it; a Hugging Face cache snapshot's symlinks into its repository's `blobs/` are the one exception."""
    root = Path(folder).resolve()
    path = (root / _relative(head, source)).resolve()
    allowed = [root]
    if root.parent.name == "snapshots":  # huggingface_hub's cache: snapshots/<rev>/<file> -> ../../blobs/<hash>
        allowed.append(root.parent.parent / "blobs")
    if not any(path == base or base in path.parents for base in allowed):
        raise ValueError(
            f"{source} names selection_head {head!r}, which resolves (through a symlink) to {path}, outside "
            f"{root}; a config may only name a head inside the model's own folder."
        )
    return path


def preset(name: str, **overrides: Any) -> RiftConfig:
    """
    A named preset: one per policy of the spec table, with the spec's defaults.

    >>> preset("rift-dyn", budget=2048).delta
    128
    """
    if name not in policy_names():
        raise ValueError(f"Unknown preset {name!r}; choose one of {', '.join(policy_names())}.{_label_hint(name)}")
    return RiftConfig(policy=name, **overrides)


PRESETS = {name: preset(name).to_dict() for name in POLICIES}
