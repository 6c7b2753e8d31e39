import json

import pytest

from benchmarks import kernels as kernel_bench
from lab.records import read_compare
from tiny import squeeze


def test_kernel_benchmark_dry_run(tmp_path):
    kernel_bench.main(["--dry-run", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "kernels-dry-run.json").read_text())
    assert result["dry_run"] and result["window_scores"] and result["indexed_attention"]
    share = result["rescore_share"]["share"]
    assert set(share) == {"16", "32", "64", "128", "256", "512", "1024"}
    assert share["16"] > share["1024"] > 0
    steps = result["drafter_step"]
    assert [row["T"] for row in steps] == [64, 128]
    assert all(row[f"{name}_ms"] > 0 for row in steps for name in ("full", "rift-stat", "rift-dyn"))
    table = (tmp_path / "kernels-dry-run.md").read_text()
    assert "| 128 | 32 |" in squeeze(table) and "Rescoring (all layers) at T = 96" in table


def test_kernel_table_goes_into_the_readme_block(tmp_path):
    result = tmp_path / "kernels-x.json"
    row = {"T": 8, "budget": 4, "full_ms": 2.0, "rift-stat_ms": 1.0, "rift-dyn_ms": 1.5}
    result.write_text(json.dumps({"device": "X", "dtype": "bfloat16", "date": "2026-01-01", "drafter_step": [row]}))
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- kernels:start -->\nold\n<!-- kernels:end -->\nb\n")
    kernel_bench.main(["--table", str(result), "--readme", str(readme)])
    text = readme.read_text()
    assert (
        "old" not in text
        and "| 8 | 4 | 2.0 | 1.0 | 1.5 |" in squeeze(text)
        and "Measured on X, bfloat16, 2026-01-01" in text
    )


def test_al_gain_compares_rounds_around_a_rescoring():
    from benchmarks.experiments import al_gain

    run = {"input_tokens": 100, "accepted": [0, 0, 3, 3, 3]}  # rounds end at 101, 102, 106, 110, 114
    assert al_gain(run, position=102, rounds=2) == 4.0 - 1.0
    assert al_gain(run, position=100) is None


def test_experiment_e5_calibrates_and_runs_ada_on_the_tiny_preset(tmp_path):
    from benchmarks import experiments

    experiments.main(["E5", "--preset", "tiny-random", "--scale", "tiny", "--out", str(tmp_path)])
    records = json.loads((tmp_path / "summary.json").read_text())
    assert {r["policy"] for r in records if r["experiment"] == "E5"} >= {"full", "rift-dyn", "rift-ada"}
    assert set(json.loads((tmp_path / "E5" / "tiny-random" / "thresholds.json").read_text())) == {
        "al_threshold",
        "entropy_threshold",
        "drift_threshold",
    }
    calibration = json.loads((tmp_path / "E5" / "tiny-random" / "calibration" / "compare.json").read_text())
    events = experiments.calibration_events(calibration)
    assert events and all(e["drift"] is not None for e in events), "rift-dyn must log query drift for calibration"

    from lab.plots import plot_summary
    from lab.records import rebuild_summary
    from lab.tables import summary_table

    (tmp_path / "summary.json").unlink()
    rebuilt = rebuild_summary(tmp_path / "summary.json")  # from the compare.json files alone
    assert len(rebuilt) == len(records) and {r["policy"] for r in rebuilt} == {r["policy"] for r in records}
    dyn16 = next(r for r in rebuilt if r["policy"] == "rift-dyn@delta=16")
    assert dyn16["rescorings"] >= 1 and dyn16["peak_store_mib"] > 0
    assert "| rift-ada |" in squeeze(summary_table(rebuilt, ["E5"]))
    assert plot_summary(rebuilt, tmp_path / "overview.png").stat().st_size > 10_000


