"""The Gradio demo on the tiny random preset: its `compare` API through gradio_client, and a real browser."""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("gradio")
client_module = pytest.importorskip("gradio_client")

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PROMPT = "def parse(argv):\n    options = {}\n    for arg in argv:\n        key, _, value = arg.partition('=')\n" * 8


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "demo" / "app.py"), "--preset", "tiny-random", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            break
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(proc.stdout.read().decode(errors="replace")) from None
            time.sleep(0.5)
    else:
        proc.kill()
        raise RuntimeError("the demo did not start within 120 s")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


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
    sync_api = pytest.importorskip("playwright.sync_api")
    screenshot = run_in_browser(
        sync_api,
        server,
        PROMPT,
        ["full", "swa", "rift-dyn"],
        new_tokens=16,
        out=tmp_path / "demo.png",
        user_data=tmp_path / "profile",
    )
    assert screenshot.stat().st_size > 10_000


def run_in_browser(sync_api, url, prompt, policies, new_tokens, out, user_data, preset=None, timeout_s=180):
    """Drive the page like a person: type a prompt, pick policies, press Run, wait for every AL and the plot."""
    with sync_api.sync_playwright() as play:
        browser = play.chromium.launch_persistent_context(
            str(user_data),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1300, "height": 1500},
        )
        page = browser.new_page()
        page.goto(url)
        if preset:
            page.get_by_label("preset").click()
            page.get_by_role("option", name=preset).click()
        page.locator("#prompt textarea").fill(prompt)
        for box in page.get_by_role("checkbox").all():
            name = box.get_attribute("value") or box.evaluate("el => el.parentElement.innerText").strip()
            if (name in policies) != box.is_checked():
                box.click()
        page.get_by_label("new tokens").fill(str(new_tokens))
        page.locator("#run").click()
        page.wait_for_function(
            "n => document.querySelectorAll('#output .al').length >= n && "
            "[...document.querySelectorAll('#output .al')].every(e => !isNaN(parseFloat(e.textContent))) && "
            "!document.querySelector('#output').textContent.includes('running')",
            arg=len(policies),
            timeout=timeout_s * 1000,
        )
        page.locator("#plot img").first.wait_for(timeout=timeout_s * 1000)
        shown = page.locator("#output .al").all_inner_texts()
        assert len(shown) == len(policies) and all(float(v) >= 1.0 for v in shown), shown
        page.screenshot(path=str(out), full_page=True)
        browser.close()
    return out
