"""What a user times: the whole `generate()` call from token ids, against transformers as shipped.

    python -m benchmarks.end_to_end run --input-tokens 16384 --new-tokens 512 --per-task 4 --passes 2 --out DIR
    python -m benchmarks.end_to_end table DIR [--readme README.md --block end-to-end]
    python -m benchmarks.end_to_end where DIR... [--readme FILE --block where-it-pays]
    python -m benchmarks.end_to_end rounds DIR  (what a round costs per rift setting, at one draft length)

Per prompt and pass, every setting runs one whole `generate` call (both models' prompt forwards and decoding), timed
end to end; from the same run, hooks on the two models split off each model's prompt forward:

- `target`: `target.generate(ids)`, the target alone;
- `transformers`: `target.generate(ids, assistant_model=draft)` with the drafter as loaded (its own generation
  config: transformers' defaults, `num_assistant_tokens=20`, a constant schedule, `assistant_confidence_threshold=0.4`)
  on its own attention ("sdpa");
- `transformers+gqa`: the same with rift-hf's GQA verification fix on the target (`rift_hf.speedups.gqa_attention`);
- `default`: `cache_implementation="rift"` with no `cache_config`, what a user of rift-hf gets;
- `full`: rift with an uncompressed drafter cache, always drafting (`{"policy": "full", "step_aside": False}`): what
  the drafter's compression and the step-aside rule are measured against;
- anything else: `name@field=value,...` as a rift `cache_config` (e.g. `default@step_aside=false`).

Greedy, `min_new_tokens = max_new_tokens`, so every setting emits the same number of tokens. Settings take turns
(A B C, then C B A on the next pass) after one untimed warm-up call of each; rows are appended to `<out>/rows.jsonl` as
they finish (a run resumes where it stopped). Each row: `setting`, `pass`, `prompt`, `task`, `input_tokens`,
`new_tokens`, `end_to_end_seconds`, `decode_seconds` (the call less both prompt forwards), `prompt_forward_seconds`
(per model: the target's first forward, which in assisted generation also verifies the first drafts; the drafter's
forwards of more than one token before its first one-token step: its prompt pass, in chunks or whole),
`same_as_target` (the tokens equal the target alone's in the same pass), and for rift `stepped_aside`, AL, rounds and
each round's drafts, acceptance and seconds on either side (`round_seconds`).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

import rift_hf
from lab.cli import split_labels
from lab.cli.arguments import sources
from lab.records import machine
from rift_hf._compat import CACHE
from rift_hf.models import PRESETS, load_preset
from rift_hf.policies import label_fields
from rift_hf.prompts import prompt_set

SETTINGS = ("target", "transformers", "transformers+gqa", "default", "full")
SHIPPED = ("target", "transformers", "transformers+gqa")  # no rift: nothing to step aside
DRAFTING = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


class PhaseTimer:
    """Every forward of a model during a call, as `(tokens fed, seconds, with a cache)`."""

    def __init__(self, model):
        self.forwards: list[tuple[int, float, bool]] = []
        self._start: list[float] = []

        def before(_module, args, kwargs):
            self._start.append(time.perf_counter())

        def after(_module, args, kwargs, _output):
            ids = kwargs.get("input_ids", args[0] if args else None)
            tokens = 0 if ids is None else ids.shape[-1]
            cached = kwargs.get(CACHE) is not None  # the cache keyword of this transformers version
            self.forwards.append((tokens, time.perf_counter() - self._start.pop(), cached))

        self.handles = (
            model.register_forward_pre_hook(before, with_kwargs=True),
            model.register_forward_hook(after, with_kwargs=True),
        )

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def target_prompt(self) -> float:
        return self.forwards[0][1] if self.forwards else 0.0

    def draft_prompt(self) -> float:
        """The drafter's forwards over several tokens with a cache, before its first one-token step with one."""
        total = 0.0
        for tokens, seconds, cached in self.forwards:
            if not cached:
                continue  # the step-aside rule's timing of the drafter's weights: decode-phase work
            if tokens == 1:
                break
            total += seconds
        return total