def test_experiments_by_replay_write_replay_records(tmp_path):
    from benchmarks import experiments

    argv = ["--preset", "tiny-random", "--scale", "tiny", "--method", "replay", "--out", str(tmp_path)]
    experiments.main(["E5", "E1", "--policies", "full,rift-stat", "--compressions", "4", *argv])
    records = json.loads((tmp_path / "summary.json").read_text())
    assert {r["method"] for r in records} == {"replay"}
    assert {r["experiment"] for r in records} == {"E1", "E5"}
    assert {r["policy"] for r in records if r["experiment"] == "E5"} >= {"full", "rift-dyn@delta=16", "rift-dyn"}
    assert any(r["policy"].startswith("rift-ada") for r in records)
    folder = tmp_path / "E5" / "tiny-random"
    assert (folder / "thresholds-replay-96in-24tok-1per-task.json").is_file()
    calibration = read_compare(folder / "replay-calibration-96in-24tok-1per-task" / "4x" / "compare.json")
    assert calibration["method"] == "replay" and calibration["tasks"] == ["continue"]
    assert experiments.calibration_events(calibration), "rift-dyn's rescorings feed the calibration"
    assert (tmp_path / "E1" / "tiny-random" / "replay-96in-24tok-1per-task" / "4x" / "rows.jsonl").is_file()
    assert list((tmp_path / "targets").rglob("*.json")), "the target outputs are kept for the next replay"
    # E3 by replay: one folder per input length, the same budget in tokens in each.
    experiments.main(["E3", *argv])
    e3 = sorted((tmp_path / "E3" / "tiny-random").glob("replay-fixed-budget-*/12tok/compare.json"))
    results = [read_compare(path) for path in e3]
    assert sorted(r["input_tokens"] for r in results) == [24, 48, 96, 192]
    assert all(r["budget_tokens"] == 12 and r["compression"] is None and r["new_tokens"] == 12 for r in results)
    assert all(run["budget"] == 12 for r in results for run in r["runs"] if run["policy"] != "full")
    # beyond the scale's length (192 > 96) the prompts come from the long modules, as E1's at ~8K
    assert [r["sources"] for r in sorted(results, key=lambda r: r["input_tokens"])] == ["code"] * 3 + ["code-long"]


def test_lossless_fp32_check_runs_and_every_policy_matches_greedy(tmp_path):
    from benchmarks import lossless_fp32

    out = tmp_path / "lossless.json"
    argv = ["--preset", "tiny-random", "--input-tokens", "96", "--new-tokens", "12", "--budget", "24"]
    result = lossless_fp32.main(
        [*argv, "--window", "8", "--delta", "4", "--policies", "full,snapkv,rift-dyn", "--out", str(out)]
    )
    assert set(result["runs"]) == {"full", "snapkv", "rift-dyn"}
    assert all(run["same_as_greedy"] for run in result["runs"].values())
    assert json.loads(out.read_text())["dtype"] == "float32"


def test_experiment_policy_subset_is_checked_before_models_load(monkeypatch):
    import pytest

    from benchmarks import experiments

    monkeypatch.setattr("rift_hf.models.load_preset", lambda *a, **k: pytest.fail("loaded models first"))
    with pytest.raises(ValueError, match="unknown policy 'snap'"):
        experiments.main(["E1", "--preset", "tiny-random", "--policies", "full,snap"])


def test_step_benchmark_dry_run_records_every_part_with_its_interleaved_ratio(tmp_path):
    from benchmarks import step

    out = tmp_path / "step.json"
    step.main(["--dry-run", "--out", str(out)])
    records = json.loads(out.read_text())["records"]
    modes = {(r["mode"], r["policy"]) for r in records}
    assert ("plain", "full") in modes and ("assisted", "transformers") in modes
    assert {("plain", p) for p in ("swa", "snapkv", "rift-stat", "rift-dyn", "rift-ada")} <= modes
    assert {("target-step", "target"), ("target-verify", "target")} <= modes
    for record in records:
        assert record["ms_per_step"] > 0
        if record["policy"] not in ("full", "target") or record["mode"] == "assisted":
            assert record["ratio_to_baseline"] > 0
    assert any(r["rescorings"] for r in records if r["policy"] == "rift-dyn" and r["mode"] == "plain")
    step.main(["--dry-run", "--out", str(out)])  # resumes: nothing left to measure
    assert len(json.loads(out.read_text())["records"]) == len(records)
    other = tmp_path / "bf16.json"
    other.write_text(json.dumps({**json.loads(out.read_text()), "dtype": "bfloat16"}))
    with pytest.raises(SystemExit, match="holds bfloat16 records and this run is float32"):
        step.main(["--dry-run", "--out", str(other)])  # records of another dtype are not mixed in
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- step-cpu:start -->\n<!-- step-cpu:end -->\nb\n")
    step.main(["--table", str(out), "--readme", str(readme)])
    assert "| rift-dyn |" in squeeze(readme.read_text()) and "x full step at 1K" in readme.read_text()


