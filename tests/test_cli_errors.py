"""Every CLI mistake a user can make ends with one line on stderr and exit status 2, before anything is written."""

import pytest

from lab.cli import main

MISTAKES = [
    ["replay", "--per-task", "-1"],
    ["replay", "--input-tokens", "-5"],
    ["replay", "--new-tokens", "-5"],
    ["replay", "--gamma", "0"],
    ["replay", "--window", "0"],
    ["replay", "--policies", "full,rift-dyn@delta=abc"],
    ["replay", "--policies", "full,nothing"],
    ["replay", "--sources", "missing.jsonl"],
    ["replay", "--tasks", "foo"],
    ["compare", "--gamma", "0"],
    ["compare", "--policies", "rift-stat@window=-3"],
]


@pytest.mark.parametrize("argv", MISTAKES, ids=lambda a: " ".join(a))
def test_cli_mistakes_are_one_line_errors(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error:" in err[0], err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_table_of_a_file_that_is_not_json_is_a_one_line_error(tmp_path, capsys):
    bad = tmp_path / "notes.json"
    bad.write_text("not json")
    for path in (bad, tmp_path / "missing.json"):
        with pytest.raises(SystemExit) as exit_info:
            main(["table", str(path)])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(("python -m lab: error:", "python -m lab table: error:")), err