def _config(setting: str) -> dict | None:
    """A rift setting's `cache_config` (None: the default)."""
    fields = {k: v for k, v in label_fields(setting).items() if k != "policy"}
    name = setting.partition("@")[0]
    if name == "full":
        fields.update(policy="full", step_aside=fields.get("step_aside", False))
    elif name != "default":
        fields["policy"] = name
    return fields or None


def call(setting: str, target, draft, ids: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, dict]:
    """One whole `generate` call of `setting`, timed; returns its output and the row fields it measured."""
    from rift_hf.speedups import gqa_attention

    gen = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}
    timers = PhaseTimer(target), PhaseTimer(draft)
    row = {}
    try:
        tick = time.perf_counter()
        if setting == "target":
            out = target.generate(ids, **gen)
        elif setting.startswith("transformers"):
            if draft.config._attn_implementation != "sdpa":
                draft.set_attn_implementation("sdpa")  # as loaded (rift switches it to its own backend)
            gqa_attention(target, setting == "transformers+gqa")
            try:
                out = target.generate(ids, assistant_model=draft, **gen)
            finally:
                gqa_attention(target, False)
        else:
            config = _config(setting)
            out = target.generate(ids, assistant_model=draft, cache_implementation="rift", cache_config=config, **gen)
        seconds = time.perf_counter() - tick
    finally:
        for timer in timers:
            timer.remove()
    prompt = {"target": timers[0].target_prompt(), "draft": timers[1].draft_prompt()}
    row.update(
        end_to_end_seconds=seconds,
        prompt_forward_seconds=prompt,
        decode_seconds=seconds - prompt["target"] - prompt["draft"],
        target_forwards=len(timers[0].forwards),
    )
    if setting.startswith("transformers"):
        row["al"] = new_tokens / max(1, len(timers[0].forwards))
    elif setting != "target":
        stats = rift_hf.last_stats(target)
        row.update(
            al=stats.acceptance_length if stats.drafted else None,
            rounds=len(stats.rounds),
            drafted=stats.drafted,
            stepped_aside=stats.stepped_aside,
            payoff=stats.payoff,
            policy=stats.policy,
            peak_bytes=stats.peak_bytes,
            prompt_chunks=stats.prompt_chunks,
            # each round: drafts, accepted, the drafter's seconds (its forwards and commits, refreshes included), the
            # target's seconds (verification, and what happens between: a guide's `finish`)
            round_seconds=[
                [r["drafted"], r["accepted"], r["draft_seconds"], r.get("verify_seconds")] for r in stats.rounds
            ],
            refresh_seconds=sum(event["seconds"] for event in stats.rescorings),
        )
    return out, row


