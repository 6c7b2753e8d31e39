"""What several lab subcommands parse alike: argument types, policy labels and the arguments `compare` and `replay`
share (the parser class is `rift_hf.cli.parser.Parser`)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import rift_hf
from lab.compare import DEFAULT_POLICIES
from lab.records import Experiment, policy_config
from rift_hf.models import PRESETS as MODEL_PRESETS

PRESET_NAMES = ("tiny-random", *MODEL_PRESETS)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value}")
    return value


def number(low: float | None = None, high: float | None = None, low_open: bool = False):
    """An argparse type: a finite number in `[low, high]` (`(low, high]` with `low_open`), else a usage error (one
    line, exit status 2) before any work."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if low is not None and (value <= low if low_open else value < low):
            raise argparse.ArgumentTypeError(f"must be {'>' if low_open else '>='} {low:g}, got {value:g}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high:g}, got {value:g}")
        return value

    return parse


def compressions(parser, text: str) -> list[float]:
    """`--compressions 4,8` -> `[4.0, 8.0]`, each a finite number > 1, or a usage error."""
    try:
        values = [float(c) for c in text.split(",") if c.strip()]
    except ValueError:
        parser.error(f"--compressions takes numbers such as 4,8; got {text!r}")
    if not values or any(not math.isfinite(c) or c <= 1 for c in values):
        parser.error(f"--compressions must be finite numbers > 1 (4 keeps a quarter of the prompt); got {text!r}")
    return values


def sources(text: str) -> str | list[str]:
    """`--sources`: a source set name or a .jsonl path as given; anything else is a comma-separated list of sources."""
    from rift_hf.prompts import SOURCES

    if text.endswith(".jsonl"):
        if not Path(text).is_file():
            raise argparse.ArgumentTypeError(f"no prompt file {text}")
        return text
    if text in SOURCES or text in ("broad-tune", "broad-eval"):
        return text
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give a source set (code, prose), sources separated by commas, or a .jsonl")
    return names


def task_list(text: str) -> tuple[str, ...]:
    tasks = tuple(t.strip() for t in text.split(",") if t.strip())
    if not tasks:
        raise argparse.ArgumentTypeError("name at least one task, e.g. repeat,continue")
    return tasks


def checked_tasks(parser, args) -> tuple[str, ...] | None:
    """`--tasks`: any names for a prompt file of your own (its records' `task`), the built-in ones otherwise."""
    from rift_hf.prompts import TASKS

    own = str(args.sources).endswith(".jsonl") or str(args.sources).startswith("broad-")  # broad: families, cells
    if args.tasks is not None and not own:
        unknown = [t for t in args.tasks if t not in TASKS]
        if unknown:
            parser.error(f"--tasks: unknown {', '.join(unknown)}; choose from {', '.join(TASKS)}")
    return args.tasks


def split_labels(text: str) -> list[str]:
    """Comma-separated policy labels -> labels; a `key=value` piece belongs to the label before it:
    `full,rift-stat@kv_dtype=int4,kv_equal_bytes=true` -> `full` and `rift-stat@kv_dtype=int4,kv_equal_bytes=true`."""
    labels: list[str] = []
    for piece in filter(None, (p.strip() for p in text.split(","))):
        if "=" in piece and "@" not in piece and labels and "@" in labels[-1]:
            labels[-1] += "," + piece  # a further override of the previous label: rift-stat@kv_dtype=int4,rho=0.5
        else:
            labels.append(piece)
    return labels


def policy_labels(parser, text: str, baselines: tuple[str, ...] = ()) -> list[str]:
    """Comma-separated policy labels, checked, with `full` first (retention needs the full-cache reference);
    `baselines` are further labels the command accepts. A label's overrides are comma-separated too
    (`full,rift-stat@kv_dtype=int4,kv_equal_bytes=true`): a `key=value` piece belongs to the label before it."""
    policies = split_labels(text)
    unknown = [p for p in policies if p.partition("@")[0] not in rift_hf.POLICIES and p not in baselines]
    if unknown:
        parser.error(f"unknown policies {unknown}; choose from {', '.join((*rift_hf.POLICIES, *baselines))}")
    for label in policies:  # every label is a valid RiftConfig before any model loads
        if label in baselines:
            continue
        try:
            rift_hf.RiftConfig.from_dict(policy_config(label, 0.25, 64, 128, None))
        except (ValueError, TypeError) as err:
            parser.error(f"policy {label!r}: {err}")
    if "full" not in policies:
        policies.insert(0, "full")
    return policies


def add_run_arguments(parser, input_tokens: int, new_tokens: int, per_task: int) -> None:
    """The arguments `compare` and `replay` share: models, policies, prompts and the drafting protocol."""
    parser.add_argument("--preset", default="qwen-coder", choices=PRESET_NAMES, help="model preset (target, drafter)")
    parser.add_argument(
        "--policies",
        default=",".join(DEFAULT_POLICIES),
        help="comma-separated policy labels, e.g. rift-dyn@delta=16 (compare also takes `transformers`: its own "
        "assisted generation with a full DynamicCache drafter)",
    )
    parser.add_argument(
        "--input-tokens", type=positive_int, default=input_tokens, help="approximate source tokens per prompt"
    )
    parser.add_argument(
        "--new-tokens", type=positive_int, default=new_tokens, help="tokens generated per prompt (EOS held back)"
    )
    parser.add_argument("--per-task", type=positive_int, default=per_task, help="prompts per task")
    parser.add_argument(
        "--tasks",
        type=task_list,
        default=None,
        help="comma-separated: repeat, continue, summarize (default: repeat,continue; with a prompt file of your "
        "own, its tasks, all unless named here)",
    )
    parser.add_argument(
        "--sources",
        default="code",
        type=sources,
        help="code (stdlib source), code-long (stdlib modules of 8K+ tokens, for ~8K inputs), prose (Shakespeare, "
        "KJV), broad-tune or broad-eval (four families, both regimes; --per-task sources per family), comma-separated "
        "sources (module names, shakespeare:<play>, kjv:<book>), or a .jsonl file of your own "
        "prompts ({'prompt': ..., 'task': ...} per line; used whole, --per-task of each task)",
    )
    parser.add_argument("--gamma", type=positive_int, default=11, help="draft length (constant schedule)")
    parser.add_argument("--window", type=positive_int, default=64, help="SnapKV observation window")
    parser.add_argument("--delta", type=positive_int, default=128, help="rift-dyn rescoring interval (verified tokens)")


def experiment(parser, args, policies: list[str], name: str, **fields) -> Experiment:
    """The experiment the arguments of `add_run_arguments` describe (`fields`: further `Experiment` fields)."""
    return Experiment(
        args.preset,
        policies,
        args.input_tokens,
        args.new_tokens,
        args.per_task,
        tasks=checked_tasks(parser, args),
        sources=args.sources,
        gamma=args.gamma,
        window=args.window,
        delta=args.delta,
        name=name,
        **fields,
    )