def test_step_table_divides_by_transformers_loop_at_the_baseline_context_when_measured():
    from benchmarks import step

    def assisted(policy, length, ratio):
        return {"policy": policy, "input_tokens": length, "budget": 256, "mode": "assisted", "ms_per_step": 10.0,
                "ratio_to_baseline": ratio, "baseline_context": 1024, "loop_share": 0.01, "drafted": 40}  # fmt: skip

    head = {"weights": "random", "dtype": "float32", "device": "cpu", "machine": "x", "threads": 1, "date": "d",
            "window": 8, "delta": 4}  # fmt: skip
    records = [assisted("rift-stat", 4096, 1.155), assisted("transformers", 4096, 1.4)]
    assert "transformers' loop" not in step.markdown({**head, "records": records})  # not at the baseline's context
    table = squeeze(step.markdown({**head, "records": [*records, assisted("transformers", 1024, 1.1)]}))
    assert "x transformers' loop at 1024" in table
    assert "| rift-stat | 4096 | 256 | 10.0 | 1.155 | 1.050 | 1.0% | 40 |" in table


def test_step_benchmark_times_a_stacked_refresh_against_one_per_layer(tmp_path):
    from benchmarks import step

    out = tmp_path / "step.json"
    step.main(["--dry-run", "--parts", "refresh", "--policies", "rift-dyn,page-round", "--out", str(out)])
    records = json.loads(out.read_text())["records"]
    assert [(r["mode"], r["policy"]) for r in records] == [("refresh", "page-round")]  # rift-dyn does not stack
    record = records[0]
    assert record["ms_per_step"] > 0 and record["per_layer_ms"] > 0 and min(record["refreshes"]) > 0
    assert "| page-round | 128 | 48 | 2 |" in squeeze(step.markdown(json.loads(out.read_text())))


def test_step_benchmark_times_compiled_steps_against_eager_ones(tmp_path):
    from benchmarks import step

    out = tmp_path / "step.json"
    step.main(["--dry-run", "--parts", "compiled", "--compiled-policies", "page-round", "--out", str(out)])
    (record,) = json.loads(out.read_text())["records"]
    assert (record["mode"], record["policy"], record["budget"]) == ("compiled", "page-round", 48)
    assert record["same_tokens"] and record["compiled_steps"] == record["steps"] + 3 and record["eager_fallbacks"] == 0
    assert record["compiled_over_eager"] > 0 and record["eager_ms_per_step"] > 0
    assert "| page-round | 128 | 48 |" in squeeze(step.markdown(json.loads(out.read_text())))


def test_step_benchmark_weight_major_linear_is_recorded_and_not_mixed_with_torchs(tmp_path):
    from benchmarks import step

    out = tmp_path / "step.json"
    args = ["--dry-run", "--parts", "plain", "--policies", "rift-stat", "--out", str(out)]
    step.main([*args, "--linear", "weight-major"])
    result = json.loads(out.read_text())
    assert result["linear"] == "weight-major" and result["records"]
    with pytest.raises(SystemExit, match="holds records with weight-major linear layers and this run uses torch"):
        step.main(args)


def test_linear_benchmark_dry_run_times_both_ways_and_writes_its_table(tmp_path):
    from benchmarks import linear

    linear.main(["--dry-run", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "linear-dry-run.json").read_text())
    parts = {r["part"] for r in result["records"]}
    assert parts == {"layer", "model", "generate"}
    for record in result["records"]:
        if record["part"] == "generate":
            assert record["torch_s"] > 0 and record["weight_major_s"] > 0 and record["same_as_target"]
            continue
        assert record["torch_ms"] > 0 and record["weight_major_ms"] > 0
        if record["part"] == "model":
            assert record["same_argmax"] and record["max_logit_diff"] < 1e-3
    assert {r["tokens"] for r in result["records"] if r["part"] == "model"} == {1, 2, 12}
    assert {r["setup"] for r in result["records"] if r["part"] == "generate"} == {
        "target alone", "assisted, full drafter cache", "assisted, page-round 4x"
    }  # fmt: skip
    table = (tmp_path / "linear-dry-run.md").read_text()
    assert "weight-major ms" in table and "Greedy generation end to end" in table


