"""Drive the demo in a real browser (Debian's chromium through Playwright): used by the test suite, and to take
the README screenshot of a real-preset run.

    python demo/browser.py --preset qwen-coder --out demo/screenshot.png
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Flags for a closed network: no background connections, no sandbox as root, no GPU.
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
APP = Path(__file__).resolve().parent / "app.py"
DEFAULT_POLICIES = ("full", "snapkv", "rift-dyn", "page-round", "auto")  # the page's default choice


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def serve(preset: str, startup_s: float = 600):
    """Start the demo on a loopback port; yields its URL, stops it afterwards."""
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    proc = subprocess.Popen(
        [sys.executable, str(APP), "--preset", preset, "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + startup_s
    try:
        while True:
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(proc.stdout.read().decode(errors="replace")) from None
                if time.time() > deadline:
                    raise RuntimeError(f"the demo did not start within {startup_s} s") from None
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# Records every status a policy row shows while the page runs (rows go queued -> running -> done).
WATCH_STATUSES = """() => {
  window.riftSeen = {};
  const note = () => document.querySelectorAll('#output .status').forEach(e => {
    (window.riftSeen[e.dataset.policy] ||= new Set()).add(e.textContent.trim());
  });
  new MutationObserver(note).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""
SEEN = "() => Object.fromEntries(Object.entries(window.riftSeen).map(([k, v]) => [k, [...v]]))"


def read_table(page) -> list[dict]:
    """The summary Dataframe as a list of {column: cell text}."""
    return page.evaluate(
        """() => {
      const CELL = '[role=gridcell], td';
      const head = [...document.querySelectorAll('#summary th[role=columnheader]')].map(th => th.title);
      return [...document.querySelectorAll('#summary [role=row]')].filter(r => r.querySelector(CELL)).map(r =>
        Object.fromEntries([...r.querySelectorAll(CELL)].map((td, i) => [head[i], td.innerText.trim()])));
    }"""
    )


def run_in_browser(url, prompt, policies, new_tokens, out, user_data, preset=None, timeout_s=180):
    """Type a prompt, pick policies, press Run, wait until every policy is done and the plots are drawn, then take
    a screenshot. Returns the summary table's rows and the statuses each policy's row showed along the way."""
    from playwright.sync_api import sync_playwright

    if CHROMIUM is None:
        raise RuntimeError("chromium is not installed: apt-get install chromium")
    with sync_playwright() as play:
        browser = play.chromium.launch_persistent_context(
            str(user_data),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1300, "height": 1700},
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
        page.evaluate(WATCH_STATUSES)
        page.locator("#run").click()
        page.wait_for_function(
            "n => { const s = [...document.querySelectorAll('#output .status')]; "
            "return s.length >= n && s.every(e => e.textContent.trim() === 'done'); }",
            arg=len(policies),
            timeout=timeout_s * 1000,
        )
        page.wait_for_function(
            "n => { const rows = [...document.querySelectorAll('#summary [role=row]')]"
            ".filter(r => r.querySelector('[role=gridcell], td'));"
            " return rows.length === n + 1 && rows.every(r => r.innerText.includes('done')); }",
            arg=len(policies),
            timeout=timeout_s * 1000,
        )
        page.locator("#plot img").first.wait_for(timeout=timeout_s * 1000)
        shown = page.locator("#output .al").all_inner_texts()
        if len(shown) != len(policies) or not all(float(v) >= 1.0 for v in shown):
            raise AssertionError(f"expected a numeric AL per policy, got {shown}")
        deadline = time.time() + 30
        while True:  # the Dataframe may re-render its cells a moment after the rows say done
            rows = read_table(page)
            if all(row.get("tokens/s") for row in rows) or time.time() > deadline:
                break
            page.wait_for_timeout(200)
        seen = page.evaluate(SEEN)
        page.screenshot(path=str(out), full_page=True)
        browser.close()
    return rows, seen


def main(argv=None) -> None:
    import inspect
    import tempfile
    import textwrap

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen-coder")
    parser.add_argument("--out", type=Path, default=Path("demo/screenshot.png"))
    parser.add_argument("--new-tokens", type=int, default=48)
    args = parser.parse_args(argv)
    prompt = "Write the same code again, unchanged:\n\n" + textwrap.dedent(inspect.getsource(textwrap.shorten))
    prompt += textwrap.dedent(inspect.getsource(textwrap.indent)) + textwrap.dedent(inspect.getsource(textwrap.dedent))
    with serve(args.preset) as url, tempfile.TemporaryDirectory() as profile:
        run_in_browser(
            url,
            prompt,
            list(DEFAULT_POLICIES),
            args.new_tokens,
            args.out,
            profile,
            timeout_s=1800,
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
