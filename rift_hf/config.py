"""`RiftConfig`: which positions a compressed drafter cache keeps, validated at construction.

The fields and their defaults follow `shared/notes/rift-spec.md`; every choice the paper leaves open is a
field here, so a run can be reproduced from its config alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .budget import CHUNKED_UP_TO, DEFAULT_CHUNK, fit, resolve
from .config_checks import EQUAL_BYTES_DTYPES, MAX_TOKENS, STORE_DTYPES, TOKEN_FIELDS, check, check_sizes
from .config_files import CONFIG_NAME, ConfigFiles, confined
from .policies import Policy, is_resolver, policy_class, policy_fields, policy_names, policy_settings

__all__ = [
    "CHUNKED_UP_TO", "CONFIG_NAME", "DEFAULT_CHUNK", "EQUAL_BYTES_DTYPES", "MAX_TOKENS", "POLICIES", "PRESETS",
    "STORE_DTYPES", "TOKEN_FIELDS", "RiftConfig", "confined", "policy_fields", "policy_settings", "preset",
]  # fmt: skip


# The built-in policies, one file each under `rift_hf/policies/` (a registered policy added later is valid too).
POLICIES = policy_names()


@dataclass(frozen=True)
class RiftConfig(ConfigFiles):
    """
    What a RIFT-compressed cache keeps in each full-attention layer, per KV head.

    Every compressed layer keeps `n_sink` first tokens, the `floor(rho * budget)` most recent tokens and
    `budget - recent - n_sink` older tokens selected by the SnapKV scorer; the schedule (once at prefill, every
    `delta` tokens, or adaptively) decides when the selection is refreshed.

    Args:
        policy (`str`, defaults to `"auto"`):
            A registered policy (`rift_hf.policies.policy_names()`): the paper's `full`, `swa`, `snapkv`, `rift-stat`,
            `rift-stat-block`, `rift-dyn`, `rift-ada`; ours `page-ahead`, `page-retrieval`, `page-round`
            (docs/results/e1-scale.md); and `auto`, the default, which picks one by the prompt's length when the cache
            sees it (`rift_hf/policies/auto.py`) and takes only the fields both of its choices read.
        budget (`int` or `float`, defaults to `0.25`):
            Past-token entries kept per layer and KV head: an `int` number of tokens, or a `float` in (0, 1) taken
            as a fraction of the prompt length (0.25 = "4x compression").
        rho (`float`, *optional*):
            Share of the budget given to the most recent tokens. Defaults per policy: 1.0 for `swa`, `window/budget`
            for `snapkv`, 0.5 for the RIFT policies, 0.25 for `page-ahead`.
        n_sink (`int`, defaults to 0): first tokens always kept (attention sinks).
        window (`int`, defaults to 64): observation window `w`, the number of latest queries the scorer uses.
        pool, pool_kernel, tokens_ahead, block_size, pages_ahead, score_queries, rechoose_after, guide, delta,
        snapkv_grow, check_interval, a_min, a_max, al_alpha, al_threshold, entropy_threshold, drift_threshold: a
            policy's own fields, each read only by the policies that list it in `Policy.params` (set for another
            policy, it is refused) and documented with them: scoring in `policies/scorers.py`, pages in
            `policies/pages.py`, `page_round.py` (`guide`), `rift_dyn.py` (`delta`), `rift_ada.py`, `snapkv.py`.
        store_device (`str`, *optional*): where `rift-dyn`/`rift-ada` keep the full store (`"cpu"` to offload);
            defaults to the model's device.
        track_attention_mass (`bool`, defaults to `False`): keep a shadow full store and record the share of the
            full-cache attention mass that falls on the retained positions (a measurement mode, slower).
        attend_in_place (`bool`, defaults to `False`): store policies with the store on the compute device and Triton
            kernels: attend the kept rows of the store in place (Triton `indexed_attention`) instead of keeping a
            working-set copy. Saves the working set's memory; slower per step on an H200 (docs/kernels.md).
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
            the policy choosing its working set after each (`rift_hf.cache.reading`): at most the working set plus
            one chunk at full precision, attention time linear in the prompt, approximate keys and values (which
            costs acceptance, never correctness). 0 reads it in one forward (`page-retrieval` always does). Defaults
            to `DEFAULT_CHUNK` (or the window if longer) for prompts of up to `CHUNKED_UP_TO` tokens, 0 for longer
            ones (unless `prompt_budget` is set) and with `kv_dtype`; `fitted(n).reading_chunk` is the chunk in
            effect for a prompt of `n` tokens.
        prompt_budget (`int` or `float`, *optional*): with `prompt_chunk`, the working set a store policy reads with
            (tokens, or a fraction of the prompt; at most `budget`); its real working set is chosen from the store
            once the prompt is read. Policies without a store read with `budget`. Defaults to `budget`.
        compile (`bool`, defaults to `False`): in assisted generation, draft through a `torch.compile`d one-token
            step over the fixed-size working set (`rift_hf.generation.compiled`, which says where it applies;
            inductor on a CPU, CUDA graphs on a GPU); the round's first forward, commits and refreshes stay eager.
            The first step compiles (tens of seconds); later steps, rounds and calls on the same drafter replay it.

    A config is frozen once made (every field checked together); `replace(**changes)` makes a checked copy.

    Example:

    ```python
    >>> from rift_hf import RiftConfig
    >>> RiftConfig(policy="rift-dyn", budget=0.25, delta=128).recent_tokens(1024)  # rho 0.5 of a 1,024-token budget
    512
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
    guide: str | None = None
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
        check(self)

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
            check_sizes(self, context, f"the model's context ({context} tokens, max_position_embeddings)")

    @property
    def reading_chunk(self) -> int:
        """The chunk the prompt is read in (`prompt_chunk`, or its default); 0: one forward."""
        if self.prompt_chunk is not None:
            return self.prompt_chunk
        return 0 if self.kv_dtype is not None else max(DEFAULT_CHUNK, self.window)

    @property
    def policy_type(self) -> type:
        """The class `policy` names: a `Policy`, or a resolver (`auto`) whose class attributes say what the policies it
        may pick share (scored, keeps_store ...)."""
        return policy_class(self.policy)

    @property
    def policy_object(self) -> Policy:
        """The registered policy class named by `policy`, bound to this config."""
        if is_resolver(self.policy):
            raise ValueError(
                f"policy={self.policy!r} picks a policy by the prompt's length, so this config has none yet: use "
                "`config.fitted(prompt_length).policy_object` (or `config.policy_type` for what its choices share)."
            )
        return policy_class(self.policy)(self)

    @property
    def is_scored(self) -> bool:
        return policy_class(self.policy).scored

    @property
    def is_guided(self) -> bool:
        """Whether the target's attention chooses the drafter's pages (`Policy.guided`; `auto` picks unguided ones)."""
        return not is_resolver(self.policy) and self.policy_object.guided

    @property
    def keeps_store(self) -> bool:
        """Whether the full draft KV is kept (rescoring policies, or the staleness measurement)."""
        return policy_class(self.policy).keeps_store or self.track_attention_mass

    def fitted(self, prompt_length: int) -> RiftConfig:
        """This config for a prompt of `prompt_length` tokens: `auto`'s choice made, sizes shrunk to a short prompt's
        budget (`rift_hf.budget.fit`)."""
        return fit(self, prompt_length)

    def resolve_budget(self, prompt_length: int) -> int | float:
        """The budget in tokens for a prompt of `prompt_length` tokens, `math.inf` for a policy that does not compress
        (`rift_hf.budget.resolve`)."""
        return resolve(self, prompt_length)

    def recent_tokens(self, budget: int) -> int:
        """R: the size of the rolling window of most recent tokens for a resolved `budget`."""
        return self.policy_object.recent_tokens(budget)


# A named preset (`RiftConfig.preset`): one per policy of the spec table, with the spec's defaults.
preset = RiftConfig.preset
PRESETS = {name: preset(name).to_dict() for name in POLICIES}
