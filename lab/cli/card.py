"""`python -m lab card`: (re)write the model card of a trained drafter from its `eval.json`; `write_cards` is also how
`train` and `train-head` publish theirs."""

from __future__ import annotations

import json
import os
from pathlib import Path

from lab.tables import write_into_readme
from rift_hf.models import PRESETS

HELP = "(re)write the model card of a trained drafter from its eval.json"
TRAINED = Path.home() / ".cache" / "rift-hf" / "trained" / "qwen-coder-rift"


def add_arguments(parser) -> None:
    parser.add_argument("--preset", default="qwen-coder", choices=sorted(PRESETS), help="model preset")
    parser.add_argument("--out", type=Path, default=TRAINED, help="the training output folder (holds eval.json)")
    parser.add_argument("--card-dir", type=Path, default=Path("model_cards"), help="where the model card is written")
    parser.add_argument("--repo-id", help="the Hub repository (namespace/name) the card's usage snippet loads from")


def run(parser, args) -> None:
    if not (args.out / "eval.json").is_file():
        parser.error(f"{args.out} has no eval.json: run `python -m lab train --out {args.out}` first")
    write_cards(args.preset, args.out, args.card_dir, args.repo_id)


def write_cards(preset: str, out: Path, card_dir: Path, repo_id: str | None = None) -> None:
    """The card into the Hub-ready folder (`out/model`) and into the repo's `model_cards/<name>/`; then every card's
    results into docs/training.md and this one's headline into the README, where they have a block."""
    from rift_hf.training.card import write_card

    target_spec, draft_spec = PRESETS[preset]
    result = json.loads((out / "eval.json").read_text())
    name = f"{draft_spec.name}-{result.get('policy', 'rift')}-{'' if result.get('teacher_top_k') else 'self-'}distilled"
    if result.get("kind") == "selection-head":
        name = f"{draft_spec.name}-{result['policy']}-selection-head"
    elif result.get("alignment_weight"):
        name += "-aligned"
    write_card(
        out / "eval.json",
        [out / "model", card_dir / name],
        name,
        target_spec.upstream,
        draft_spec.license,
        draft_spec.upstream,
        repo_id,
    )
    print(f"wrote {out / 'model' / 'README.md'} and {card_dir / name / 'README.md'}")
    page = Path("docs/training.md")
    if page.exists() and "<!-- training:start -->" in page.read_text():
        blocks = []
        for path in sorted(card_dir.glob("*/README.md")):  # every trained drafter's card, not only this one
            results = path.read_text().split("## Results", 1)[1].split("## Training", 1)[0].strip()
            link = os.path.relpath(path, page.parent)
            blocks.append(f"From [`{path.parent.as_posix()}`]({Path(link).as_posix()}):\n\n{results}\n")
        write_into_readme("\n".join(blocks), page, "training")
    readme = Path("README.md")
    if readme.exists() and "<!-- training-headline:start -->" in readme.read_text():
        from rift_hf.training.card import headline

        write_into_readme(headline(result, name) + "\n", readme, "training-headline")
