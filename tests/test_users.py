"""What a newcomer meets: extras named up front, runs that write only where told, conventions of transformers."""

import json
import sys

import pytest

from lab.cli import main
from rift_hf import RiftConfig


def _one_line_exit(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.mark.parametrize(
    ("argv", "hidden", "extra"),
    [
        (["compare", "--preset", "tiny-random", "--per-task", "1"], "evaluate", "bench"),
        (["replay", "--preset", "tiny-random", "--per-task", "1"], "evaluate", "bench"),
        (["models", "install", "qwen-coder"], "gguf", "bench"),
        (["demo", "--help"], "gradio", "demo"),
    ],
)
def test_a_missing_extra_is_named_before_any_work(argv, hidden, extra, capsys, monkeypatch, tmp_path):
    import subprocess

    monkeypatch.setitem(sys.modules, hidden, None)  # as if not installed
    monkeypatch.setenv("RIFT_HF_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(subprocess, "check_call", lambda *a, **k: pytest.fail("pip ran before the check"))
    line = _one_line_exit(capsys, argv)
    assert f'pip install "rift-hf[{extra}]"' in line and hidden in line
    assert not list(tmp_path.rglob("*")), "nothing is written"


def test_compare_and_replay_write_only_under_out_and_the_user_cache(tmp_path, monkeypatch):
    home, out, cwd = tmp_path / "home", tmp_path / "out", tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.setenv("RIFT_HF_HOME", str(home))
    monkeypatch.chdir(cwd)
    import lab.records as records

    monkeypatch.setattr(records, "USER_HOME", home)
    common = ["--preset", "tiny-random", "--per-task", "1", "--input-tokens", "96", "--new-tokens", "8", "--gamma", "4"]
    main(["compare", *common, "--policies", "full,page-round", "--window", "8", "--out", str(out / "c")])
    main(["replay", *common, "--policies", "full,page-round", "--window", "8", "--compressions", "4",
          "--out", str(out / "r"), "--targets", str(home / "targets")])  # fmt: skip
    assert not list(cwd.rglob("*")), "nothing lands in the current directory"
    assert (out / "c" / "summary.json").is_file() and (out / "r" / "summary.json").is_file()
    assert not (out / "summary.json").exists()  # nothing beside --out either


def test_compare_warms_up_and_lets_settings_take_turns(tmp_path, monkeypatch):
    import lab.compare as runner
    from lab.records import Experiment

    calls = []
    original = runner._run

    def spy(policy, experiment, compression, target, draft, prompt, gen, *rest):
        calls.append((policy, gen["max_new_tokens"]))
        return original(policy, experiment, compression, target, draft, prompt, gen, *rest)

    monkeypatch.setattr(runner, "_run", spy)
    experiment = Experiment("tiny-random", ["full", "page-round"], 96, 6, 1, gamma=4, window=8, delta=4)
    runner.compare(experiment, 4.0, tmp_path, "float32", summary_path=tmp_path / "s.json")
    warm = [policy for policy, tokens in calls if tokens == 2]
    timed = [policy for policy, tokens in calls if tokens == 6]
    assert warm == ["target", "full", "page-round"]  # every setting once, untimed, before any timed run
    assert timed == ["target", "full", "page-round", "page-round", "full", "target"]  # A B C, then C B A


def test_config_from_pretrained_takes_overrides_and_writes_json(tmp_path):
    config = RiftConfig(policy="page-round", budget=0.25)
    config.save_pretrained(tmp_path)
    assert RiftConfig.from_pretrained(tmp_path, budget=0.5) == config.replace(budget=0.5)
    with pytest.raises(ValueError, match="Unknown RiftConfig field"):
        RiftConfig.from_pretrained(tmp_path, budgett=0.5)
    config.to_json_file(tmp_path / "copy.json")
    assert json.loads((tmp_path / "copy.json").read_text()) == json.loads(config.to_json_string()) == config.to_dict()


def test_a_dry_run_push_writes_nothing(tmp_path, capsys):
    from rift_hf.models import tiny_random_pair

    _, draft, _ = tiny_random_pair()
    folder = tmp_path / "drafter"
    draft.save_pretrained(folder)
    RiftConfig(policy="page-round").save_pretrained(folder)
    (folder / "README.md").write_text("---\nlicense: apache-2.0\n---\n# drafter\n")
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    try:
        main(["push", str(folder), "me/drafter", "--dry-run", "--custom-generate"])
    except SystemExit as exit_:  # a folder the checks refuse still must not be written into
        assert exit_.code == 2
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before
    assert "dry run: not written" in capsys.readouterr().out


def test_cli_help_prints_each_default_once(capsys):
    for command in ("compare", "replay", "train", "table", "summary"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())  # help lines rewrapped into one
        entries = text.split(" --")[1:]  # one per option
        assert "(default: None)" not in text, command
        assert all(entry.count("(default:") <= 1 for entry in entries), command