def test_step_benchmark_takes_policy_labels_with_overrides(tmp_path):
    """`--policies` reads labels as `python -m lab replay` does: the overrides reach the cache (an int8 selection at
    equal bytes holds more rows in no more bytes than the plain selection)."""
    from benchmarks import step

    out = tmp_path / "step.json"
    label = "rift-stat@kv_dtype=int8,kv_equal_bytes=true"
    step.main(["--dry-run", "--parts", "plain", "--policies", f"rift-stat,{label}", "--out", str(out)])
    records = {r["policy"]: r for r in json.loads(out.read_text())["records"]}
    assert set(records) == {"rift-stat", label}
    assert records[label]["kv_bytes"]["working"] <= records["rift-stat"]["kv_bytes"]["working"]
    assert records[label]["kv_bytes"] != records["rift-stat"]["kv_bytes"]


def test_replay_agreement_runs_resume_and_refuse_another_setting(tmp_path):
    """Tiny fp32 models: replay equals the real assisted run; a rerun skips what the file holds."""
    from benchmarks import replay_agreement

    out = tmp_path / "agreement.json"
    argv = ["--preset", "tiny-random", "--input-tokens", "128", "--new-tokens", "12", "--compression", "2"]
    argv += ["--window", "8", "--policies", "full,rift-stat@window=8", "--targets", str(tmp_path), "--out", str(out)]
    replay_agreement.main(argv)
    runs = json.loads(out.read_text())["runs"]
    assert [r["policy"] for r in runs] == ["full", "rift-stat@window=8"] * 2  # repeat and continue prompts
    assert all(r["same_rounds"] and r["real_output_is_target_greedy"] for r in runs)
    replay_agreement.main(argv)  # resumes: nothing to run
    assert json.loads(out.read_text())["runs"] == runs
    # A file written before runs carried their date: its runs keep the file's date when another session adds one.
    old = json.loads(out.read_text()) | {"date": "2000-01-01", "machine": "old box"}
    old["runs"] = [{k: v for k, v in r.items() if k not in ("machine", "date")} for r in runs[:-1]]
    out.write_text(json.dumps(old))
    replay_agreement.main(argv)
    resumed = json.loads(out.read_text())
    assert [r["date"] for r in resumed["runs"][:-1]] == ["2000-01-01"] * 3 and resumed["runs"][-1][
        "date"
    ] != "2000-01-01"
    head = replay_agreement.markdown(resumed).splitlines()[0]
    assert "old box" in head and head.endswith(f"2000-01-01, {resumed['runs'][-1]['date']}")
    with pytest.raises(SystemExit, match="another setting"):
        replay_agreement.main([*argv, "--new-tokens", "16"])


def test_long_inputs_prefill_speed_and_table_on_the_tiny_preset(tmp_path):
    from benchmarks import long_inputs

    common = ["--preset", "tiny-random", "--input-tokens", "160", "--new-tokens", "8", "--per-task", "1"]
    common += ["--targets", str(tmp_path / "targets"), "--prefills", str(tmp_path / "prefills"), "--window", "4"]
    long_inputs.main(["prefill", *common])
    saved = sorted(p.name for p in (tmp_path / "targets" / "tiny-random").iterdir())
    assert len(saved) == 2 and all(name.endswith("8tok-float32.json") for name in saved)
    settings = "target,transformers,transformers@num_assistant_tokens_schedule=heuristic,full,page-round@budget=64,"
    settings += "page-round@draft_length=auto,assistant_confidence_threshold=0.4"
    out = tmp_path / "speed"
    args = ["speed", *common, "--settings", settings, "--out", str(out), "--gamma", "3"]
    long_inputs.main(args)
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all(r["same_as_target"] for r in rows)
    assert all(r["prefill_seconds"]["target"] > 0 for r in rows)
    assert {r["budget"] for r in rows if r["setting"] == "page-round@budget=64"} == {64}
    long_inputs.main([*args, "--resume"])  # nothing left to run
    assert len((out / "rows.jsonl").read_text().splitlines()) == 12
    table = long_inputs.speed_table(out)
    assert "| page-round@draft_length=auto,assistant_confidence_threshold=0.4" in table
    assert "decode phase only" in table.lower()
    long_inputs.main(["plot", str(out), "--out", str(tmp_path / "speed.png")])
    assert (tmp_path / "speed.png").stat().st_size > 10_000

    # Passes: every other one in reverse order, summed in the tables (one row per prompt and setting).
    out = tmp_path / "passes"
    args = ["speed", *common, "--settings", "target,page-round", "--out", str(out), "--gamma", "3", "--passes", "3"]
    long_inputs.main(args)
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    first = [(r["setting"], r["pass"]) for r in rows if r["prompt"] == rows[0]["prompt"]]
    assert first == [("target", 0), ("page-round", 0), ("page-round", 1), ("target", 1), ("target", 2),
                     ("page-round", 2)]  # fmt: skip
    merged = long_inputs._read_rows(out)
    assert len(merged) == 4 and all(len(r["passes"]) == 3 and r["same_as_target"] for r in merged)
    mine = [r for r in rows if (r["prompt"], r["setting"]) == (merged[1]["prompt"], merged[1]["setting"])]
    assert merged[1]["tokens_per_s"] == pytest.approx(
        sum(r["output_tokens"] for r in mine) / sum(r["seconds"] for r in mine)
    )
    assert "3 passes per prompt" in long_inputs.speed_table(out)
    long_inputs.main([*args, "--resume"])  # nothing left to run
    assert len((out / "rows.jsonl").read_text().splitlines()) == 12


