"""Every table in the README, regenerated from its record in one command (`make readme-tables`):

    python -m benchmarks.readme_tables [--readme README.md]

- `end-to-end`: whole `generate()` calls (`python -m benchmarks.end_to_end table <record> --readme README.md`);
- `replay-regimes`: retention by replay per policy, compression and regime (`python -m lab table <folder> --wide
  --policies ... --readme README.md --block replay-regimes`);
- `training-headline`: the last trained drafter's retention before and after, from its model card's `eval.json`.

Each block is rewritten in place from records committed under `benchmarks/results/` and `model_cards/`; no model runs.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from benchmarks.end_to_end import readme_block
from lab.cli import main as lab_cli
from lab.tables import write_into_readme
from rift_hf.training.card import headline

REPLAY = "benchmarks/results/E1/qwen-coder/replay-4096in-512tok-8per-task"
REPLAY_POLICIES = "snapkv,rift-dyn,rift-stat,page-retrieval,page-round@pages_ahead=2"
TRAINED = "qwen2.5-coder-0.5b-instruct-rift-dyn-selection-head"  # the last drafter or head trained (model_cards/)


def regenerate(readme: Path) -> None:
    """Rewrite the README's three result blocks from their records (paths relative to the repository root)."""
    text = readme.read_text()
    record = re.search(r"<!-- end-to-end:start -->\n<!-- record: (\S+) -->", text)
    if record is None:
        raise ValueError(f"{readme} has no end-to-end block naming its record.")
    write_into_readme(readme_block(Path(record.group(1))), readme, "end-to-end")
    lab_cli(
        ["table", REPLAY, "--wide", "--policies", REPLAY_POLICIES, "--readme", str(readme), "--block", "replay-regimes"]
    )
    result = json.loads((Path("model_cards") / TRAINED / "eval.json").read_text())
    write_into_readme(headline(result, TRAINED) + "\n", readme, "training-headline")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=Path, default=Path("README.md"))
    regenerate(parser.parse_args(argv).readme)


if __name__ == "__main__":
    main()
