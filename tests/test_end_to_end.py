"""The benchmarks that time what a user times: whole calls (end_to_end) and the drafter's prompt pass."""

import json

from benchmarks import drafter_prompt_pass, end_to_end


def test_end_to_end_times_whole_calls_in_interleaved_passes(tmp_path):
    out = tmp_path / "e2e"
    settings = "target,transformers,default,full,default@step_aside=false,prompt_chunk=16,window=8"
    argv = ["run", "--preset", "tiny-random", "--input-tokens", "160", "--new-tokens", "8", "--per-task", "1",
            "--passes", "2", "--settings", settings, "--out", str(out)]  # fmt: skip
    end_to_end.main(argv)
    rows = end_to_end.read_rows(out)
    names = ["target", "transformers", "default", "full", "default@step_aside=false,prompt_chunk=16,window=8"]
    # 2 prompts (one per regime) x 2 passes, every other pass in reverse order
    first = [r["setting"] for r in rows if r["prompt"] == rows[0]["prompt"]]
    assert first == names + names[::-1]
    for row in rows:
        assert row["new_tokens"] == 8 and row["same_as_target"] is True
        assert row["end_to_end_seconds"] >= row["decode_seconds"] > 0
        assert row["prompt_forward_seconds"]["target"] > 0
        assert ("stepped_aside" in row) == (row["setting"] not in ("target", "transformers"))
        if row["setting"] in ("transformers", "full") or row["setting"].startswith("default@"):
            assert row["prompt_forward_seconds"]["draft"] > 0  # the drafter read the prompt
        if row["setting"].startswith("default@"):
            assert row["prompt_chunks"] > 1 and not row["stepped_aside"]
            # every round's drafts, acceptance and seconds on both sides, as many rounds as the row counts
            assert len(row["round_seconds"]) == row["rounds"] and row["refresh_seconds"] >= 0
            assert sum(d for d, *_ in row["round_seconds"]) == row["drafted"]
            assert all(0 <= a <= d and (s > 0 or d == 0) for d, a, s, _ in row["round_seconds"])
    # Resumes: nothing left to run, no row added.
    end_to_end.main(argv)
    assert len(end_to_end.read_rows(out)) == len(rows)
    text = end_to_end.table(rows)
    assert "| target " in text and "vs transformers" in text and "2 interleaved passes" in text
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- end-to-end:start -->\n<!-- end-to-end:end -->\n")
    end_to_end.main(["table", str(out), "--readme", str(readme)])
    assert f"<!-- record: {out.as_posix()} -->" in readme.read_text() and text in readme.read_text()
    # What a round costs, per rift setting that drafted (`full` and the default without its step-aside rule).
    end_to_end.main(["rounds", str(out)])
    costs = (out / "rounds.md").read_text()
    assert "| full " in costs and "| default@step_aside=false" in costs and "Rounds at " in costs
    first = costs.split("|---")[-1].split("\n")[1]  # the first setting's line: against itself
    assert first.split("|")[6].strip().startswith("1.000"), costs
    # Where it pays: the measured output length exact, the others computed from the phases.
    pays = end_to_end.where_it_pays([out], new_tokens=(8, 64))
    assert "| ~0K " in pays or "| ~0.2K " in pays
    assert "~" in pays.split("| full")[1].split("\n")[0]
    phase = end_to_end.phases(rows)[round(rows[0]["input_tokens"], -3), rows[0]["task"], "full"]
    assert phase["runs"] >= 2 and phase["draft_prompt"] > 0 and phase["new_tokens"] == 8


def test_drafter_prompt_pass_reports_each_pass_against_the_full_one_and_the_floor(tmp_path):
    settings = "full,chunked@prompt_chunk=16,window=8,budget=0.25,floor"
    drafter_prompt_pass.main(["--preset", "tiny-random", "--input-tokens", "300", "--passes", "2", "--sources",
                              "argparse", "--settings", settings, "--out", str(tmp_path)])  # fmt: skip
    record = json.loads((tmp_path / "drafter-prompt-pass.json").read_text())
    rows = record["rows"]
    assert [r["pass"] for r in rows] == ["full", "chunked@prompt_chunk=16,window=8,budget=0.25", "floor"] * 1 + [
        "floor",
        "chunked@prompt_chunk=16,window=8,budget=0.25",
        "full",
    ]
    by = {r["pass"]: r for r in rows}
    full, chunked = by["full"], by["chunked@prompt_chunk=16,window=8,budget=0.25"]
    assert chunked["settings"]["prompt_chunk"] == 16 and full["settings"]["prompt_chunk"] == 0
    # The whole pass holds the prompt twice (working set and store) at its peak; in chunks far less.
    assert full["peak_kv_bytes"] >= full["full_kv_bytes"] > chunked["peak_kv_bytes"]
    assert "x floor" in (tmp_path / "drafter-prompt-pass.md").read_text()
