"""Exact acceptance replay: the acceptance length of a RIFT drafter without running the target.

With greedy decoding the target's output `Y` does not depend on the drafter (assisted decoding is lossless), so `Y`
is computed once per prompt (`target_output`, cached as token ids) and every drafter policy is then *replayed*
against it. In a round that starts at length `L`, the drafter's drafts equal `Y[L..]` for as long as they are
accepted, so its predictions are what one teacher-forced forward over those tokens returns from the cache state it
had at the round's start. Per round replay runs

1. the cache crop transformers' `AssistedCandidateGenerator` does (to `L - 2` tokens, which `RiftCache` clamps at
   the end of its last verified forward), then the drafter's first forward over the not-yet-cached verified tokens,
   exactly as `assistant_model.generate` feeds them (so the states of stateful layers are snapshotted where the real
   loop snapshots them);
2. one forward over the `gamma' - 1` next tokens of `Y` (the real loop feeds its drafts one at a time; two forwards,
   split after `rechoose_after` tokens, where the cache chooses again inside the round), all under the target's
   logits processors (e.g. EOS suppressed until `min_new_tokens`);
3. accepted = the length of the prefix where the drafter's argmax equals `Y`, capped as the real loop caps it
   (length, EOS); the round then ends with the target's own token.

Everything the cache does (commit points, eviction, rescoring, rollback, ada signals) runs unchanged inside the
real `RiftCache`. Teacher forcing is exact in arithmetic; a chunked forward and one-token steps round differently
in floating point, so in low precision (bf16) a near-tie can flip a draft. Replay is checked against real
`generate(assistant_model=...)` round by round in the tests (fp32 and fp64) and on real weights
(`python -m lab replay --check-real`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LogitsProcessorList
from transformers.generation.logits_process import MinNewTokensLengthLogitsProcessor

from ._compat import CACHE
from .attention import use_rift_attention
from .cache import RiftCache
from .cache.reading import chunk_plan, read_prompt
from .config import RiftConfig
from .generation.candidate import draft_entropy
from .generation.stats import RiftStats
from .prefill import Prefill, load_prefill, prompt_digest, record_prompt_forward

# Generation-config fields whose logits processors (or stopping rules) replay does not reproduce.
_UNSUPPORTED = {
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": None,
    "encoder_no_repeat_ngram_size": None,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "sequence_bias": None,
    "exponential_decay_length_penalty": None,
    "stop_strings": None,
}


@dataclass(frozen=True)
class TargetOutput:
    """The target's own greedy continuation of one prompt (what every lossless assisted run emits)."""

    prompt_ids: torch.Tensor  # [1, P]
    output_ids: torch.Tensor  # [1, n] new tokens only
    max_new_tokens: int
    min_new_tokens: int
    eos_token_id: list[int]
    pad_token_id: int | None = None
    seconds: float | None = None

    @property
    def sequence(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.output_ids], dim=-1)


def _eos_ids(generation_config) -> list[int]:
    eos = generation_config.eos_token_id
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def check_replayable(model) -> None:
    """Refuse generation settings whose logits processors replay does not reproduce (greedy only)."""
    config = model.generation_config
    if config.do_sample:
        raise ValueError(
            f"Replay reproduces greedy decoding only, but {type(model).__name__}.generation_config.do_sample is True; "
            "set model.generation_config.do_sample = False."
        )
    bad = [name for name, default in _UNSUPPORTED.items() if getattr(config, name, None) not in (default, None, [], ())]
    if bad:
        raise ValueError(
            f"Replay does not reproduce the logits processors of {', '.join(bad)} (set on "
            f"{type(model).__name__}.generation_config); reset them to their defaults to measure with replay, or "
            "measure with real assisted runs (`python -m lab compare`)."
        )


def target_output(target, input_ids: torch.Tensor, max_new_tokens: int, min_new_tokens: int = 0) -> TargetOutput:
    """The target's greedy continuation of `input_ids` (plain decoding, no drafter)."""
    check_replayable(target)
    ids = input_ids.to(target.device)
    tick = time.perf_counter()
    with torch.no_grad():
        out = target.generate(
            ids, do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens or None
        )
    seconds = time.perf_counter() - tick
    return TargetOutput(
        prompt_ids=input_ids.cpu(),
        output_ids=out[:, ids.shape[1] :].cpu(),
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens,
        eos_token_id=_eos_ids(target.generation_config),
        pad_token_id=target.generation_config.pad_token_id,
        seconds=seconds,
    )


