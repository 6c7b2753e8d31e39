"""Replay is exact: its rounds equal those of real `generate(assistant_model=...)`, round by round."""

import math

import pytest
import torch

import rift_hf
from lab.records import read_compare
from rift_hf import POLICIES
from rift_hf.config import RiftConfig, policy_settings
from rift_hf.generation.guide import target_attention
from rift_hf.replay import TargetOutput, load_target_output, replay, save_target_output, target_output
from tiny import ARCHITECTURES, SMALL, draft_target_pair, make_prompt, squeeze

GAMMA = 4
PROMPT = 40
NEW = 40


@pytest.fixture(scope="module")
def pairs():
    return {}


def _pair(pairs, arch, dtype=torch.float32):
    if (arch, dtype) not in pairs:
        target, draft = draft_target_pair(arch, GAMMA)
        pairs[arch, dtype] = target.to(dtype), draft.to(dtype)
    return pairs[arch, dtype]


def _replay(target, draft, record, config, **kwargs):
    """`replay`, with the target's attention at every verification for a guided policy (`guide="target"`)."""
    if RiftConfig.coerce(config).is_guided:
        kwargs["guide"] = target_attention(target, record.sequence, record.prompt_ids.shape[1] - 1)
    return replay(draft, record, config, **kwargs)


def _real_rounds(target, draft, ids, config, **gen):
    out = target.generate(
        ids,
        assistant_model=draft,
        max_new_tokens=NEW,
        do_sample=False,
        cache_implementation="rift",
        cache_config=config,
        **gen,
    )
    stats = rift_hf.last_stats(target)
    return out, [(r["drafted"], r["accepted"]) for r in stats.rounds], stats


# Every policy on a full-attention, a sliding+full and a stateful (linear attention) drafter; a store policy and a
# prompt-selection policy on every other architecture.
CASES = [(arch, policy) for arch in ("llama", "gemma3", "qwen3_5") for policy in POLICIES] + [
    (arch, policy)
    for arch in ARCHITECTURES
    if arch not in ("llama", "gemma3", "qwen3_5")
    for policy in ("snapkv", "rift-dyn")
]


# Quantised storage (optimum-quanto): a quantised selection at equal bytes, a quantised full store.
QUANTISED = [
    ("llama", "rift-stat", {"kv_dtype": "int4", "kv_group_size": 16, "kv_equal_bytes": True}),
    ("llama", "rift-dyn", {"kv_dtype": "int8", "store_dtype": "int4", "store_group_size": 16, "store_residual": 8}),
]


# page-round choosing again inside a round: replay splits its teacher-forced forward there.
IN_ROUND = [(arch, "page-round", {"rechoose_after": 2, "block_size": 2}) for arch in ("llama", "gemma3", "qwen3_5")]
IN_ROUND += [("llama", "page-round", {"rechoose_after": 0})]  # off: one choice per round

# page-round choosing from the target's attention (`guide="target"`): replay reads the teacher-forced rows.
GUIDED = [(arch, "page-round", {"guide": "target"}) for arch in ("llama", "gemma3", "qwen3_5")]
GUIDED += [("llama", "page-round", {"guide": "target", "rechoose_after": 0, "prompt_chunk": 8})]

# The chunked prompt pass (`prompt_chunk`): replay reads the prompt through the same chunks as the real loop.
CHUNKED = [(arch, p, {"prompt_chunk": 8}) for arch in ("llama", "qwen3_5") for p in POLICIES if p != "full"]
CHUNKED += [("gemma3", policy, {"prompt_chunk": 8, "prompt_budget": 9}) for policy in ("rift-dyn", "page-round")]


