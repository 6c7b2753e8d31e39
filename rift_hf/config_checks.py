"""Every check a `RiftConfig` passes when it is made (`check`), each field alone and the fields together; a config
is frozen once checked. Policy-specific rules live with the policy (`Policy.check_params`, `policies/params.py`)."""

from __future__ import annotations

import dataclasses
import numbers

from .policies import is_resolver, policy_class, policy_names
from .policies.params import positive_int

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


def _store_policies() -> str:
    """The registered policies that keep a full store, for error messages."""
    return ", ".join(name for name in policy_names() if policy_class(name).keeps_store)


def check(config) -> None:
    """Check `config` (a `RiftConfig` being made) and fill in what its policy decides (`block_size`, `pages_ahead`,
    `rechoose_after`, `store_dtype="auto"`): a `TypeError` or `ValueError` naming the fix otherwise."""
    for item in dataclasses.fields(config):  # numpy (or other) scalars are numbers like Python's own
        value = getattr(config, item.name)
        if isinstance(value, numbers.Number) and type(value) not in (int, float, bool):
            if isinstance(value, numbers.Integral):
                config._set(item.name, bool(value) if type(value).__name__.startswith("bool") else int(value))
            elif isinstance(value, numbers.Real):
                config._set(item.name, float(value))
    if not isinstance(config.policy, str):
        raise TypeError(f"`policy` must be a policy name such as 'rift-stat', got {config.policy!r}.")
    policy_class(config.policy)  # raises on an unknown name
    check_sizes(config, MAX_TOKENS, "any model's context")
    if config.block_size is None:
        config._set("block_size", policy_class(config.policy).block_size)
    if config.pages_ahead is None:
        config._set("pages_ahead", policy_class(config.policy).pages_ahead)
    if config.rechoose_after is None:
        config._set("rechoose_after", policy_class(config.policy).rechoose_after)
    check_policy_fields(config)  # a field the policy does not read, set, is refused before anything else
    if isinstance(config.budget, bool) or not isinstance(config.budget, (int, float)):
        raise TypeError(
            f"`budget` must be an int (tokens) or a float in (0, 1) (fraction of the prompt), got {config.budget!r}."
        )
    if isinstance(config.budget, float) and not 0.0 < config.budget < 1.0:
        raise ValueError(
            f"A float `budget` is a fraction of the prompt in (0, 1), got {config.budget}; pass an int for a token "
            "count (budget=1.0 would keep everything: use policy='full')."
        )
    if isinstance(config.budget, int) and config.budget <= 0:
        raise ValueError(f"`budget` must be a positive number of tokens, got {config.budget}.")
    if config.rho is not None and (isinstance(config.rho, bool) or not isinstance(config.rho, (int, float))):
        raise TypeError(f"`rho` must be a number or None, got {config.rho!r}.")
    if config.rho is not None and not 0.0 <= config.rho <= 1.0:
        raise ValueError(f"`rho` must lie in [0, 1], got {config.rho}.")
    if isinstance(config.n_sink, bool) or not isinstance(config.n_sink, int):
        raise TypeError(f"`n_sink` must be an int, got {config.n_sink!r}.")
    if config.n_sink < 0:
        raise ValueError(f"`n_sink` must be >= 0, got {config.n_sink}.")
    if config.kv_equal_bytes not in (True, False, *EQUAL_BYTES_DTYPES):
        raise TypeError(
            f"`kv_equal_bytes` must be True, False or one of {', '.join(EQUAL_BYTES_DTYPES)} (count the budget's "
            f"bytes as if the model ran in that dtype), got {config.kv_equal_bytes!r}."
        )
    for name in ("track_attention_mass", "attend_in_place", "compile", "step_aside"):
        if not isinstance(getattr(config, name), bool):
            raise TypeError(f"`{name}` must be True or False, got {getattr(config, name)!r}.")
    if config.selection_head is not None:
        if not isinstance(config.selection_head, str) or not config.selection_head:
            raise TypeError(f"`selection_head` must be a path (str) or None, got {config.selection_head!r}.")
        if not policy_class(config.policy).scored or policy_class(config.policy).retrieves:
            raise ValueError(
                f"Policy {config.policy!r} does not select with its recent queries, so a `selection_head` has "
                "nothing to act on; drop it, or use a scored policy such as 'rift-stat'."
            )
    if config.store_dtype == "auto":  # the policy's choice, unless attending the store in place (full precision)
        config._set("store_dtype", None if config.attend_in_place else policy_class(config.policy).store_dtype)
    if config.store_device is not None:
        check_store_device(config)
    if config.store_dtype is not None:
        check_store_dtype(config)
    if config.kv_dtype is not None or config.kv_equal_bytes:
        check_kv_dtype(config)
    if config.attend_in_place and not policy_class(config.policy).keeps_store:
        raise ValueError(
            f"`attend_in_place` attends the rows of the full store, which policy {config.policy!r} does not keep; "
            f"drop it, or use a store policy ({_store_policies()})."
        )
    for name in ("store_group_size", "store_residual", "kv_group_size"):
        positive_int(name, getattr(config, name))
    check_reading(config)
    if config.draft_length not in ("auto", "fixed"):
        raise ValueError(
            f"`draft_length` must be 'auto' (cost-aware, per round) or 'fixed' (transformers' "
            f"num_assistant_tokens schedule), got {config.draft_length!r}."
        )
    if is_resolver(config.policy):  # `auto`: valid if valid for each policy it may pick
        policy_class(config.policy).check(config)
        return
    config.policy_object.check_params()  # the fields the policy reads, and its own rules between them
    if config.compile:
        check_compile(config)
    if isinstance(config.budget, int):
        config.policy_object.check_budget(config.budget)