def run(args) -> None:
    target, draft, tokenizer = load_preset(args.preset, dtype=args.dtype)
    shipped = {name: getattr(draft.generation_config, name) for name in DRAFTING}
    prompts = prompt_set(tokenizer, args.input_tokens, args.per_task, tasks=args.tasks, sources=args.sources)
    rank = {p.name: sum(q.task == p.task for q in prompts[:i]) for i, p in enumerate(prompts)}
    prompts = sorted(prompts, key=lambda p: rank[p.name])  # regimes interleaved: a partial run covers both
    rows_path = args.out / "rows.jsonl"
    rows_path.parent.mkdir(parents=True, exist_ok=True)
    earlier = [json.loads(line) for line in rows_path.read_text().splitlines()] if rows_path.exists() else []
    done = {(r["prompt"], r["setting"], r["pass"]) for r in earlier}
    alone = {r["prompt"]: r["new_ids"] for r in earlier if r["setting"] == "target"}  # greedy: every pass alike
    order = [(i, args.settings if i % 2 == 0 else args.settings[::-1]) for i in range(args.passes)]
    todo = [(p, s, i) for p in prompts for i, these in order for s in these if (p.name, s, i) not in done]
    if not todo:
        return
    warm = prompts[0].input_ids[:, :128]  # a short head of the first prompt: any source, any task
    for setting in tqdm(args.settings, desc="warm-up"):
        call(setting, target, draft, warm, 4)
    for prompt, setting, run_pass in tqdm(todo, desc="whole calls"):
        gc.collect()
        out, measured = call(setting, target, draft, prompt.input_ids, args.new_tokens)
        new = out[0, prompt.tokens :].tolist()
        if setting == "target":
            alone[prompt.name] = new
        expected = alone.get(prompt.name)
        row = {
            "setting": setting,
            "pass": run_pass,
            "prompt": prompt.name,
            "task": prompt.task,
            "input_tokens": prompt.tokens,
            "new_tokens": len(new),
            **measured,
            "same_as_target": None if expected is None else new == expected,
            "new_ids": new,
            "drafter_generation_config": shipped,
            "attention": {"target": target.config._attn_implementation, "draft": "sdpa"},
            "dtype": str(target.dtype).removeprefix("torch."),
            "machine": machine(),
            "threads": torch.get_num_threads(),
            "rift_hf": rift_hf.__version__,
            "date": datetime.date.today().isoformat(),
        }
        with rows_path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")


def read_rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(folder) / "rows.jsonl").read_text().splitlines()]


def _spread(values: list[float], fmt: str = "{:.2f}") -> str:
    if not values:
        return "-"
    mean = fmt.format(statistics.mean(values))
    return mean if len(values) == 1 else f"{mean} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def summary(rows: list[dict]) -> dict:
    """Per setting: speed-ups over the target alone and over transformers as shipped, end to end and in the decode
    phase, per prompt (mean over passes) and per pass (each pass's ratio), with each prompt's range over passes."""
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    by = {(r["prompt"], r["setting"], r["pass"]): r for r in rows}
    prompts = list(dict.fromkeys(r["prompt"] for r in rows))
    passes = sorted({r["pass"] for r in rows})
    out = {}
    for setting in settings:
        cell = {}
        for over in ("target", "transformers"):
            for key in ("end_to_end_seconds", "decode_seconds"):
                ratios, ranges = [], []
                for prompt in prompts:
                    pairs = [(by.get((prompt, over, i)), by.get((prompt, setting, i))) for i in passes]
                    # speed-up: the baseline's seconds over the setting's, pass by pass
                    each = [base[key] / mine[key] for base, mine in pairs if base and mine and mine[key] > 0]
                    if each:
                        ratios.append(statistics.mean(each))
                        ranges.append((min(each), max(each)))
                cell[f"{key}/{over}"] = {"per_prompt": ratios, "ranges": ranges}
        mine = [r for r in rows if r["setting"] == setting]
        cell["same_as_target"] = [r["same_as_target"] for r in mine]
        cell["stepped_aside"] = sum(bool(r.get("stepped_aside")) for r in mine)
        cell["runs"] = len(mine)
        out[setting] = cell
    return out


def _regime(row: dict) -> str:
    """A row's regime: its task, or the part after the family (`python/consult`: `consult`) for the broad set."""
    return row["task"].rpartition("/")[2]


