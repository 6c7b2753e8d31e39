"""What each round of a call drafts: the cost-aware draft length (`DraftLength`) and, with it, the step-aside rule
(`Payoff`), with what both learnt carried from one `generate` call on a pair of models to the next.

A call's `DraftPlan` answers two questions of the candidate generator: how many tokens to draft this round
(`length`), and what a finished round teaches (`observe`). With `draft_length="fixed"` it answers neither and the
drafter's own schedule decides.
"""

from __future__ import annotations

import weakref

from .draft_length import DraftLength
from .payoff import Payoff

# target -> {drafter: the last call's DraftLength}: what the cost-aware draft length learnt, for the next call.
_LEARNT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# target -> {drafter: the last call's Payoff}: what the step-aside rule learnt of the drafter's prompt pass.
_PAYOFFS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _acceptance_seen(controller: DraftLength | None) -> tuple[float, float]:
    """`(accepted, weighed)` over the draft positions a call's controller observed (decayed counts; 0, 0 before it
    drafted)."""
    seen = [] if controller is None else controller.accepted
    return sum(a for a, _ in seen), sum(w for _, w in seen)


class DraftPlan:
    """
    The draft length of each round of one call, and whether the call drafts at all.

    Args:
        draft_length (`DraftLength`, *optional*): the cost-aware controller; None for the drafter's own schedule.
        payoff (`Payoff`, *optional*): the step-aside rule: the first two rounds time the target alone, then the call
            either drafts or leaves the target to decode alone for good (`stepped_aside`).
        learnt_acceptance (`tuple`): `(accepted, weighed)` draft positions of the last call on this pair.
    """

    def __init__(self, draft_length=None, payoff=None, learnt_acceptance=(0.0, 0.0)):
        self.draft_length, self.payoff, self.learnt_acceptance = draft_length, payoff, learnt_acceptance
        self.stepped_aside = False
        self.drafted_before = False  # a round of this call drafted (its first read the prompt)

    @classmethod
    def for_call(cls, config, target, draft, longest: int) -> DraftPlan:
        """The plan of a call drafting at most `longest` tokens a round under `config` (a `RiftConfig`): with
        `target`, it resumes what the last call on `(target, draft)` learnt and leaves this one's for the next."""
        if config.draft_length != "auto":
            return cls()
        learnt = None if target is None else _LEARNT.get(target, {}).get(draft)
        seen = _acceptance_seen(learnt)
        controller = learnt.resume() if learnt is not None and learnt.max_length == longest else DraftLength(longest)
        payoff = None
        if target is not None:
            _LEARNT.setdefault(target, weakref.WeakKeyDictionary())[draft] = controller
            if config.step_aside:
                earlier = _PAYOFFS.get(target, {}).get(draft)
                payoff = earlier.resume() if earlier is not None else Payoff()
                _PAYOFFS.setdefault(target, weakref.WeakKeyDictionary())[draft] = payoff
        return cls(controller, payoff, seen)

    def length(self, target, draft, config, prompt_tokens: int, new_tokens: int) -> int | None:
        """This round's draft length (0: the target alone), or None where the drafter's schedule decides. Once the
        first two rounds timed the target, the step-aside rule decides (`Payoff.decide`) whether the call drafts."""
        payoff = self.payoff
        if (payoff is not None and not payoff.ready) or self.stepped_aside:
            return 0  # timing the target alone, or stepped aside for the rest of the call
        if payoff is not None and payoff.estimate is None:
            seen, controller = self.learnt_acceptance, self.draft_length
            if not payoff.decide(target, draft, prompt_tokens, new_tokens, controller.max_length, seen, config,
                                 measured=controller):  # fmt: skip
                self.stepped_aside = True
                return 0
        return None if self.draft_length is None else self.draft_length.choose()

    def observe(self, drafted: int, accepted: int, draft_seconds: float, verify, forwards: list, read: float):
        """A finished round (`read`: seconds of a chunked prompt pass before it, if any); returns why its length was
        chosen (None under the drafter's schedule)."""
        reason = None
        if self.payoff is not None and (not self.payoff.ready or self.stepped_aside):
            # The step-aside rule's rounds: the target alone, timed before the decision, then for good.
            reason = "stepped aside" if self.stepped_aside else "target first"
            if not self.payoff.ready:
                self.payoff.observe_target(verify or 0.0)
        elif self.draft_length is not None:
            reason = self.draft_length.chosen[-1][1]
            if self.payoff is not None and drafted and not self.drafted_before:
                # The call's first drafting round: its first forward read the prompt (with what a chunked pass read
                # before it), what the rule estimated.
                self.payoff.learn_pass(read + (forwards[0] if forwards else 0.0))
            self.draft_length.observe(drafted, accepted, draft_seconds, verify, forwards)
        self.drafted_before = self.drafted_before or bool(drafted)
        return reason
