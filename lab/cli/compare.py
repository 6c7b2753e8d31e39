"""`python -m lab compare`: policies side by side on a model preset, by real generation (`lab.compare`)."""

from __future__ import annotations

from pathlib import Path

from lab.cli.arguments import add_run_arguments, experiment, number, policy_labels
from lab.compare import LINEARS, compare
from lab.records import TRANSFORMERS, USER_RESULTS, USER_TARGETS
from lab.tables import markdown_table
from rift_hf.models import DTYPES
from rift_hf.models import PRESETS as MODEL_PRESETS

# The extra this command needs, checked before any work: the AL metric (evaluate).
EXTRA = ("bench", ("evaluate", "matplotlib"))  # gguf only where a real preset is converted (models.py)

HELP = "policies side by side on a real model preset"


def add_arguments(parser) -> None:
    add_run_arguments(parser, input_tokens=1024, new_tokens=64, per_task=1)
    parser.add_argument(
        "--compression",
        type=number(1, low_open=True),
        default=4.0,
        help="prompt tokens per kept token (4 = budget 0.25)",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="dtype of both models; auto: bfloat16 on a GPU or a CPU with native bf16 (AVX512-BF16/AMX), else float32 "
        "(the records name the one used)",
    )
    parser.add_argument(
        "--linear",
        default="torch",
        choices=LINEARS,
        help="weight-major: compute small-batch linear layers as weight @ x.T on a CPU (rift_hf.speedups; faster for "
        "2-16 rows with MKL on the AMD CPU measured, see benchmarks/results/linear-cpu.md; --targets is not "
        "written then)",
    )
    parser.add_argument("--out", type=Path, default=USER_RESULTS / "compare", help="results folder")
    parser.add_argument(
        "--targets",
        type=Path,
        default=USER_TARGETS,
        help="where the target's own outputs are saved for `python -m lab replay` (real presets)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="read back the generations <out>/runs.jsonl already holds for this setting (a killed run continues; "
        "policies or prompts can be added)",
    )


def run(parser, args) -> None:
    policies = policy_labels(parser, args.policies, baselines=(TRANSFORMERS,))
    result = compare(
        experiment(parser, args, policies, name="main"),
        args.compression,
        args.out,
        args.dtype,
        resume=args.resume,
        # Replay's target outputs come from torch's own linear layers: none are saved with --linear weight-major.
        targets_dir=args.targets if args.preset in MODEL_PRESETS and args.linear == "torch" else None,
        linear=args.linear,
    )
    print(markdown_table(result))