@pytest.mark.parametrize(
    ("arch", "policy", "fields"), [(a, p, {}) for a, p in CASES] + QUANTISED + IN_ROUND + GUIDED + CHUNKED
)
def test_replay_rounds_equal_real_assisted_rounds(pairs, arch, policy, fields):
    if fields:
        pytest.importorskip("optimum.quanto")
    target, draft = _pair(pairs, arch)
    ids = make_prompt(PROMPT, seed=3)
    config = policy_settings(policy, {**SMALL, **fields})
    record = target_output(target, ids, NEW)
    out, real, real_stats = _real_rounds(target, draft, ids, config)
    assert torch.equal(out, record.sequence)  # lossless, so the cached output is what the real run emitted
    stats = _replay(target, draft, record, config)
    assert [(r["drafted"], r["accepted"]) for r in stats.rounds] == real
    assert any(a < d for d, a in real) and any(a > 0 for _, a in real), "the case needs rejections and acceptances"
    assert [e["position"] for e in stats.rescorings] == [e["position"] for e in real_stats.rescorings]
    assert [e["reason"] for e in stats.rescorings] == [e["reason"] for e in real_stats.rescorings]
    # page-round's default 2 (also as `auto`'s choice for the prompt), or as `fields` set it
    chooses_in_round = bool(RiftConfig(**config).fitted(ids.shape[1]).rechoose_after)
    assert ("in-round" in [e["reason"] for e in stats.rescorings]) == chooses_in_round
    assert stats.acceptance_length == real_stats.acceptance_length
    assert stats.budget == real_stats.budget
    assert stats.peak_kv_bytes == real_stats.peak_kv_bytes
    assert stats.peak_bytes == real_stats.peak_bytes
    reads_in_chunks = bool(fields.get("prompt_chunk")) and not RiftConfig(policy=policy).policy_type.retrieves
    assert (real_stats.prompt_chunks > 0) == reads_in_chunks


@pytest.mark.parametrize("policy", ["full", "snapkv", "rift-dyn", "rift-ada"])
def test_replay_is_exact_in_float64(pairs, policy):
    target, draft = _pair(pairs, "gemma3", torch.float64)
    ids = make_prompt(PROMPT, seed=11)
    config = policy_settings(policy, SMALL)
    record = target_output(target, ids, NEW)
    _, real, _ = _real_rounds(target, draft, ids, config)
    assert [(r["drafted"], r["accepted"]) for r in replay(draft, record, config).rounds] == real


def test_replay_heuristic_schedule_and_length_limit(pairs):
    target, draft = _pair(pairs, "llama")
    ids = make_prompt(PROMPT, seed=4)
    draft.generation_config.num_assistant_tokens_schedule = "heuristic"
    try:
        config = policy_settings("rift-stat", SMALL)
        record = target_output(target, ids, NEW)
        _, real, _ = _real_rounds(target, draft, ids, config)
        # `heuristic` is persisted into the drafter's config by the real run: replay starts from the same gamma.
        draft.generation_config.num_assistant_tokens = GAMMA
        stats = replay(draft, record, config)
    finally:
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        draft.generation_config.num_assistant_tokens = GAMMA
    assert [(r["drafted"], r["accepted"]) for r in stats.rounds] == real
    assert len({d for d, _ in real}) > 1, "the schedule never changed the draft length"


