"""Per-request statistics of RIFT drafting: rounds, acceptance length, rescorings, ada signals."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RiftStats:
    """
    What happened in one `generate` call.

    Attributes:
        policy: the drafter cache policy.
        rounds: one dict per target verification round: `drafted`, `accepted`, `draft_seconds`, `signals`.
        rescorings: one dict per rescoring: `position`, `seconds`, `reason`, `signals`.
        prompt_tokens, budget: the resolved budget in tokens (`None` for `full`).
        peak_kv_bytes, peak_store_bytes: drafter KV memory, working set and full store, peak after each round.
        attention_mass: `(position, share)` of full-cache attention mass on kept positions (measurement mode).
    """

    policy: str
    rounds: list[dict] = field(default_factory=list)
    rescorings: list[dict] = field(default_factory=list)
    prompt_tokens: int | None = None
    budget: int | None = None
    peak_kv_bytes: int = 0  # drafter KV that attention reads (working sets, sliding windows), peak over rounds
    peak_store_bytes: int = 0  # full stores of rift-dyn/ada (or the measurement mode), peak over rounds
    attention_mass: list = field(default_factory=list)  # (position, share kept), with track_attention_mass

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
    def rescore_seconds(self) -> float:
        return sum(e["seconds"] for e in self.rescorings)

    def to_dict(self) -> dict:
        return {
            "policy": self.policy,
            "prompt_tokens": self.prompt_tokens,
            "budget": self.budget,
            "acceptance_length": self.acceptance_length,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "draft_seconds": self.draft_seconds,
            "decode_ms_per_draft_token": self.decode_ms_per_draft_token,
            "rescore_seconds": self.rescore_seconds,
            "peak_kv_bytes": self.peak_kv_bytes,
            "peak_store_bytes": self.peak_store_bytes,
            "rounds": self.rounds,
            "rescorings": self.rescorings,
        }
