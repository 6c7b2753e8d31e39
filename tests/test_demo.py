"""The Gradio demo on the tiny random preset: its `compare` API through gradio_client, a real browser, and the
Space folder it writes."""

import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("gradio")
client_module = pytest.importorskip("gradio_client")

from rift_hf.demo import app as demo_app  # noqa: E402
from rift_hf.demo.browser import CHROMIUM, DEFAULT_POLICIES, run_in_browser, serve  # noqa: E402

PROMPT = "def parse(argv):\n    options = {}\n    for arg in argv:\n        key, _, value = arg.partition('=')\n" * 8


@pytest.fixture(scope="module")
def server():
    with serve("tiny-random", startup_s=120) as url:
        yield url


def test_browser_default_policies_match_the_page():
    assert list(DEFAULT_POLICIES) == demo_app.DEFAULT_POLICIES
    assert demo_app.RECOMMENDED in demo_app.DEFAULT_POLICIES


def test_compare_endpoint_and_bad_input(server):
    client = client_module.Client(server, verbose=False)
    rows = client.predict("tiny-random", PROMPT, 0.25, 4, ["swa", "rift-dyn"], 16, api_name="/compare")
    assert [r["policy"] for r in rows] == ["swa", "rift-dyn"]
    for row in rows:
        assert row["status"] == "done" and row["al"] >= 1.0 and 0.0 < row["retention"]
        assert row["draft_tokens_per_s"] > 0 and row["tokens_per_s"] > 0 and row["speedup_vs_target"] > 0
    with pytest.raises(Exception, match="prompt is empty"):
        client.predict("tiny-random", "   ", 0.25, 4, ["swa"], 16, api_name="/compare")
    with pytest.raises(Exception, match="budget must be a fraction"):
        client.predict("tiny-random", PROMPT, 1.5, 4, ["swa"], 16, api_name="/compare")
    # The work one request may ask for is bounded, and the preset is one of the page's choices (never a Hub name).
    with pytest.raises(Exception, match="Unknown preset"):
        client.predict("gemma3-2b-it", PROMPT, 0.25, 4, ["swa"], 16, api_name="/compare")
    with pytest.raises(Exception, match="at most 5 policies"):
        client.predict("tiny-random", PROMPT, 0.25, 4, list(demo_app.POLICY_CHOICES), 16, api_name="/compare")
    with pytest.raises(Exception, match="between 1 and 256"):
        client.predict("tiny-random", PROMPT, 0.25, 4, ["swa"], 2000, api_name="/compare")
    again = client.predict("tiny-random", PROMPT, 0.5, 4, ["snapkv"], 8, api_name="/compare")
    assert again[0]["policy"] == "snapkv"  # still serving after the errors


def test_stream_shows_queued_running_done_in_order(server):
    """Every streamed table is truthful: the rows run one at a time in order, queued before, done after."""
    client = client_module.Client(server, verbose=False)
    job = client.submit("tiny-random", PROMPT, "(none)", 0.25, 4, ["swa", "rift-dyn"], 16, api_name="/compare_stream")
    job.result(timeout=120)
    tables = [output[1] for output in job.outputs()]
    order = ["target alone", "swa", "rift-dyn"]
    seen = set()
    for table in tables:
        rows = table["data"]
        statuses = [row[1] for row in rows]
        assert [row[0] for row in rows] == order
        running = [i for i, s in enumerate(statuses) if s == "running"]
        assert len(running) <= 1
        cut = running[0] if running else statuses.count("done")
        assert statuses[:cut] == ["done"] * cut and all(s == "queued" for s in statuses[cut + 1 :]), statuses
        seen.update((name, status) for name, status in zip(order, statuses, strict=True))
    assert {("swa", "queued"), ("swa", "running"), ("swa", "done"), ("rift-dyn", "queued")} <= seen
    assert statuses == ["done"] * 3
    assert "speed-up vs target" in tables[-1]["headers"]


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_browser_runs_a_comparison(server, tmp_path):
    pytest.importorskip("playwright.sync_api")
    policies = ["full", "swa", "rift-dyn"]
    rows, seen = run_in_browser(
        server, PROMPT, policies, new_tokens=16, out=tmp_path / "demo.png", user_data=tmp_path / "profile"
    )
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    assert rows[0]["policy"] == "target alone" and sorted(row["policy"] for row in rows[1:]) == sorted(policies)
    for row in rows:
        assert row["status"] == "done" and float(row["tokens/s"]) > 0
    for row in rows[1:]:
        assert float(row["speed-up vs target"]) > 0 and float(row["AL"]) >= 1.0
    # Each row was shown running before done, and the later ones queued before they ran.
    assert {"running", "done"} <= set(seen["full"]) and {"queued", "running", "done"} <= set(seen["rift-dyn"])