def test_replay_with_eos_held_back_and_an_eos_in_the_output(pairs):
    target, draft = _pair(pairs, "qwen2")
    ids = make_prompt(PROMPT, seed=5)
    config = policy_settings("rift-dyn", SMALL)
    plain = target.generate(ids, max_new_tokens=NEW, do_sample=False)
    # Make a token the target emits mid-output its EOS: with min_new_tokens it is held back in target and drafter.
    eos = int(plain[0, PROMPT + NEW // 2])
    for model in (target, draft):
        model.generation_config.eos_token_id = eos
    try:
        for min_new in (NEW, 0):
            record = target_output(target, ids, NEW, min_new_tokens=min_new)
            _, real, real_stats = _real_rounds(target, draft, ids, config, min_new_tokens=min_new or None)
            stats = replay(draft, record, config)
            rounds = [(r["drafted"], r["accepted"]) for r in stats.rounds]
            assert [a for _, a in rounds] == [a for _, a in real]
            if min_new:
                assert rounds == real
                # The held-back EOS has probability 0: the entropy signal stays a number (it was nan).
                entropies = [e["signals"]["entropy"] for e in real_stats.rescorings]
                assert entropies and all(math.isfinite(x) for x in entropies)
                assert [e["signals"]["entropy"] for e in stats.rescorings] == pytest.approx(entropies, rel=1e-4)
            else:
                # After its first rejected draft the real drafter may draft EOS and stop: replay cannot know that.
                assert all(d_real <= d for (d, _), (d_real, _) in zip(rounds, real, strict=True))
                assert any(d_real < d for (d, _), (d_real, _) in zip(rounds, real, strict=True))
            assert (record.output_ids.shape[1] < NEW) == (min_new == 0)
    finally:
        for model in (target, draft):
            model.generation_config.eos_token_id = None


def test_target_output_round_trip_and_prompt_check(tmp_path, pairs):
    target, _ = _pair(pairs, "llama")
    ids = make_prompt(12, seed=6)
    record = target_output(target, ids, 5)
    path = tmp_path / "t.json"
    save_target_output(record, path, preset="tiny")
    again = load_target_output(path, ids)
    assert isinstance(again, TargetOutput) and torch.equal(again.sequence, record.sequence)
    with pytest.raises(ValueError, match="another prompt"):
        load_target_output(path, make_prompt(12, seed=7))


def test_replay_refuses_what_it_cannot_reproduce(pairs):
    target, draft = _pair(pairs, "llama")
    record = target_output(target, make_prompt(12, seed=6), 5)
    draft.generation_config.assistant_confidence_threshold = 0.4
    try:
        with pytest.raises(ValueError, match="assistant_confidence_threshold"):
            replay(draft, record, "rift-stat")
    finally:
        draft.generation_config.assistant_confidence_threshold = 0.0
    draft.generation_config.repetition_penalty = 1.2
    try:
        with pytest.raises(ValueError, match="repetition_penalty"):
            replay(draft, record, "rift-stat")
    finally:
        draft.generation_config.repetition_penalty = None


def test_pad_token_in_the_output_is_masked_as_the_real_loop_masks_it(pairs):
    # transformers' drafter generate infers a padding mask where the target emitted its pad token (0 here): replay
    # must feed the same mask (a stateful drafter makes any difference visible in later rounds).
    target, draft = _pair(pairs, "lfm2")
    ids = make_prompt(PROMPT, seed=3)
    config = policy_settings("rift-stat-block", SMALL)
    record = target_output(target, ids, NEW)
    assert bool((record.output_ids == target.generation_config.pad_token_id).any())
    _, real, _ = _real_rounds(target, draft, ids, config)
    assert [(r["drafted"], r["accepted"]) for r in replay(draft, record, config).rounds] == real


def test_replay_cli_writes_records_and_resumes(tmp_path):
    import json

    from lab.cli import main

    argv = [
        "replay",
        "--preset",
        "tiny-random",
        "--policies",
        "snapkv,rift-dyn",
        "--compressions",
        "4",
        "--input-tokens",
        "96",
        "--new-tokens",
        "24",
        "--per-task",
        "1",
        "--window",
        "8",
        "--delta",
        "8",
        "--targets",
        str(tmp_path / "targets"),
        "--out",
        str(tmp_path / "out"),
        "--summary",
        str(tmp_path / "summary.json"),
    ]
    main(argv)
    result = read_compare(tmp_path / "out" / "4x" / "compare.json")
    assert result["method"] == "replay" and [s["policy"] for s in result["summary"]] == ["full", "snapkv", "rift-dyn"]
    assert len(result["runs"]) == 6 and all(r["output_tokens"] == 24 for r in result["runs"])
    # The per-prompt rows are kept once, in rows.jsonl: compare.json names them.
    assert json.loads((tmp_path / "out" / "4x" / "compare.json").read_text())["runs"]["rows"] == "rows.jsonl"
    records = json.loads((tmp_path / "summary.json").read_text())
    assert {r["method"] for r in records} == {"replay"} and len(records) == 3
    assert len(list((tmp_path / "targets" / "tiny-random").glob("*.json"))) == 2
    rows = (tmp_path / "out" / "4x" / "rows.jsonl").read_text().splitlines()
    # A second run replays nothing again (every row is on disk) and leaves the folder's compare.json as its own run
    # wrote it (not re-stamped with this run's machine and date).
    stamped = tmp_path / "out" / "4x" / "compare.json"
    stamped.write_text(json.dumps({**result, "machine": "the machine that replayed the rows"}))
    main(argv)
    assert (tmp_path / "out" / "4x" / "rows.jsonl").read_text().splitlines() == rows
    again = read_compare(stamped)
    assert again["summary"] == result["summary"] and again["machine"] == "the machine that replayed the rows"
    # Continuing the folder with fewer policies keeps the others (every prompt replayed) in compare.json.
    main([a if a != "snapkv,rift-dyn" else "snapkv" for a in argv])
    fewer = read_compare(tmp_path / "out" / "4x" / "compare.json")
    assert fewer["summary"] == result["summary"] and len(fewer["runs"]) == 6
    # Every row names what its label meant; a row written with other settings is refused, not resumed as this one.
    held = [json.loads(line) for line in rows]
    assert all(r["settings"]["policy"] == r["policy"] for r in held)
    assert {r["settings"]["window"] for r in held if r["policy"] != "full"} == {8}
    assert {r["settings"]["store_dtype"] for r in held if r["policy"] == "rift-dyn"} == {None}
    held[1]["settings"]["window"] = 16
    (tmp_path / "out" / "4x" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held))
    with pytest.raises(ValueError, match=r"window=16.*window=8.*Name the setting in the label"):
        main(argv)
    (tmp_path / "out" / "4x" / "rows.jsonl").write_text("".join(line + "\n" for line in rows))
    # Two prompts per task asked, one cached per task: --cached-only replays those and leaves the others out.
    wider = [a if a != "1" else "2" for a in argv] + ["--cached-only"]
    main(wider)
    result = read_compare(tmp_path / "out" / "4x" / "compare.json")
    assert result["prompts"] == 2 and len(list((tmp_path / "targets" / "tiny-random").glob("*.json"))) == 2
    # Measurement mode: every compressed row records the attention mass it keeps, and summary.json its staleness.
    measured = [a if a != str(tmp_path / "out") else str(tmp_path / "mass") for a in argv] + ["--attention-mass"]
    main(measured)
    result = read_compare(tmp_path / "mass" / "4x" / "compare.json")
    assert result["extra"] == {"track_attention_mass": True}
    assert all(r["attention_mass"] for r in result["runs"] if r["policy"] != "full")
    records = json.loads((tmp_path / "summary.json").read_text())
    assert any(r["mass_early"] is not None and r["policy"] == "snapkv" for r in records)


def test_replay_cli_argument_errors(capsys):
    from lab.cli import main

    for argv, message in (
        (["replay", "--compressions", "1"], "finite numbers > 1"),
        (["replay", "--compressions", "four"], "takes numbers"),
        (["replay", "--policies", "nope"], "unknown policies"),
        (["replay", "--preset", "tiny-random", "--draft", "."], "real preset"),
        (["replay", "--draft", "/nonexistent/drafter"], "has no config.json"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code != 0
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt_oss"])
def test_a_shared_prefill_gives_the_rounds_of_real_runs(pairs, arch):
    from rift_hf.replay import capture_prefill

    target, draft = _pair(pairs, arch)
    ids = make_prompt(PROMPT, seed=8)
    record = target_output(target, ids, NEW)
    draft.set_attn_implementation("rift")  # one backend for every policy, as replay_compare sets it
    prefill = capture_prefill(draft, record, window=SMALL["window"])
    assert prefill is not None
    for policy in POLICIES:
        config = policy_settings(policy, SMALL)
        _, real, real_stats = _real_rounds(target, draft, ids, config)
        stats = _replay(target, draft, record, config, prefill=prefill)
        assert [(r["drafted"], r["accepted"]) for r in stats.rounds] == real, policy
        assert [e["position"] for e in stats.rescorings] == [e["position"] for e in real_stats.rescorings]


@pytest.mark.parametrize("policy", ["snapkv", "rift-dyn", "page-round"])
def test_a_shared_prefill_measures_the_attention_mass_of_real_runs(pairs, policy):
    from rift_hf.replay import capture_prefill

    target, draft = _pair(pairs, "llama")
    ids = make_prompt(PROMPT, seed=9)
    record = target_output(target, ids, NEW)
    draft.set_attn_implementation("rift")
    prefill = capture_prefill(draft, record, window=SMALL["window"])
    config = policy_settings(policy, {**SMALL, "track_attention_mass": True})
    _, real, real_stats = _real_rounds(target, draft, ids, config)
    stats = replay(draft, record, config, prefill=prefill)
    assert [(r["drafted"], r["accepted"]) for r in stats.rounds] == real
    positions = [p for p, _ in real_stats.attention_mass]
    assert positions and min(positions) >= PROMPT, "only decode steps are measured"
    assert [p for p, _ in stats.attention_mass] == positions
    assert [m for _, m in stats.attention_mass] == pytest.approx([m for _, m in real_stats.attention_mass], abs=1e-5)
    assert any(m < 0.999 for _, m in real_stats.attention_mass), "the case must evict attended positions"


def test_no_shared_prefill_for_recurrent_states(pairs):
    from rift_hf.replay import capture_prefill

    target, draft = _pair(pairs, "qwen3_5")
    record = target_output(target, make_prompt(PROMPT, seed=8), 4)
    assert capture_prefill(draft, record, window=4) is None


def test_replay_cli_on_your_own_prompts(tmp_path):
    import json

    from lab.cli import main

    prompts = tmp_path / "mine.jsonl"
    text = "the quick brown fox jumps over the lazy dog. " * 3
    prompts.write_text(
        "\n".join(json.dumps({"text": t, "task": task}) for t, task in ((text, "repeat"), (text[::-1], "notes")))
    )
    out = tmp_path / "out"
    main(
        ["replay", "--preset", "tiny-random", "--policies", "snapkv", "--compressions", "4", "--new-tokens", "16"]
        + ["--per-task", "1", "--window", "8", "--sources", str(prompts), "--targets", str(tmp_path / "targets")]
        + ["--out", str(out), "--summary", str(tmp_path / "summary.json")]
    )
    result = read_compare(out / "4x" / "compare.json")
    assert result["sources"] == str(prompts) and result["prompts"] == 2
    assert {r["task"] for r in result["runs"]} == {"repeat", "notes"}
    readme = tmp_path / "README.md"
    readme.write_text("<!-- mine:start -->\n<!-- mine:end -->\n")
    main(["table", str(out / "4x" / "rows.jsonl"), "--readme", str(readme), "--block", "mine"])
    table = readme.read_text()
    assert (
        "| repeat:0 |" in squeeze(table) and "| full | - |" in squeeze(table) and squeeze(table).count("| 1.000 |") == 2
    )


def test_replay_reuses_the_full_cache_row_across_compressions(tmp_path, monkeypatch):
    import json

    import lab.replay_runs as module  # where the runner looks `replay` up
    from lab.cli import main

    calls = []
    real = module.replay
    monkeypatch.setattr(module, "replay", lambda *a, **k: calls.append(a[2].policy) or real(*a, **k))
    argv = ["replay", "--preset", "tiny-random", "--policies", "snapkv", "--compressions", "4,8"]
    argv += ["--input-tokens", "96", "--new-tokens", "16", "--per-task", "1", "--window", "8", "--tasks", "repeat"]
    argv += ["--targets", str(tmp_path / "t"), "--out", str(tmp_path / "o"), "--summary", str(tmp_path / "s.json")]
    main(argv)
    assert calls == ["full", "snapkv", "snapkv"]  # full replayed once, for both compressions
    rows = {
        c: [json.loads(x) for x in (tmp_path / "o" / c / "rows.jsonl").read_text().splitlines()] for c in ("4x", "8x")
    }
    full = {c: next(r for r in rows[c] if r["policy"] == "full") for c in rows}
    assert full["4x"] == full["8x"]


def test_a_longer_cached_target_output_is_cut_to_the_length_asked(tmp_path, pairs):
    from rift_hf.replay import cached_target_output, target_output_path

    target, _ = _pair(pairs, "llama")
    ids = make_prompt(12, seed=8)
    short, long = target_output(target, ids, 6, min_new_tokens=6), target_output(target, ids, 14, min_new_tokens=14)
    assert cached_target_output(tmp_path, "tiny", "p", ids, 6, "float32") is None
    save_target_output(long, target_output_path(tmp_path, "tiny", "p", ids, 14, "float32"), preset="tiny")
    cut = cached_target_output(tmp_path, "tiny", "p", ids, 6, "float32")
    assert torch.equal(cut.output_ids, short.output_ids) and (cut.max_new_tokens, cut.min_new_tokens) == (6, 6)
    assert cached_target_output(tmp_path, "tiny", "p", ids, 6, "bfloat16") is None  # another dtype is not used
    assert cached_target_output(tmp_path, "tiny", "other", ids, 6, "float32") is None
    # One whose EOS was allowed before the length asked is not cut (the shorter run would have held EOS back).
    free = target_output(target, make_prompt(12, seed=9), 14)
    save_target_output(free, target_output_path(tmp_path, "tiny", "q", free.prompt_ids, 14, "float32"), preset="x")
    assert cached_target_output(tmp_path, "tiny", "q", free.prompt_ids, 6, "float32") is None


def test_replay_cli_with_a_budget_in_tokens(tmp_path, capsys):
    import json

    from lab.cli import main

    argv = ["replay", "--preset", "tiny-random", "--policies", "rift-stat", "--budget-tokens", "40", "--new-tokens"]
    argv += ["16", "--per-task", "1", "--window", "8", "--targets", str(tmp_path / "t"), "--summary"]
    argv += [str(tmp_path / "s.json")]
    for tokens in (96, 192):
        main(argv + ["--input-tokens", str(tokens), "--out", str(tmp_path / str(tokens))])
        result = read_compare(tmp_path / str(tokens) / "40tok" / "compare.json")
        assert (result["compression"], result["budget_tokens"]) == (None, 40)
        rows = [r for r in result["runs"] if r["policy"] == "rift-stat"]
        assert len(rows) == 2 and {r["budget"] for r in rows} == {40}
        assert all(r["input_tokens"] > 80 * tokens // 96 for r in rows)  # the budget does not follow the prompt
    records = [r for r in json.loads((tmp_path / "s.json").read_text()) if r["policy"] == "rift-stat"]
    # summary.json records the compression the budget amounts to at each input length
    assert len(records) == 2 and records[0]["compression"] < records[1]["compression"]
    assert all(r["compression"] == round(r["input_tokens"] / 40, 2) for r in records)
    for extra, message in ((["--compressions", "4"], "pass one of them"), ([], "positive")):
        with pytest.raises(SystemExit):
            main(["replay", "--budget-tokens", "0" if not extra else "64", *extra])
        assert message in capsys.readouterr().err


def test_rows_without_settings_resume_as_written_before_they_named_them():
    from lab.records import check_resumable, row_settings

    old = {"prompt": "continue:a", "policy": "page-round"}  # written before rows named their settings
    then = {"budget": 0.25, "prompt_chunk": 0}  # the prompt read in one forward, as every row then was
    check_resumable(old, row_settings({"policy": "page-round", "rechoose_after": 0, **then}, 4096), "rows")
    check_resumable({**old, "policy": "snapkv"}, row_settings({"policy": "snapkv", **then}, 4096), "rows")
    with pytest.raises(ValueError, match="rechoose_after=0.*rechoose_after=2.*page-round@rechoose_after=2"):
        check_resumable(old, row_settings({"policy": "page-round", "rechoose_after": 2, **then}, 4096), "rows")
    # The chunked prompt pass, default since 2026-12-07: such a row never resumes under a label that now reads so.
    with pytest.raises(ValueError, match="prompt_chunk=0.*prompt_chunk=1024"):
        check_resumable(old, row_settings({"policy": "page-round", "rechoose_after": 0, "budget": 0.25}, 4096), "rows")
    named = {"prompt": "continue:a", "policy": "page-round@rechoose_after=2"}  # the label set it: no assumption
    check_resumable(named, row_settings({"policy": "page-round", "rechoose_after": 2, **then}, 4096), "rows")
    # `auto` is recorded as the policy it resolves to for the prompt's length.
    assert row_settings({"policy": "auto", "budget": 0.25}, 4096)["policy"] == "page-round"