def save_target_output(record: TargetOutput, path: Path, **meta) -> None:
    """Write a target output as token ids (JSON), with what keys it: model, prompt digest, lengths, dtype."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        **meta,
        "prompt_sha": prompt_digest(record.prompt_ids),
        "prompt_tokens": record.prompt_ids.shape[1],
        "max_new_tokens": record.max_new_tokens,
        "min_new_tokens": record.min_new_tokens,
        "eos_token_id": record.eos_token_id,
        "pad_token_id": record.pad_token_id,
        "seconds": record.seconds,
        "date": datetime.date.today().isoformat(),
        "output_ids": record.output_ids[0].tolist(),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data) + "\n")
    tmp.replace(path)


def load_target_output(path: Path, input_ids: torch.Tensor) -> TargetOutput:
    data = json.loads(path.read_text())
    if data["prompt_sha"] != prompt_digest(input_ids):
        raise ValueError(
            f"{path} was computed for another prompt (sha {data['prompt_sha']}, this one {prompt_digest(input_ids)}); "
            "delete it to recompute."
        )
    return TargetOutput(
        prompt_ids=input_ids.cpu(),
        output_ids=torch.tensor([data["output_ids"]], dtype=torch.long),
        max_new_tokens=data["max_new_tokens"],
        min_new_tokens=data["min_new_tokens"],
        eos_token_id=data["eos_token_id"],
        pad_token_id=data.get("pad_token_id"),
        seconds=data.get("seconds"),
    )


def target_output_path(root: Path, preset: str, prompt_name: str, input_ids: torch.Tensor, new_tokens: int, dtype):
    """Where the target output of a prompt is cached: keyed by preset (model), prompt, length and dtype."""
    safe = prompt_name.replace(":", "-").replace("/", "-")
    dtype_name = str(dtype).removeprefix("torch.")
    return Path(root) / preset / f"{safe}-{prompt_digest(input_ids)}-{new_tokens}tok-{dtype_name}.json"


def cached_target_output(
    root: Path, preset: str, prompt_name: str, input_ids: torch.Tensor, new_tokens: int, dtype
) -> TargetOutput | None:
    """
    The cached target output of a prompt for `new_tokens`, or None. Without an exact entry, a longer one computed with
    EOS held back at least as long is cut to `new_tokens`: greedy decoding is sequential and the two runs' logits
    processors agree on those first steps, so its prefix is what the shorter run returns (checked on real 256/512-token
    pairs).
    """
    path = target_output_path(root, preset, prompt_name, input_ids, new_tokens, dtype)
    if path.exists():
        return load_target_output(path, input_ids)
    stem = path.name.removesuffix(f"-{new_tokens}tok-{str(dtype).removeprefix('torch.')}.json")
    longer = []
    for other in path.parent.glob(f"{stem}-*tok-{str(dtype).removeprefix('torch.')}.json"):
        length = other.name[len(stem) + 1 :].split("tok-")[0]
        if length.isdigit() and int(length) > new_tokens:
            longer.append((int(length), other))
    for _, other in sorted(longer):
        record = load_target_output(other, input_ids)
        if record.min_new_tokens >= new_tokens and record.output_ids.shape[1] >= new_tokens:
            return TargetOutput(
                prompt_ids=record.prompt_ids,
                output_ids=record.output_ids[:, :new_tokens],
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                eos_token_id=record.eos_token_id,
                pad_token_id=record.pad_token_id,
                seconds=None,
            )
    return None


def ensure_target_outputs(target, prompts, new_tokens: int, root: Path, preset: str, progress: bool = True) -> list:
    """The cached target output of every prompt, computing (and saving, one file each) the missing ones."""
    from tqdm.auto import tqdm

    outputs = []
    for prompt in tqdm(prompts, desc="target outputs", disable=not progress):
        cached = cached_target_output(root, preset, prompt.name, prompt.input_ids, new_tokens, target.dtype)
        if cached is not None:
            outputs.append(cached)
            continue
        path = target_output_path(root, preset, prompt.name, prompt.input_ids, new_tokens, target.dtype)
        record = target_output(target, prompt.input_ids, new_tokens, min_new_tokens=new_tokens)
        save_target_output(
            record, path, preset=preset, model=target.name_or_path, prompt=prompt.name, dtype=str(target.dtype)
        )
        outputs.append(record)
    return outputs


def _processors(record: TargetOutput) -> LogitsProcessorList:
    """The logits processors greedy assisted generation applies to the drafter's scores (EOS held back)."""
    processors = LogitsProcessorList()
    if record.min_new_tokens and record.eos_token_id:
        processors.append(
            MinNewTokensLengthLogitsProcessor(record.prompt_ids.shape[1], record.min_new_tokens, record.eos_token_id)
        )
    return processors