def test_long_inputs_speed_computes_missing_prompt_forwards_before_any_run(tmp_path, monkeypatch):
    from benchmarks import long_inputs
    from rift_hf.generation import decode

    events = []
    ensure, generate = long_inputs.ensure_prompt_cache, decode.generate_from

    def ensuring(target, draft, prompt, folder, window):
        events.append(("load" if (folder / "draft.safetensors").is_file() else "compute", prompt.name))
        return ensure(target, draft, prompt, folder, window)

    monkeypatch.setattr(long_inputs, "ensure_prompt_cache", ensuring)
    monkeypatch.setattr(decode, "generate_from", lambda *a, **k: (events.append(("run", None)), generate(*a, **k))[1])
    common = ["--preset", "tiny-random", "--input-tokens", "160", "--new-tokens", "4", "--per-task", "1"]
    common += ["--targets", str(tmp_path / "targets"), "--prefills", str(tmp_path / "prefills"), "--window", "4"]
    common += ["--settings", "target,page-round", "--gamma", "2"]
    long_inputs.main(["speed", *common, "--out", str(tmp_path / "s")])
    kinds = [kind for kind, _ in events]
    assert kinds[:2] == ["compute", "compute"] and "compute" not in kinds[2:], events
    assert kinds.count("run") == 4 and kinds.count("load") == 2  # each prompt's runs load its forwards from disk


def test_draft_length_simulation_writes_every_case_against_the_best_constant(tmp_path):
    from benchmarks import draft_length_sim

    draft_length_sim.main(["--rounds", "30", "--seeds", "2", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "draft-length-sim.json").read_text())
    rows = {r["case"]: r for r in record["rows"]}
    assert set(rows) == set(draft_length_sim.CASES)
    assert rows["losing"]["best_constant"] == 0 and rows["cheap-agreeing"]["best_constant"] >= 8
    # the best constant is the best over the same draws, so no controller beats it by more than chance allows
    assert all(0 < r["vs_best_constant"] <= 1.1 for r in rows.values())
    assert "controller / best" in (tmp_path / "draft-length-sim.md").read_text()


