"""Looks instead of probes, played on the traces of `benchmarks.draft_length_traces` (#40; not adopted, kept to rerun).

When no draft length beats the target alone, the cost-aware length (`DraftLength`) drafts nothing for a back-off and
then probes (drafts `first_length` tokens, verified at a loss when none is accepted). A *look* would end a back-off
more cheaply: the drafter re-feeds the tokens the target emitted alone (one forward: no drafts, no verification), its
greedy predictions there say how many drafts would have been accepted (`observe_idle`), and the controller chooses
from that evidence. A look replaces a probe only once drafting is priced (a verification of several tokens and a
drafter step observed), since a probe also prices it.

    python -m benchmarks.draft_length_looks                  # probe / look / look-spaced, a look at 1.5 first forwards
    python -m benchmarks.draft_length_looks --look-scale 1.0

A look is priced at `--look-scale` times a round's first drafter forward (the trace's `first`, else a step plus the
replay's refresh seconds): re-feeding costs more than the one token a drafting round's first forward feeds (~16K,
bf16, `speed-16384in-128tok-bf16`: a 4-token draft after >= 3 rounds without drafting took 0.49 s, median of 14,
against 0.38 s after a drafting round). Variants: `probe` (today's controller), `look` (looks replace probes; back-offs
unchanged), `look-spaced` (every back-off spaced by a look's own cost: `probe_share` of the time between, without
doubling), `look-budget` (as `look-spaced`, but the short back-offs today's controller keeps, while exploring and after
drafting last paid, stay short until looks alone have cost `explore_steps` target steps).

Writes `<--out>/draft-length-looks.json` and a markdown table beside it (`benchmarks/results/` by default).
"""

from __future__ import annotations

import argparse
import datetime
import math
from dataclasses import dataclass
from pathlib import Path

from benchmarks import draft_length_traces as traces
from rift_hf.experiments.records import write_record
from rift_hf.experiments.tables import pipe_table
from rift_hf.generation.draft_length import DraftLength


@dataclass
class LookingDraftLength(DraftLength):
    """`DraftLength` that ends a back-off with a look (`looked`) where its caller took one (`wants_look`)."""

    spaced: bool = False  # space long back-offs by a look's cost rather than a probe's (no doubling)
    budget: bool = False  # ... and keep the short back-offs today's controller keeps while looks cost little
    looks: int = 0
    look_cost: float = 0.0  # seconds of one look
    looked_now: bool = False

    def wants_look(self) -> bool:
        """Whether the next round ends a back-off (a probe) with drafting already priced."""
        priced = len(self.verify_cost.sums) >= 2 and self.step[1] > 0
        return self.warm and self.idle == 1 and self.missed > 0 and priced

    def looked(self) -> None:
        self.looked_now, self.missed = True, 0
        self.looks += 1

    def choose(self) -> int:
        looked, self.looked_now = self.looked_now, False
        if looked and self.idle == 1:
            self.idle = 0
            best = max(range(self.max_length + 1), key=self.rate)
            if best > 0:
                self.wait = self.backoff
                return self._pick(best, "look")
        idle_before = self.idle
        length = super().choose()
        if self.spaced and length == 0 and idle_before == 0 and self.idle > 0:  # a back-off starts here
            if self.budget and self.idle == self.backoff:
                # Keep the short back-offs today's controller keeps (exploring; the first after drafting paid), unless
                # looks alone have spent the exploration budget.
                if self.looks * self.look_cost < self.explore_steps * self.verify_cost(1):
                    return length
            spacing = math.ceil(self.look_cost / (self.probe_share * max(self.verify_cost(1), 1e-9)))
            self.idle = max(self.backoff, min(spacing, self.max_backoff))
        return length


def player(look_scale: float):
    """`draft_length_traces.play`, with a look (priced `look_scale` first forwards) wherever the controller wants
    one."""

    def play(runs, trace, new_tokens, controller, refresh=0.0):
        controller.look_cost = look_scale * (trace.step + refresh)
        return traces.play(runs, trace, new_tokens, controller, refresh, look=controller.look_cost)

    return play


VARIANTS = {
    "probe": lambda max_length: LookingDraftLength(max_length=max_length),  # never looks: the caller is not asked
    "look": lambda max_length: LookingDraftLength(max_length=max_length),
    "look-spaced": lambda max_length: LookingDraftLength(max_length=max_length, spaced=True),
    "look-budget": lambda max_length: LookingDraftLength(max_length=max_length, spaced=True, budget=True),
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--look-scale", type=float, default=1.5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    rows = []
    for name, make in VARIANTS.items():
        play = traces.play if name == "probe" else player(args.look_scale)
        rows += [{"variant": name, **row} for row in traces.evaluate(args.new_tokens, make=make, player=play)]
    record = {"date": datetime.date.today().isoformat(), "new_tokens": args.new_tokens,
              "look_scale": args.look_scale, "rows": rows}  # fmt: skip
    headers = ["variant", "set", "half", "regime", "controller / target", "lowest / target", "controller / 11",
               "controller / best constant (k)"]  # fmt: skip
    body = [
        [r["variant"], r["set"], r["half"], r["regime"], f"{r['vs_target']:.2f}", f"{r['lowest_vs_target']:.2f}",
         f"{r['vs_constant_11']:.2f}", f"{r['vs_best_constant']:.2f} ({r['best_constant']})"]
        for r in rows
    ]  # fmt: skip
    write_record(args.out, "draft-length-looks", record, pipe_table(headers, body) + "\n")


if __name__ == "__main__":
    main()
