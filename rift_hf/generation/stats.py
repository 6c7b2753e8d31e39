"""Per-request statistics of RIFT drafting: rounds, acceptance length, rescorings, ada signals."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(repr=False)
class RiftStats:
    """
    What happened in one `generate` call.

    Attributes:
        policy: the drafter cache policy (for `auto`, the policy it chose once the cache saw the prompt).
        rounds: one dict per target verification round: `drafted`, `accepted`, `draft_seconds`, `signals`.
        rescorings: one dict per rescoring: `position`, `seconds`, `reason`, `signals`.
        prompt_tokens, budget: the resolved budget in tokens (`None` for `full`).
        peak_kv_bytes, peak_store_bytes: drafter KV memory, working set and full store, peak after each round.
        attention_mass: `(position, share)` of full-cache attention mass on kept positions (measurement mode).
        compiled_steps, eager_steps, compiles: with `compile=True`, one-token drafter forwards through the compiled
            step and those that ran eagerly (before the first compression, or past the headroom), and the graphs
            compiled in this call (one per working-set shape the drafter had not met: later calls replay them).
        peak_bytes: the drafter's KV (working sets, sliding windows and stores) at its largest over the call, the
            prompt pass included (read off the cache's tensors just before each commit).
        stepped_aside: the default (`draft_length="auto"`) judged that speculation could not repay the drafter's
            prompt pass and let the target decode alone (the drafter never ran); `payoff` holds that judgement's
            estimates (`rift_hf.generation.payoff`), None where it was not made.
        repeatable: whether the same call under the same seed gives the same output: always for greedy decoding (the
            target's own output); when sampling only with `draft_length="fixed"`, since the default chooses draft
            lengths (and whether to draft) from measured time, and each drafted token consumes the target's random
            draws. For repeatable sampling pass `cache_config={"draft_length": "fixed"}`.
        prompt_read_seconds, prompt_chunks: with a chunked prompt pass (`prompt_chunk`), its seconds and chunks.
        prompt_load_seconds: with a recorded prompt forward (`generate_from`), the seconds spent loading it into the
            drafter's cache (store filled and quantised, prompt scores), which a real run spends in its prompt
            forward and a decode-phase run inside its timed decode; `None` otherwise.
    """

    policy: str
    rounds: list[dict] = field(default_factory=list)
    rescorings: list[dict] = field(default_factory=list)
    prompt_tokens: int | None = None
    budget: int | None = None
    peak_kv_bytes: int = 0  # drafter KV that attention reads (working sets, sliding windows), peak over rounds
    peak_store_bytes: int = 0  # full stores of rift-dyn/ada (or the measurement mode), peak over rounds
    attention_mass: list = field(default_factory=list)  # (position, share kept), with track_attention_mass
    compiled_steps: int = 0
    eager_steps: int = 0
    compiles: int = 0
    peak_bytes: int = 0
    stepped_aside: bool = False
    repeatable: bool = True
    payoff: dict | None = None
    prompt_read_seconds: float | None = None
    prompt_chunks: int = 0
    prompt_load_seconds: float | None = None

    def record_round(
        self,
        cache,
        drafted: int,
        accepted: int,
        draft_seconds: float,
        entropies: list[float],
        verify_seconds: float | None = None,
        reason: str | None = None,
    ) -> None:
        """
        One verification round on `cache` (a `RiftCache`): feeds the ada signals (AL, and the drafter's entropy at
        the committed positions: the accepted drafts and the first rejected one) and updates rounds, rescorings,
        peak memory, the attention-mass log, prompt length and budget. `verify_seconds` (the target's side of the
        round) and `reason` (why the cost-aware draft length chose `drafted`) are kept where given.
        """
        cache.signals.observe_round(accepted, entropies[: accepted + 1])
        self.rounds.append(
            {
                "drafted": drafted,
                "draft_seconds": draft_seconds,
                "accepted": accepted,
                "signals": cache.signals.snapshot(),
                **({} if verify_seconds is None else {"verify_seconds": verify_seconds}),
                **({} if reason is None else {"reason": reason}),
            }
        )
        self.rescorings = cache.events
        held = cache.kv_bytes()
        self.peak_kv_bytes = max(self.peak_kv_bytes, held["working"])
        self.peak_store_bytes = max(self.peak_store_bytes, held["store"])
        self.peak_bytes = max(self.peak_bytes, cache.peak_bytes, held["working"] + held["store"])
        if cache.config.track_attention_mass:
            self.attention_mass = cache.attention_mass_log()
        self.prompt_tokens = cache.prompt_length
        self.policy = cache.config.policy
        self.budget = None if cache.budget == float("inf") else int(cache.budget)

    @property
    def acceptance_length(self) -> float:
        """Tokens emitted per verification round, bonus token included (SPEED-Bench AL)."""
        if not self.rounds:
            return float("nan")
        return sum(r["accepted"] + 1 for r in self.rounds) / len(self.rounds)

    @property
    def drafted(self) -> int:
        return sum(r["drafted"] for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(r["accepted"] for r in self.rounds)

    @property
    def draft_seconds(self) -> float:
        return sum(r["draft_seconds"] for r in self.rounds)

    @property
    def decode_ms_per_draft_token(self) -> float:
        """Drafter time per drafted token, leaving out the first round (which includes the drafter's prefill)."""
        rounds = self.rounds[1:]
        drafted = sum(r["drafted"] for r in rounds)
        return 1000 * sum(r["draft_seconds"] for r in rounds) / drafted if drafted else float("nan")

    @property
    def draft_lengths(self) -> list[int]:
        """Tokens drafted in each round (chosen per round by the cost-aware draft length, `draft_length="auto"`)."""
        return [r["drafted"] for r in self.rounds]

    @property
    def rounds_without_drafting(self) -> int:
        """Rounds in which the target decoded alone (no draft was worth its cost, or the length limit left none)."""
        return sum(r["drafted"] == 0 for r in self.rounds)

    @property
    def rescore_seconds(self) -> float:
        return sum(e["seconds"] for e in self.rescorings)

    def __repr__(self) -> str:
        """One line (the per-round details are in `rounds`, `rescorings` and `to_dict()`)."""
        budget = "full" if self.budget is None else f"{self.budget}/{self.prompt_tokens} tokens"
        return (
            f"RiftStats(policy={self.policy!r}, budget={budget}, rounds={len(self.rounds)}, "
            f"{'stepped_aside=True, ' if self.stepped_aside else ''}"
            f"{'' if self.repeatable else 'repeatable=False (sampling; draft_length=fixed repeats), '}"
            f"AL={self.acceptance_length:.2f}, drafted={self.drafted}, accepted={self.accepted}, "
            f"rounds_without_drafting={self.rounds_without_drafting}, rescorings={len(self.rescorings)}, "
            f"peak_kv={self.peak_kv_bytes / 2**20:.2f} MiB, peak_store={self.peak_store_bytes / 2**20:.2f} MiB)"
        )

    def to_dict(self) -> dict:
        return {
            "policy": self.policy,
            "prompt_tokens": self.prompt_tokens,
            "budget": self.budget,
            "acceptance_length": self.acceptance_length,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "rounds_without_drafting": self.rounds_without_drafting,
            "draft_seconds": self.draft_seconds,
            "decode_ms_per_draft_token": self.decode_ms_per_draft_token,
            "rescore_seconds": self.rescore_seconds,
            "peak_kv_bytes": self.peak_kv_bytes,
            "peak_bytes": self.peak_bytes,
            "stepped_aside": self.stepped_aside,
            "repeatable": self.repeatable,
            "payoff": self.payoff,
            "peak_store_bytes": self.peak_store_bytes,
            "rounds": self.rounds,
            "rescorings": self.rescorings,
            "compiled_steps": self.compiled_steps,
            "eager_steps": self.eager_steps,
            "compiles": self.compiles,
        }
