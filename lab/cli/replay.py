"""`python -m lab replay`: acceptance lengths by exact replay against cached target outputs
(`lab.replay_runs`)."""

from __future__ import annotations

from pathlib import Path

from lab.cli.arguments import add_run_arguments, compressions, experiment, policy_labels, positive_int
from lab.records import USER_RESULTS, USER_TARGETS
from lab.tables import markdown_table
from rift_hf.models import PRESETS as MODEL_PRESETS

# The extra this command needs, checked before any work: the AL metric (evaluate).
EXTRA = ("bench", ("evaluate", "matplotlib"))  # gguf only where a real preset is converted (models.py)

HELP = "acceptance lengths by exact replay against cached target outputs (the target runs once per prompt)"
DESCRIPTION = (
    "Replays assisted greedy decoding of each policy against the target's cached greedy output (rift_hf.replay): "
    "same AL as real assisted runs, without the target's cost. Resumable."
)


def add_arguments(parser) -> None:
    add_run_arguments(parser, input_tokens=4096, new_tokens=512, per_task=8)
    parser.add_argument("--compressions", default=None, help="comma-separated compressions (default: 4,8)")
    parser.add_argument(
        "--budget-tokens",
        type=positive_int,
        help="a budget of this many tokens for every prompt instead of compressions (E3; rows in <out>/<N>tok/)",
    )
    parser.add_argument("--dtype", default="float32", choices=["bfloat16", "float32"], help="drafter dtype in replay")
    parser.add_argument("--target-dtype", default="bfloat16", choices=["bfloat16", "float32"], help="target dtype")
    parser.add_argument(
        "--targets",
        type=Path,
        default=USER_TARGETS,
        help="target output cache (this repository's: benchmarks/results/targets)",
    )
    parser.add_argument("--experiment", default="E1", help="experiment name for summary.json")
    parser.add_argument(
        "--out", type=Path, help=f"results folder (default: {USER_RESULTS}/<experiment>/<preset>/replay-...)"
    )
    parser.add_argument(
        "--summary",
        type=Path,
        help="summary.json path (default: <out>/summary.json; none with --draft unless given)",
    )
    parser.add_argument(
        "--cached-only", action="store_true", help="leave out prompts whose target output is not cached yet"
    )
    parser.add_argument(
        "--prefills",
        type=Path,
        help="read the drafter's prompt forwards from prompt caches saved here (benchmarks.long_inputs prefill; "
        "default location ~/.cache/rift-hf/prefills) instead of computing them",
    )
    parser.add_argument(
        "--attention-mass",
        action="store_true",
        help="measurement mode (track_attention_mass for every policy): each row records the share of the full "
        "cache's attention mass on what the policy keeps, per decode position (E2's staleness)",
    )
    parser.add_argument(
        "--draft",
        type=Path,
        help="a drafter folder to replay instead of the preset's (e.g. a trained one, <train out>/model); it must "
        "share the preset's tokenizer, whose target outputs it is judged against",
    )


def _drafter(parser, args) -> tuple:
    """`--draft`: `(None, drafter, tokenizer)` for `replay_compare(models=...)`, checked against the preset."""
    if args.preset not in MODEL_PRESETS:
        parser.error("--draft replays against a real preset's target outputs (qwen-coder, gemma3-self)")
    if not (args.draft / "config.json").is_file():
        parser.error(f"--draft {args.draft} has no config.json: pass the folder save_pretrained wrote")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rift_hf.models import ensure_local

    tokenizer = AutoTokenizer.from_pretrained(ensure_local(MODEL_PRESETS[args.preset][0]))
    draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=getattr(torch, args.dtype))
    if draft.config.vocab_size < len(tokenizer):
        parser.error(f"--draft {args.draft} has a smaller vocabulary than the {args.preset} tokenizer")
    return None, draft.eval(), tokenizer


def run(parser, args) -> None:
    from lab.replay_runs import replay_compare

    policies = policy_labels(parser, args.policies)
    if args.budget_tokens is not None and args.compressions is not None:
        parser.error("--budget-tokens and --compressions both size the budget; pass one of them")
    sizes = compressions(parser, args.compressions or "4,8")
    name = f"replay-{args.input_tokens}in-{args.new_tokens}tok-{args.per_task}per-task"
    out = args.out or USER_RESULTS / args.experiment / args.preset / name
    models = None if args.draft is None else _drafter(parser, args)
    extra = {"track_attention_mass": True} if args.attention_mass else None
    results = replay_compare(
        experiment(parser, args, policies, args.experiment, extra=extra, budget_tokens=args.budget_tokens),
        sizes,
        out,
        dtype=args.dtype,
        target_dtype=args.target_dtype,
        targets_dir=args.targets,
        summary_path=args.summary or (None if models else out / "summary.json"),
        cached_only=args.cached_only,
        models=models,
        prefills=args.prefills,
    )
    for result in results:
        print(markdown_table(result))