def test_draft_length_traces_follow_the_replayed_rounds(tmp_path):
    from benchmarks import draft_length_traces as traces

    # a round that accepted 1 then rejected; one that rejected at once; an all-accepted round continuing into the next
    assert traces.runs_from([1, 0, 2, 2], gamma=2) == [1, 0, 0, 2, 2, 2, 2, 1, 0]
    assert traces.runs_from([2, 0], gamma=2) == [2, 1, 0, 0]
    # drafting a constant k along the runs accepts min(k, run) per round: k = 0 is the target alone
    trace = traces.TraceSet("tune", "", "p", 0.1, ((1, 1.0), (4, 1.3)), "")
    assert traces.play([0] * 8, trace, 8, 0)[0] == 1.0
    rate, lengths = traces.play([3, 2, 1, 0] * 4, trace, 8, 3)
    assert lengths == [3, 3] and rate == 8 / (2 * (0.3 + 1.3))
    # successive calls: a fresh controller times the target alone in its second round, a resumed one knows that cost
    starts = ("fresh", "resumed")
    prompts = {"a": [5] * 60, "b": [5] * 60}
    fresh, resumed = (traces.play_calls(prompts, trace, 24, traces.DraftLength, 0.0, traces.play, s) for s in starts)
    assert fresh["a"] == resumed["a"] and fresh["a"][1][:2] == [4, 0]
    assert fresh["b"][1][:2] == [4, 0] and resumed["b"][1][0] == 4 and resumed["b"][1][1] > 0, (fresh, resumed)
    traces.main(["--new-tokens", "48", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "draft-length-traces.json").read_text())["rows"]
    # a row per set, start and regime that the set's replay has prompts of, counting them
    counts = {
        (name, g): sum(p.startswith(g + ":") for p in traces.load(trace)[0])
        for name, trace in traces.SETS.items()
        for g in ("repeat", "continue")
    }
    pairs = {(s, start, g) for (s, g), n in counts.items() if n for start in ("fresh", "resumed")}
    assert {(r["set"], r["start"], r["regime"]) for r in rows} == pairs
    assert all(r["prompts"] == counts[r["set"], r["regime"]] and 0 < r["vs_best_constant"] <= 1.1 for r in rows)
    assert counts["32k-fp32-rift-dyn", "repeat"] == 5 and not counts["32k-fp32-rift-dyn", "continue"]
    # resumed calls carry what the controller learnt (costs, acceptance) from one prompt to the next; fresh ones not
    rates = {(r["set"], r["start"], r["regime"]): r["vs_target"] for r in rows}
    assert any(rates[s, "fresh", g] != rates[s, "resumed", g] for s, _, g in pairs)


def test_draft_length_traces_with_cost_noise_charge_every_setting_alike(tmp_path):
    from benchmarks import draft_length_traces as traces

    # noise: each round's verification over its row's median at that size (sizes seen `least` times; first round out)
    rows = tmp_path / "rows.jsonl"
    row = {"drafted": [4, 3, 3, 3, 0, 0], "round_verify_seconds": [9.0, 1.0, 2.0, 3.0, 0.5, 0.5]}
    rows.write_text(json.dumps(row) + "\n" + json.dumps({"setting": "target"}) + "\n")
    assert sorted(traces.cost_noise([rows], least=2)) == [0.5, 1.0, 1.0, 1.0, 1.5]
    with pytest.raises(ValueError, match="No round costs"):
        traces.cost_noise([rows], least=4)
    draws = traces.noise_draws([0.5, 2.0], seed=1, rounds=6)
    assert draws == traces.noise_draws([0.5, 2.0], seed=1, rounds=6) and {f for d in draws for f in d} <= {0.5, 2.0}
    # a round pays its factors: on the verification and on every drafter forward
    trace = traces.TraceSet("tune", "", "p", 0.1, ((1, 1.0), (4, 1.3)), "")
    assert traces.play([0] * 8, trace, 8, 0, noise=[(2.0, 1.0)])[0] == 0.5
    rate, _ = traces.play([3] * 8, trace, 8, 3, noise=[(1.0, 3.0), (2.0, 1.0)])
    assert rate == pytest.approx(8 / ((0.9 + 1.3) + (0.3 + 2.6)))
    with pytest.raises(ValueError, match="default player"):
        traces.evaluate(8, player=traces.play, noise=draws)
    traces.main(["--new-tokens", "48", "--noise-seeds", "2", "--out", str(tmp_path / "noisy")])
    traces.main(["--new-tokens", "48", "--out", str(tmp_path / "clean")])
    noisy, clean = (json.loads((tmp_path / d / "draft-length-traces.json").read_text()) for d in ("noisy", "clean"))
    assert noisy["noise_seeds"] == 2 and noisy["noise_from"] == list(traces.NOISE_FROM)
    spread = noisy["noise_ratios"]
    assert spread["count"] == len(traces.cost_noise()) and spread["median"] <= spread["p95"] <= spread["max"]
    assert all(r["noise_seeds"] == 2 for r in noisy["rows"]) and len(noisy["rows"]) == len(clean["rows"])
    assert [r["vs_target"] for r in noisy["rows"]] != [r["vs_target"] for r in clean["rows"]]
    # the target alone pays the noise too: a constant 11 against it stays near its noise-free ratio
    for a, b in zip(noisy["rows"], clean["rows"], strict=True):
        assert abs(a["constant_11_vs_target"] / b["constant_11_vs_target"] - 1) < 0.1, (a, b)