def check_sizes(config, limit: int, what: str) -> None:
    for name in TOKEN_FIELDS:
        value = getattr(config, name)
        if isinstance(value, int) and not isinstance(value, bool) and value > limit:
            raise ValueError(f"`{name}` = {value} exceeds {what}; lower it.")
    ahead, block = config.pages_ahead, config.block_size
    pages = ahead * block if all(isinstance(v, int) and not isinstance(v, bool) for v in (ahead, block)) else 0
    if pages > limit:
        raise ValueError(f"`pages_ahead` x `block_size` = {pages} tokens exceeds {what}; lower `pages_ahead`.")


def check_reading(config) -> None:
    """`prompt_chunk` (0 or a chunk of at least the observation window) and `prompt_budget` (like `budget`)."""
    chunk = config.prompt_chunk
    if chunk is None:
        chunk = config.reading_chunk
    elif isinstance(chunk, bool) or not isinstance(chunk, int):
        raise TypeError(f"`prompt_chunk` must be an int (tokens per chunk, 0 for one forward), got {chunk!r}.")
    least = config.window if config.is_scored else 1  # a scored policy chooses with a chunk's last `window` queries
    if chunk < 0 or 0 < chunk < least:
        raise ValueError(
            f"`prompt_chunk` must be 0 (read the prompt in one forward) or at least {least} tokens (policy "
            f"{config.policy!r} chooses with a chunk's last `window` queries), got {chunk}."
        )
    if config.prompt_chunk and config.kv_dtype is not None:
        raise ValueError(
            "A chunked prompt pass (`prompt_chunk`) chooses among full-precision rows; drop `kv_dtype` or set "
            "prompt_chunk=0."
        )
    reading = config.prompt_budget
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


