"""The Gradio demo on the tiny random preset: its `compare` API through gradio_client, and a real browser."""

import time

import pytest

pytest.importorskip("gradio")
client_module = pytest.importorskip("gradio_client")

from rift_hf.demo.browser import CHROMIUM, run_in_browser, serve  # noqa: E402

PROMPT = "def parse(argv):\n    options = {}\n    for arg in argv:\n        key, _, value = arg.partition('=')\n" * 8


@pytest.fixture(scope="module")
def server():
    with serve("tiny-random", startup_s=120) as url:
        yield url


def test_compare_endpoint_and_bad_input(server):
    client = client_module.Client(server, verbose=False)
    rows = client.predict("tiny-random", PROMPT, 0.25, 4, ["swa", "rift-dyn"], 16, api_name="/compare")
    assert [r["policy"] for r in rows] == ["swa", "rift-dyn"]
    for row in rows:
        assert row["al"] >= 1.0 and 0.0 < row["retention"] and row["draft_tokens_per_s"] > 0
    with pytest.raises(Exception, match="prompt is empty"):
        client.predict("tiny-random", "   ", 0.25, 4, ["swa"], 16, api_name="/compare")
    with pytest.raises(Exception, match="budget must be a fraction"):
        client.predict("tiny-random", PROMPT, 1.5, 4, ["swa"], 16, api_name="/compare")
    again = client.predict("tiny-random", PROMPT, 0.5, 4, ["snapkv"], 8, api_name="/compare")
    assert again[0]["policy"] == "snapkv"  # still serving after the errors


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_browser_runs_a_comparison(server, tmp_path):
    pytest.importorskip("playwright.sync_api")
    screenshot = run_in_browser(
        server,
        PROMPT,
        ["full", "swa", "rift-dyn"],
        new_tokens=16,
        out=tmp_path / "demo.png",
        user_data=tmp_path / "profile",
    )
    assert screenshot.stat().st_size > 10_000


def test_a_cancelled_run_frees_the_queue(server):
    client = client_module.Client(server, verbose=False)
    args = ("tiny-random", PROMPT, "(none)", 0.25, 4, ["full", "swa", "snapkv", "rift-stat", "rift-dyn"], 2000)
    long_job = client.submit(*args, api_name="/compare_stream")
    deadline = time.time() + 60
    while not long_job.outputs() and time.time() < deadline:  # wait until it streams
        time.sleep(0.2)
    long_job.cancel()
    quick = client.submit("tiny-random", PROMPT, 0.5, 4, ["swa"], 8, api_name="/compare")
    assert quick.result(timeout=90)[0]["policy"] == "swa"