def table(rows: list[dict]) -> str:
    """The end-to-end table of a run's rows, one line per setting and regime (they fail in different places): the mean
    over the regime's prompts of each prompt's mean over passes, with the lowest and highest single pass."""
    from lab.tables import pipe_table

    first = rows[0]
    regimes = list(dict.fromkeys(_regime(r) for r in rows))
    lengths = sorted({r["input_tokens"] for r in rows})
    body = []
    for regime in regimes:
        mine = [r for r in rows if _regime(r) == regime]
        for setting, cell in summary(mine).items():

            def fmt(key, cell=cell):
                values = cell[key]["per_prompt"]
                if not values:
                    return "-"
                low = min(lo for lo, _ in cell[key]["ranges"])
                high = max(hi for _, hi in cell[key]["ranges"])
                return f"{statistics.mean(values):.2f} ({low:.2f}-{high:.2f})"

            known = [s for s in cell["same_as_target"] if s is not None]
            drafter = [r["prompt_forward_seconds"]["draft"] for r in mine if r["setting"] == setting]
            body.append(
                [
                    setting,
                    f"{regime} ({len({r['prompt'] for r in mine})})",
                    _spread([r["end_to_end_seconds"] for r in mine if r["setting"] == setting], "{:.0f}"),
                    fmt("end_to_end_seconds/target"),
                    fmt("end_to_end_seconds/transformers"),
                    fmt("decode_seconds/transformers"),
                    _spread(drafter, "{:.0f}") if any(drafter) else "-",
                    f"{cell['stepped_aside']}/{cell['runs']}" if setting not in SHIPPED else "-",
                    f"{sum(known)}/{len(known)}",
                ]
            )
    head = (
        f"{len({r['prompt'] for r in rows})} prompts, {lengths[0]}-{lengths[-1]} input tokens, "
        f"{first['new_tokens']} new tokens, {first['dtype']}, {first['machine']}, "
        f"{', '.join(sorted({r['date'] for r in rows}))}; {len({r['pass'] for r in rows})} interleaved passes. "
        "Whole `generate()` calls (`call s`: seconds); `vs`: end-to-end speed-up, the baseline's seconds over the "
        "setting's, per pass, averaged over passes then prompts; in brackets the lowest and highest single pass; "
        "`decode`: the call less both prompt forwards. Target prompt forward "
        f"{_spread([r['prompt_forward_seconds']['target'] for r in rows if r['setting'] == 'target'], '{:.0f}')} s.\n\n"
    )
    headers = [
        "setting", "prompts", "call s", "vs target", "vs transformers", "decode vs transformers", "drafter prompt s",
        "stepped aside", "= target alone",
    ]  # fmt: skip
    return head + pipe_table(headers, body) + "\n"


def _at_length(rounds: list[list], column: int, k: float) -> float:
    """Seconds in `column` of `rounds` (`round_seconds` items) for a round drafting `k` tokens: a least-squares line
    over the drafts of each round (the mean where every round drafted alike)."""
    import numpy

    drafted = numpy.array([r[0] for r in rounds], dtype=float)
    seconds = numpy.array([r[column] for r in rounds], dtype=float)
    if len(set(drafted.tolist())) < 2:
        return float(seconds.mean())
    slope, intercept = numpy.polyfit(drafted, seconds, 1)
    return float(intercept + slope * k)


def round_costs(rows: list[dict]) -> str:
    """
    What a round costs per rift setting, at one draft length for all: the drafter's seconds (forwards, commits,
    refreshes) and the target's (verification, and what runs before the next round drafts) of every round that drafted
    after a call's first (whose target side holds the prompt forward), each a line over the round's drafts, read at
    the median draft of every setting's rounds; per pass, then the lowest and highest pass. `vs first`: the round's
    seconds over the first setting's in the same pass.
    """
    from lab.tables import pipe_table

    rift = [r for r in rows if r.get("round_seconds")]
    settings = list(dict.fromkeys(r["setting"] for r in rift))
    passes = sorted({r["pass"] for r in rift})
    rounds = {(s, i): [] for s in settings for i in passes}
    for r in rift:
        rounds[r["setting"], r["pass"]] += [x for x in r["round_seconds"][1:] if x[0] and x[3]]
    if not any(rounds.values()):
        return "No round drafted after a call's first.\n"
    k = statistics.median(x[0] for these in rounds.values() for x in these)
    cost = {key: (_at_length(v, 2, k), _at_length(v, 3, k)) for key, v in rounds.items() if v}
    settings = [s for s in settings if any((s, i) in cost for i in passes)]
    body = []
    for setting in settings:
        mine = [cost[setting, i] for i in passes if (setting, i) in cost]
        both = [i for i in passes if (setting, i) in cost and (settings[0], i) in cost]
        ratio = [sum(cost[setting, i]) / sum(cost[settings[0], i]) for i in both]
        n = sum(len(rounds[setting, i]) for i in passes)
        refresh = sum(r["refresh_seconds"] for r in rift if r["setting"] == setting)
        body.append(
            [
                setting,
                str(n),
                _spread([1e3 * d for d, _ in mine], "{:.0f}"),
                _spread([1e3 * v for _, v in mine], "{:.0f}"),
                _spread([1e3 * (d + v) for d, v in mine], "{:.0f}"),
                _spread(ratio, "{:.3f}"),
                f"{1e3 * refresh / max(1, sum(len(r['round_seconds']) for r in rift if r['setting'] == setting)):.1f}",
            ]
        )
    head = (
        f"Rounds at {k:g} drafts ({len({r['prompt'] for r in rift})} prompts, {rift[0]['input_tokens']} input tokens, "
        f"{rift[0]['dtype']}, {rift[0]['machine']}, {len(passes)} interleaved passes; mean over passes, in brackets "
        "the lowest and highest pass).\n\n"
    )
    headers = ["setting", "rounds", "drafter ms", "target ms", "round ms", "vs first", "refresh ms / round"]
    return head + pipe_table(headers, body) + "\n"