def check_compile(config) -> None:
    """`compile=True` needs a working set of fixed size that the compiled step can read and write as it is."""
    chosen = policy_class(config.policy)
    reasons = [
        (not chosen.compresses, f"policy {config.policy!r} keeps every token (its cache grows each step)"),
        (chosen.retrieves, f"policy {config.policy!r} attends rows retrieved per query"),
        (config.snapkv_grow, "`snapkv_grow` appends every generated token"),
        (config.kv_dtype is not None, "a quantised selection (`kv_dtype`) is dequantised at each step"),
        (config.attend_in_place, "`attend_in_place` attends the store through the Triton kernel"),
        (config.track_attention_mass, "`track_attention_mass` measures every step against the full store"),
    ]
    for refused, why in reasons:
        if refused:
            raise ValueError(
                f"compile=True needs a fixed-size working set, but {why}. Drop compile=True, or use a policy "
                "such as 'page-round', 'rift-stat' or 'swa' without that option."
            )


def check_policy_fields(config) -> None:
    """Refuse a field some policy reads, set away from its default for this policy, which does not read it."""
    chosen = policy_class(config.policy)
    users: dict[str, list[str]] = {}
    for name in policy_names():
        for field in policy_class(name).params:
            users.setdefault(field, []).append(name)
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    for field, readers in users.items():
        value = getattr(config, field)
        # `block_size`/`pages_ahead` left unset are filled with the policy's own (what a saved config holds).
        if field in chosen.params or value == defaults[field] or value == getattr(chosen, field, defaults[field]):
            continue
        raise ValueError(
            f"Policy {config.policy!r} does not read `{field}` (set to {value!r}); only {', '.join(readers)} do. "
            f"Drop `{field}`, or choose one of those policies."
        )


def check_store_dtype(config) -> None:
    if config.store_dtype not in STORE_DTYPES:
        raise ValueError(
            f"`store_dtype` must be one of {', '.join(STORE_DTYPES)} (or None: the model's dtype), got "
            f"{config.store_dtype!r}."
        )
    if not config.keeps_store:
        raise ValueError(
            f"`store_dtype` quantises the full store, which policy {config.policy!r} does not keep; drop it, or use "
            f"a store policy ({_store_policies()})."
        )
    if config.attend_in_place:
        raise ValueError(
            "`attend_in_place` attends the store's rows as they are and cannot read a quantised store; drop one."
        )


def check_kv_dtype(config) -> None:
    if config.kv_dtype is None:
        raise ValueError(
            "`kv_equal_bytes` reads the budget as bytes so that a quantised selection holds more rows; set "
            "`kv_dtype` ('int8', 'int4' or 'int2') too, or drop it."
        )
    if config.kv_dtype not in STORE_DTYPES:
        raise ValueError(
            f"`kv_dtype` must be one of {', '.join(STORE_DTYPES)} (or None: the model's dtype), got "
            f"{config.kv_dtype!r}."
        )
    cls = policy_class(config.policy)
    if not cls.compresses or not cls.scored or cls.retrieves:
        selecting = [
            name
            for name in policy_names()
            if policy_class(name).compresses and policy_class(name).scored and not policy_class(name).retrieves
        ]
        raise ValueError(
            f"`kv_dtype` quantises the selected rows of the working set, which policy {config.policy!r} does not "
            f"keep; drop it, or use a selecting policy ({', '.join(selecting)}). For a store policy's full store "
            "use `store_dtype`."
        )
    if config.attend_in_place:
        raise ValueError(
            "`attend_in_place` attends the store's rows and keeps no working set to quantise; drop one of them."
        )


def check_store_device(config) -> None:
    import torch

    if not config.keeps_store:
        raise ValueError(
            f"`store_device` places the full store, which policy {config.policy!r} does not keep; drop it, or use "
            f"{_store_policies()} (or track_attention_mass=True)."
        )
    try:
        device = torch.device(config.store_device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"`store_device` must name a torch device such as 'cpu' or 'cuda:0', got {config.store_device!r}."
        ) from err
    if device.type == "meta":
        raise ValueError("`store_device='meta'` holds no data; use 'cpu' or the model's device.")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"`store_device={config.store_device!r}` but this machine has no CUDA device; use 'cpu' or drop it."
        )