def test_verify_cost_times_both_backends_and_puts_the_target_back(tmp_path):
    from benchmarks import verify_cost

    args = ["--preset", "tiny-random", "--input-tokens", "160", "--tokens", "1", "3", "--repeats", "1"]
    verify_cost.main([*args, "--prefills", str(tmp_path / "prefills"), "--out", str(tmp_path)])
    (path,) = tmp_path.glob("verify-cost-tiny-random-*in.json")
    record = json.loads(path.read_text())
    assert [r["tokens"] for r in record["rows"]] == [1, 3]
    assert all(r["sdpa_seconds"] > 0 and r["sdpa_gqa_seconds"] > 0 for r in record["rows"])
    assert all(r["max_logit_difference"] < 1e-4 for r in record["rows"])


def test_idle_rounds_holds_the_controller_at_zero_and_keeps_the_target_output(tmp_path):
    from benchmarks import idle_rounds
    from rift_hf.generation.draft_length import DraftLength

    choose = DraftLength.choose
    args = ["--preset", "tiny-random", "--input-tokens", "100", "--new-tokens", "6", "--repeats", "1"]
    idle_rounds.main([*args, "--prefills", str(tmp_path / "prefills"), "--out", str(tmp_path)])
    record = json.loads((tmp_path / "idle-rounds-tiny-random-100in.json").read_text())
    assert [r["prompt"].split(":")[0] for r in record["rows"]] == ["repeat", "continue"]
    assert all(r["same_output"] and r["target_seconds"] > 0 and r["idle_loop_seconds"] > 0 for r in record["rows"])
    assert DraftLength.choose is choose  # the hold is undone


def test_replay_check_finds_committed_rows_identical_and_names_a_changed_one(tmp_path):
    """The behaviour check of a refactor: a replay folder replayed again comes out row for row the same; a row whose
    accepted counts were altered is named."""
    from benchmarks import replay_check
    from lab.records import Experiment
    from lab.replay_runs import replay_compare

    experiment = Experiment("tiny-random", ("full", "rift-stat", "page-round"), 96, 24, 1, gamma=4, window=8)
    replay_compare(experiment, [4], tmp_path / "run", targets_dir=tmp_path / "targets")
    folder = tmp_path / "run" / "4x"
    argv = [str(folder), "--policies", "rift-stat,page-round", "--targets", str(tmp_path / "targets")]
    replay_check.main([*argv, "--out", str(tmp_path / "same.json")])
    report = json.loads((tmp_path / "same.json").read_text())
    assert report["same"] == len(report["rows"]) == 6  # full (the reference), rift-stat, page-round; two regimes
    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]
    rows[1]["accepted"] = [a + 1 for a in rows[1]["accepted"]]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SystemExit):
        replay_check.main([*argv, "--out", str(tmp_path / "changed.json")])
    changed = json.loads((tmp_path / "changed.json").read_text())
    assert [(r["prompt"], r["policy"]) for r in changed["rows"] if r["differs"]] == [
        (rows[1]["prompt"], rows[1]["policy"])
    ]


def test_cost_matched_scales_a_ratio_by_the_hosts_speed_on_rounds_of_one_size(tmp_path):
    from benchmarks.long_inputs import cost_matched

    def row(setting, tokens_per_s, per_round):
        return {"prompt": "repeat:x", "task": "repeat", "setting": setting, "tokens_per_s": tokens_per_s,
                "drafted": [4] + [11] * 4, "round_draft_seconds": [9.0] + [per_round / 2] * 4,
                "round_verify_seconds": [9.0] + [per_round / 2] * 4}  # fmt: skip

    rows = [row("a", 3.0, 1.2), row("b", 4.0, 1.0)]  # a's rounds 20% dearer: the host was slower during a's run
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    text = cost_matched(tmp_path, "a", "b")
    assert "| 0.750 " in text and "| 1.200 " in text and "| 0.900 " in text, text
    with pytest.raises(ValueError, match="no rows"):
        cost_matched(tmp_path, "a", "c")

    # Two passes (a b, b a): tokens/s over both, every pass's rounds priced.
    rows = [row("a", 3.0, 1.2), row("b", 4.0, 1.0), row("b", 4.0, 1.0), row("a", 3.0, 1.4)]
    for r, seconds in zip(rows, (40.0, 32.0, 32.0, 60.0), strict=True):
        r.update(output_tokens=128, seconds=seconds)
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    text = cost_matched(tmp_path, "a", "b")
    assert "| 0.640 " in text and "| 1.300 " in text and "| 0.832 " in text, text