def phases(rows: list[dict]) -> dict:
    """Per (input length to the nearest thousand, regime, setting): mean seconds of the target's prompt forward, the
    drafter's prompt pass and the rest of the call per new token, over a run's prompts and passes."""
    out = {}
    for length in sorted({round(r["input_tokens"], -3) for r in rows}):  # prompts of one run: within a few tokens
        for regime in dict.fromkeys(_regime(r) for r in rows):
            for setting in dict.fromkeys(r["setting"] for r in rows):
                mine = [
                    r
                    for r in rows
                    if r["setting"] == setting and _regime(r) == regime and round(r["input_tokens"], -3) == length
                ]
                if mine:
                    out[length, regime, setting] = {
                        "target_prompt": statistics.mean(r["prompt_forward_seconds"]["target"] for r in mine),
                        "draft_prompt": statistics.mean(r["prompt_forward_seconds"]["draft"] for r in mine),
                        "per_token": statistics.mean(r["decode_seconds"] / r["new_tokens"] for r in mine),
                        "new_tokens": mine[0]["new_tokens"],
                        "runs": len(mine),
                        "stepped_aside": sum(bool(r.get("stepped_aside")) for r in mine),
                    }
    return out


def where_it_pays(folders: list[Path], new_tokens=(128, 512, 2048)) -> str:
    """
    End-to-end speed-up over the target alone by input length, regime and new tokens, from whole-call runs: a cell at
    the run's own output length is measured (the mean seconds over its prompts and passes, against the target's);
    the others are computed from the measured phases (prompt forwards as measured, decoding at the measured seconds
    per token) and marked `~`. Break-even: the output length at which a setting's whole call costs the target
    alone's (its drafter pass repaid by its faster decoding), `never` where it decodes no faster.
    """
    from lab.tables import pipe_table

    rows = [r for folder in folders for r in read_rows(folder)]
    measured = phases(rows)
    settings = [s for s in dict.fromkeys(s for *_, s in measured) if s != "target"]
    body = []
    for length, regime in dict.fromkeys((length, regime) for length, regime, _ in measured):
        base = measured.get((length, regime, "target"))
        if base is None:
            continue
        for setting in settings:
            cell = measured.get((length, regime, setting))
            if cell is None:
                continue

            def seconds(phase, n):
                return phase["target_prompt"] + phase["draft_prompt"] + phase["per_token"] * n

            ratios = []
            for n in new_tokens:
                ratio = seconds(base, n) / seconds(cell, n)
                exact = n == cell["new_tokens"] == base["new_tokens"]
                # a run that stepped aside says nothing of another output length: the rule decides per call
                ratios.append(f"{ratio:.2f}x" if exact else "-" if cell["stepped_aside"] else f"~{ratio:.2f}x")
            saved = base["per_token"] - cell["per_token"]
            extra = cell["target_prompt"] + cell["draft_prompt"] - base["target_prompt"]
            even = "0" if extra <= 0 else f"{extra / saved:.0f}" if saved > 0 else "never"
            if cell["stepped_aside"]:
                even = f"- (stepped aside in {cell['stepped_aside']}/{cell['runs']})"
            body.append([f"~{length / 1000:g}K", regime, setting, *ratios, even])
    headers = ["input", "regime", "setting", *[f"{n} new tokens" for n in new_tokens], "break-even new tokens"]
    first = rows[0]
    head = (
        f"End to end over the target alone, {', '.join(sorted({r['dtype'] for r in rows}))}, {first['machine']}, "
        f"{', '.join(sorted({r['date'] for r in rows}))}; measured at {sorted({r['new_tokens'] for r in rows})} new "
        "tokens, `~`: computed from the measured phases (prompt forwards, then decoding at the measured seconds per "
        "token). Where the step-aside rule let the target decode alone in some run, only the measured length is "
        "shown: the rule decides per call, from the output length asked for.\n\n"
    )
    return head + pipe_table(headers, body) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run", help="time whole generate() calls (resumes <out>/rows.jsonl)")
    go.add_argument("--preset", default="qwen-coder", choices=["tiny-random", *sorted(PRESETS)])
    go.add_argument("--input-tokens", type=int, required=True)
    go.add_argument("--new-tokens", type=int, default=512)
    go.add_argument("--per-task", type=int, default=4)
    go.add_argument("--tasks", type=lambda t: tuple(t.split(",")), default=None)
    go.add_argument("--sources", default="repo", type=sources)
    go.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    go.add_argument("--settings", type=split_labels, default=list(SETTINGS))
    go.add_argument("--passes", type=int, default=2)
    go.add_argument("--out", type=Path, required=True)
    show = sub.add_parser("table", help="the table of a run's rows (written to <folder>/table.md)")
    show.add_argument("folder", type=Path)
    show.add_argument("--readme", type=Path, help="write the table into this file's block (--block)")
    show.add_argument("--block", default="end-to-end")
    cost = sub.add_parser("rounds", help="what a round costs per rift setting, at one draft length")
    cost.add_argument("folder", type=Path)
    pays = sub.add_parser("where", help="speed-up by input length and new tokens, with break-even output lengths")
    pays.add_argument("folders", type=Path, nargs="+")
    pays.add_argument("--out", type=Path, help="also write the table here")
    pays.add_argument("--readme", type=Path, help="write the table into this file's block (--block)")
    pays.add_argument("--block", default="where-it-pays")
    args = parser.parse_args(argv)
    if args.command == "where":
        text = where_it_pays(args.folders)
        if args.out:
            args.out.write_text(text)
        if args.readme:
            from lab.tables import write_into_readme

            records = "".join(f"<!-- record: {Path(f).as_posix()} -->\n" for f in args.folders)
            write_into_readme(records + text, args.readme, args.block)
        print(text)
        return
    if args.command == "rounds":
        text = round_costs(read_rows(args.folder))
        (args.folder / "rounds.md").write_text(text)
        print(text)
        return
    if args.command == "run":
        if args.passes < 1:
            parser.error(f"--passes must be >= 1, got {args.passes}.")
        if args.tasks is None and not str(args.sources).startswith("broad-"):
            args.tasks = ("repeat", "continue")
        run(args)
        return
    text = table(read_rows(args.folder))
    (args.folder / "table.md").write_text(text)
    print(text)
    if args.readme:
        from lab.tables import write_into_readme

        write_into_readme(readme_block(args.folder), args.readme, args.block)


def readme_block(folder: Path) -> str:
    """What a README's speed block holds: the record's folder (so a test can regenerate it) and its table."""
    return f"<!-- record: {Path(folder).as_posix()} -->\n" + table(read_rows(folder))


if __name__ == "__main__":
    main()