def test_a_cancelled_run_frees_the_queue(server):
    client = client_module.Client(server, verbose=False)
    args = ("tiny-random", PROMPT, "(none)", 0.25, 4, ["full", "swa", "snapkv", "rift-stat", "rift-dyn"], 256)
    long_job = client.submit(*args, api_name="/compare_stream")
    deadline = time.time() + 60
    while not long_job.outputs() and time.time() < deadline:  # wait until it streams
        time.sleep(0.2)
    long_job.cancel()
    quick = client.submit("tiny-random", PROMPT, 0.5, 4, ["swa"], 8, api_name="/compare")
    assert quick.result(timeout=90)[0]["policy"] == "swa"


def test_space_folder_builds_the_app_without_the_installed_package(tmp_path):
    out = demo_app.write_space(tmp_path / "space", preset="tiny-random")
    assert {p.name for p in out.iterdir()} >= {"app.py", "requirements.txt", "README.md", "rift_hf"}
    requirements = (out / "requirements.txt").read_text().split()
    assert any(r.startswith("transformers") for r in requirements) and any(r.startswith("gradio") for r in requirements)
    assert {"pandas", "matplotlib"} <= set(requirements)  # what the demo imports beyond the package's requirements
    assert "sdk: gradio" in (out / "README.md").read_text()
    check = (
        "import sys, app, rift_hf, gradio as gr; "
        "assert rift_hf.__file__.startswith(sys.argv[1]), rift_hf.__file__; "
        "assert isinstance(app.demo, gr.Blocks); print('ok')"
    )
    env = {**os.environ, "RIFT_DEMO_PRESET": "tiny-random", "GRADIO_ANALYTICS_ENABLED": "False"}
    done = subprocess.run(
        [sys.executable, "-c", check, str(out)], cwd=out, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
    with pytest.raises(ValueError, match="not empty"):
        demo_app.write_space(out)
    with pytest.raises(ValueError, match="Unknown preset"):
        demo_app.write_space(tmp_path / "other", preset="nope")


def test_attention_mass_is_measured_only_when_asked():
    preset = demo_app.tiny_random_preset()
    ids = preset.encode(PROMPT)
    for asked in (False, True):
        run = demo_app.PolicyRun("rift-dyn")
        for _ in demo_app.run_policy(preset, ids, "rift-dyn", 0.25, 4, 8, 16, run, attention_mass=asked):
            pass
        assert run.status == "done" and bool(run.mass) == asked


def test_tiny_preset_text_is_readable_and_the_page_defines_its_terms():
    preset = demo_app.tiny_random_preset()
    text = preset.decode(list(range(256)))
    assert all(ch.isprintable() or ch in "\t\n" for ch in text) and "\ufffd" not in text
    assert preset.decode(preset.encode("def f(x):\n    return x")[0]) == "def f(x):\n    return x"
    page = demo_app.build_app().config
    markdown = " ".join(str(c.get("props", {}).get("value", "")) for c in page["components"])
    for term in ("**AL**", "**Retention**", "**γ**", "**Budget**"):
        assert term in markdown


def test_the_api_names_and_types_its_outputs():
    endpoints = demo_app.build_app().get_api_info()["named_endpoints"]
    stream = endpoints["/compare_stream"]["returns"]
    assert not any(r["label"].startswith("value_") for r in stream)  # gradio's placeholder for an unlabelled output
    (rows,) = endpoints["/compare"]["returns"]
    typed = rows["python_type"]["type"]
    assert typed.startswith("list[dict(") and "al: None | float" in typed and "speedup_vs_target" in typed