def _padding_mask(record: TargetOutput, verified: torch.Tensor) -> torch.Tensor | None:
    """
    The 2D mask the drafter's `generate` infers from the verified tokens: where the target emitted its pad token (and
    pad is not an EOS), transformers treats it as padding in the drafter; otherwise no mask.
    """
    pad = record.pad_token_id
    if pad is None or pad in record.eos_token_id or not bool((verified == pad).any()):
        return None
    return verified.ne(pad).long()


def _forward(draft, tokens: torch.Tensor, start: int, cache, keep: int, mask: torch.Tensor | None):
    """One drafter forward as `generate` feeds it: positions `start..`, the cache, the last `keep` logits (0: all),
    and the inferred padding mask (`mask`, over the verified tokens; fed tokens after it are never masked)."""
    positions = torch.arange(start, start + tokens.shape[1], device=draft.device)[None]
    kwargs = {}
    if mask is not None:
        ones = torch.ones(1, start + tokens.shape[1] - mask.shape[1], dtype=mask.dtype, device=mask.device)
        kwargs["attention_mask"] = torch.cat([mask, ones], dim=-1)
    return draft(
        input_ids=tokens.to(draft.device),
        position_ids=positions,
        **{CACHE: cache},
        use_cache=True,
        logits_to_keep=keep,
        return_dict=True,
        **kwargs,
    ).logits[0]


def capture_prefill(draft, record: TargetOutput, window: int) -> Prefill | None:
    """
    Run the drafter's prompt forward once and record what its cache received, so that every policy can start from it
    (`replay(..., prefill=...)`) instead of recomputing a long prefill. Until the first commit a policy changes
    nothing in what the forward computes, so the records are what each policy's own prefill would produce. Returns
    None where the records would not suffice: drafters with recurrent (linear-attention, SSM, conv) states.
    `window` is the largest observation window of the policies that will use it.
    """
    prompt = record.prompt_ids.to(draft.device)
    return record_prompt_forward(draft, prompt, window, _padding_mask(record, prompt))


