"""The lab: what runs and records our experiments on top of the library, from a clone of the repository (it is not
in the installed package). It imports `rift_hf`; nothing in `rift_hf` imports it.

- `records`: `Experiment` (what a run measures, shared by the runners and the recipes' evaluation) and the
  per-prompt row they write, the machine line, `compare`'s resume log, per-policy summaries, `summary.json` upkeep;
- `compare`: policies side by side by real generation (`python -m lab compare`);
- `replay_runs`: the same records by exact replay (`python -m lab replay`);
- `recipe`, `head_recipe`: compressibility training of a drafter or a selection head (`python -m lab train`,
  `train-head`);
- `tables`, `plots`: markdown tables and figures of all of these, and the README block writer;
- `cli`: the commands (`python -m lab --help`). `benchmarks/` holds the one-off measurements beside it.
"""
