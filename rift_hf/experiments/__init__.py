"""The lab: what runs and records experiments on top of the library (compare and replay runners, resume logs,
`summary.json`, markdown tables, README blocks). It imports `rift_hf`; nothing in the library imports it.

- `records`: `Experiment` (what a run measures, shared by the runners and the recipes' evaluation) and the
  per-prompt row they write, the machine line, `compare`'s resume log, per-policy summaries, `summary.json` upkeep;
- `compare`: policies side by side by real generation (`rift-hf compare`);
- `replay_runs`: the same records by exact replay (`rift-hf replay`);
- `tables`: markdown tables of all of these, and the README block writer.
"""