def replay(
    draft,
    record: TargetOutput,
    rift_config: RiftConfig | dict | str | None = None,
    *,
    gamma: int | None = None,
    schedule: str | None = None,
    prefill: Prefill | None = None,
    guide: torch.Tensor | None = None,
) -> RiftStats:
    """
    Replay assisted greedy decoding of `record` (the target's output) with `draft` over a `RiftCache`.

    Args:
        draft: the drafter (any model `cache_implementation="rift"` accepts as `assistant_model`).
        record (`TargetOutput`): the target's greedy output for the prompt (`target_output`).
        rift_config: the drafter cache policy (`RiftConfig`, dict of its fields, or a preset name). Its
            `draft_length` is taken as `"fixed"`: replay drafts `gamma` tokens by `schedule`.
        gamma, schedule: draft length and its schedule (`"constant"` or `"heuristic"`); default to the drafter's
            `generation_config` (`num_assistant_tokens`, `num_assistant_tokens_schedule`), as `generate` does.
        prefill (`Prefill`, *optional*): the drafter's prompt forward recorded by `capture_prefill` (shared between
            policies). Used when the drafter is on the same attention backend and the policy's window fits the
            recorded queries; otherwise the prefill runs here.
        guide (`torch.Tensor`, *optional*): for a guided policy (page-round with `guide="target"`), the target's
            attention at every verification: `target_attention(target, record.sequence, record.prompt_ids.shape[1] - 1)`
            (`rift_hf.generation.guide`); each round hands the cache the row a real run's verification left it.

    Returns:
        `RiftStats` with the rounds (`drafted`, `accepted`, `draft_seconds`, `signals`) as real assisted generation
        records them (`draft_seconds` here times teacher-forced forwards, not real drafting).
    """
    # Replay reproduces a given schedule (`gamma`, `schedule`): the config's cost-aware draft length, whose choices
    # depend on timing, is what it replaces.
    config = dataclasses.replace(RiftConfig.coerce(rift_config), draft_length="fixed")
    generation = draft.generation_config
    gamma = int(generation.num_assistant_tokens if gamma is None else gamma)
    schedule = generation.num_assistant_tokens_schedule if schedule is None else schedule
    if schedule not in ("constant", "heuristic", "heuristic_transient"):
        raise ValueError(f"Unknown draft schedule {schedule!r}; use 'constant' or 'heuristic'.")
    if generation.assistant_confidence_threshold:
        raise ValueError(
            f"Replay needs drafts of a fixed length, but the drafter's assistant_confidence_threshold is "
            f"{generation.assistant_confidence_threshold}; set draft.generation_config.assistant_confidence_threshold "
            "= 0 (rift_hf.models.fix_draft_length does)."
        )
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}.")
    check_replayable(draft)
    guided = config.is_guided
    if guided and guide is None:
        raise ValueError(
            f"Policy {config.policy!r} chooses from the target's attention at each verification; pass "
            "guide=rift_hf.generation.guide.target_attention(target, record.sequence, record.prompt_ids.shape[1] - 1)."
        )
    if guide is not None and not guided:
        raise ValueError(
            f"`guide` is read only by a guided policy (page-round with guide='target'), not {config.policy!r}; drop it."
        )
    use_rift_attention(draft, config)
    sequence = record.sequence.to(draft.device)
    prompt, produced = record.prompt_ids.shape[1], record.output_ids.shape[1]
    max_length = prompt + record.max_new_tokens
    eos = set(record.eos_token_id)
    processors = _processors(record)
    cache = RiftCache(draft.config, config)
    cache.activate_past_recording()
    stats = RiftStats(policy=config.policy, rescorings=cache.events)
    if prefill is not None and (not prefill.serves(draft, config.window) or chunk_plan(cache, prompt, prompt - 1)):
        prefill = None  # recorded for another backend or window, or a whole pass where this policy reads in chunks
    cur = prompt
    with torch.no_grad():
        while cur < prompt + produced:
            if guide is not None and cur > prompt:  # the last verification's newest verified query: position cur - 2
                cache.guide = guide[cur - 2 - (prompt - 1), : cur - 1].to(draft.device)
            drafted = min(gamma, max_length - cur - 1)
            accepted, seconds, entropies = 0, 0.0, []
            if drafted > 0:
                # transformers' _update_past_and_masks: crop to `cur - 2` (RiftCache clamps at its verified forward).
                excess = cache.get_seq_length() - (cur - 2)
                if excess >= 0:
                    cache.crop(-excess)
                tick = time.perf_counter()
                cached = cache.get_seq_length()
                mask = _padding_mask(record, sequence[:, :cur])
                if cached == 0 and prefill is not None:
                    load_prefill(cache, prefill)
                    logits = prefill.logits
                else:
                    if cached == 0:  # a chunked prompt pass reads all but the last token, as in real runs
                        cached = read_prompt(draft, cache, sequence[:, :cur], cur - 1, mask)
                    logits = _forward(draft, sequence[:, cached:cur], cached, cache, 1, mask)
                if drafted > 1:
                    # Teacher forcing: the target's tokens stand where the drafts were; a chunk past the end of the
                    # output (a final EOS) is padded with its last token, rejected anyway.
                    chunk = sequence[:, cur : cur + drafted - 1]
                    if chunk.shape[1] < drafted - 1:
                        chunk = torch.cat([chunk, chunk[:, -1:].expand(1, drafted - 1 - chunk.shape[1])], dim=-1)
                    # Split where the cache chooses again inside the round (`rechoose_after`): before the drafter
                    # feeds its (k + 1)-th draft, as the real loop does one token at a time.
                    after = cache.config.rechoose_after  # the fitted config's (`auto` has chosen its policy)
                    k = after if 0 < after < chunk.shape[1] else chunk.shape[1]
                    parts = [_forward(draft, chunk[:, :k], cur, cache, 0, mask)]
                    if k < chunk.shape[1]:
                        parts.append(_forward(draft, chunk[:, k:], cur + k, cache, 0, mask))
                    logits = torch.cat([logits, *parts], dim=0)
                cache.settle()  # as RiftCandidateGenerator does after drafting
                scores = logits.float()
                for i in range(drafted):
                    scores[i] = processors(sequence[:, : cur + i], scores[i : i + 1])[0]
                drafts = scores.argmax(-1).tolist()
                if draft.device.type == "cuda":
                    torch.cuda.synchronize(draft.device)
                seconds = time.perf_counter() - tick
                expected = sequence[0, cur : cur + drafted].tolist()
                while accepted < min(drafted, len(expected)) and drafts[accepted] == expected[accepted]:
                    accepted += 1
                # The drafter's own generate stops at a drafted EOS. Up to the first rejected draft the teacher-forced
                # drafts are the real ones; after it the real drafter continues from its own token, which replay
                # does not know, so a later EOS stop (only possible when EOS is not held back) is not reproduced.
                stop = next((i for i, token in enumerate(drafts[: accepted + 1]) if token in eos), None)
                if stop is not None:
                    drafted, scores = stop + 1, scores[: stop + 1]
                entropies = draft_entropy(scores)
            # The real loop caps the emitted tokens at the length limit and at an EOS of the target.
            accepted = min(accepted, prompt + produced - cur - 1)
            stats.record_round(cache, drafted, accepted, seconds, entropies)
            if schedule != "constant":  # update_candidate_strategy (a round that drafted nothing counts as full)
                gamma = gamma + 2 if accepted == drafted else max(1, gamma - 1)
            cur += accepted + 1
    return stats
