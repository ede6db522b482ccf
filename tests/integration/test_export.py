"""Export and titles through the real daemon and agentctl.

``agentctl export`` asks the daemon (wire op ``export``), which renders the
transcript from the conversation's journal. The script
(tests/integration/scripts/export.toml) answers with text full of markup, a
reasoning item and a tool call; "ask ..." asks a question; "named ..." lets the
provider title the conversation itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from daemon_harness import Daemon
from environment import unavailable

SCRIPTS = Path(__file__).parent / "scripts"
EXPORT = str(SCRIPTS / "export.toml")
ECHO = str(SCRIPTS.parents[2] / "conf" / "scripts" / "echo.toml")


def one_json(cp: subprocess.CompletedProcess[str]) -> Any:
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def new(daemon: Daemon, workdir: Path, *extra: str, script: str = EXPORT) -> str:
    return one_json(daemon.agentctl("new", "-p", "script", "-m", script, "--cwd", str(workdir), "--json", *extra))["id"]


def talk(daemon: Daemon, conv: str) -> None:
    """One turn with markup, reasoning and a tool; one question answered."""
    assert daemon.agentctl("send", conv, "check the TODOs", "--follow").returncode == 0
    assert daemon.agentctl("send", conv, "ask me", "--exit-on-action", "--follow").returncode == 4
    assert daemon.agentctl("answer", conv, "--choice", "blue").returncode == 0
    deadline = time.monotonic() + 15
    while one_json(daemon.agentctl("show", conv, "--json"))["record"]["state"] != "idle":
        assert time.monotonic() < deadline
        time.sleep(0.05)


# ---------------------------------------------------------------------- export


def test_markdown_export_has_what_was_said_and_tools_only_when_asked(daemon: Daemon, workdir: Path) -> None:
    conv = new(daemon, workdir, "--title", "Export me")
    talk(daemon, conv)

    cp = daemon.agentctl("export", conv)  # md by default, on stdout
    assert cp.returncode == 0, cp.stderr
    md = cp.stdout
    assert md.startswith("# Export me\n")
    assert f"`{conv}`" in md
    assert "### You" in md and "check the TODOs" in md
    # Raw HTML in the agent's text is text in the Markdown too (a viewer runs and loads nothing).
    assert "Answer to check the TODOs: &lt;script>alert('x')&lt;/script> & \"quoted\"" in md
    assert "Which colour?" in md and "> **Answer:** blue" in md and "You picked blue." in md
    assert "grep -n TODO" not in md and "Thinking about" not in md

    full = daemon.agentctl("export", conv, "--format", "md", "--include-tools").stdout
    assert "### Tool: grep" in full and "grep -n TODO src/" in full and "src/a.py:3: # TODO <b>bold</b>" in full
    assert "### Reasoning" in full and "Thinking about check the TODOs" in full
    # Entries keep the journal's order.
    assert full.index("check the TODOs") < full.index("Thinking about") < full.index("Which colour?")


def test_json_export_is_one_document_of_entries(daemon: Daemon, workdir: Path) -> None:
    conv = new(daemon, workdir)
    talk(daemon, conv)
    doc = json.loads(daemon.agentctl("export", conv, "--format", "json", "--include-tools").stdout)
    assert doc["format"] == "agentd-transcript" and doc["version"] == 1
    assert doc["conversation"]["id"] == conv and doc["conversation"]["provider"] == "script"
    roles = [e["role"] for e in doc["entries"]]
    assert roles == ["user", "reasoning", "tool", "assistant", "user", "question", "assistant"]
    question = doc["entries"][5]
    assert (question["text"], question["answer"], question["state"]) == ("Which colour?", "blue", "answered")
    assert doc["entries"][2]["tool"]["name"] == "grep"

    # --json wraps the rendered text with what it is.
    wrapped = one_json(daemon.agentctl("export", conv, "--format", "json", "--json"))
    assert wrapped["conversation"] == conv and wrapped["format"] == "json"
    assert json.loads(wrapped["text"])["conversation"]["id"] == conv


def test_html_export_is_one_self_contained_file_with_everything_escaped(
    daemon: Daemon, workdir: Path, tmp_path: Path
) -> None:
    conv = new(daemon, workdir, "--title", "<b>Bold</b> & co")
    talk(daemon, conv)
    out = tmp_path / "transcript.html"
    res = one_json(daemon.agentctl("export", conv, "--format", "html", "--include-tools", "-o", str(out), "--json"))
    assert res == {"ok": True, "conversation": conv, "format": "html", "path": str(out), "bytes": out.stat().st_size}
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<title>&lt;b&gt;Bold&lt;/b&gt; &amp; co</title>" in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &quot;quoted&quot;" in page
    # Nothing outside the file: no script, no element loading or linking anything; CSS inline only.
    tags = _tags(page)
    assert {t for t, _ in tags} <= {"html", "head", "meta", "title", "style", "body", "main", "h1", "dl", "dt", "dd",
                                     "section", "div", "span", "time", "pre", "p", "strong", "ul", "li", "details",
                                     "summary", "footer"}
    assert not [a for _, attrs in tags for a, _v in attrs if a in ("src", "href", "action", "srcset", "style")]
    assert "url(" not in page and "@import" not in page
    assert "default-src 'none'" in page
    assert "<style>" in page


def _tags(page: str) -> list[tuple[str, list[tuple[str, str | None]]]]:
    """Every start tag of ``page`` with its attributes, as a browser's parser sees them."""
    from html.parser import HTMLParser

    found: list[tuple[str, list[tuple[str, str | None]]]] = []

    class Collect(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            found.append((tag, attrs))

    Collect().feed(page)
    return found


def _chromium() -> str:
    """A headless-capable Chromium: found, else installed with apt-get where that works, else skip."""
    names = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
    found = next((shutil.which(n) for n in names if shutil.which(n)), None)
    if found:
        return found
    if os.environ.get("AGENTD_TEST_INSTALL_CHROMIUM", "1") != "0" and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        try:
            subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "chromium"], env=env,
                           capture_output=True, timeout=900, check=False)
        except (OSError, subprocess.TimeoutExpired):
            pass
        found = next((shutil.which(n) for n in names if shutil.which(n)), None)
        if found:
            return found
    unavailable("no Chromium here and `apt-get install -y chromium` is not possible (not root, no apt-get, "
                "or no package source); CI installs it in .ci/run")


def test_html_export_opens_in_a_headless_browser(daemon: Daemon, workdir: Path, tmp_path: Path) -> None:
    browser = _chromium()
    conv = new(daemon, workdir, "--title", "Browser check")
    talk(daemon, conv)
    out = tmp_path / "page.html"
    assert daemon.agentctl("export", conv, "--format", "html", "-o", str(out)).returncode == 0
    profile = tmp_path / "chromium-profile"
    cp = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", f"--user-data-dir={profile}", "--dump-dom", out.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert cp.returncode == 0, cp.stderr[-2000:]
    dom = cp.stdout
    assert "<h1>Browser check</h1>" in dom
    assert "check the TODOs" in dom and "You picked blue." in dom
    # The markup in the answer stayed text: the browser built no element from it.
    assert "&lt;script&gt;alert('x')&lt;/script&gt;" in dom
    assert "<img" not in dom


FORM_SCRIPT = """
model = "form"
delay_ms = 0

[[turn]]
[[turn.step]]
kind = "form"
title = "Deploy settings"
echo = true

[[turn.step.field]]
name = "service"
text = "Service name"
required = true

[[turn.step.field]]
name = "regions"
text = "Regions"
type = "array"
choices = ["Europe", "America"]
values = ["eu", "us"]

[[turn.step.field]]
name = "canary"
text = "Canary first?"
type = "boolean"

[[turn.step.field]]
name = "note"
text = "Note"
"""


def test_a_forms_fields_and_answers_are_exported_one_per_line(daemon: Daemon, workdir: Path, tmp_path: Path) -> None:
    script = tmp_path / "form.toml"
    script.write_text(FORM_SCRIPT)
    conv = new(daemon, workdir, script=str(script))
    assert daemon.agentctl("send", conv, "deploy", "--exit-on-action", "--follow").returncode == 4
    pending = daemon.agentctl("export", conv).stdout
    assert "- Service name\n- Regions\n- Canary first?\n- Note\n\n> *pending*" in pending
    cp = daemon.agentctl("answer", conv, "--field", "service=api <v2>", "--field", "regions=Europe",
                         "--field", "regions=America", "--field", "canary=Yes")
    assert cp.returncode == 0, cp.stderr
    deadline = time.monotonic() + 15
    while one_json(daemon.agentctl("show", conv, "--json"))["record"]["state"] != "idle":
        assert time.monotonic() < deadline
        time.sleep(0.05)

    md = daemon.agentctl("export", conv).stdout
    assert ("**Deploy settings**\n\n- **Service name:** api &lt;v2>\n- **Regions:** Europe, America\n"
            "- **Canary first?** Yes\n- **Note:** —\n") in md
    assert "> **Answer:**" not in md

    page = daemon.agentctl("export", conv, "--format", "html").stdout
    assert ('<ul class="fields"><li><strong>Service name:</strong> <span class="value">api &lt;v2&gt;</span></li>'
            '<li><strong>Regions:</strong> <span class="value">Europe, America</span></li>') in page

    doc = json.loads(daemon.agentctl("export", conv, "--format", "json").stdout)
    form = next(e for e in doc["entries"] if e["role"] == "question")
    assert form["fields"] == [{"label": "Service name", "value": "api <v2>"},
                              {"label": "Regions", "value": "Europe, America"},
                              {"label": "Canary first?", "value": "Yes"}, {"label": "Note", "value": ""}]
    assert form["state"] == "answered"


def test_export_of_an_unknown_conversation_exits_6(daemon: Daemon) -> None:
    cp = daemon.agentctl("export", "cnope", "--format", "html")
    assert cp.returncode == 6 and "not_found" in cp.stderr


# ---------------------------------------------------------------------- titles


def title_of(daemon: Daemon, conv: str) -> str:
    return one_json(daemon.agentctl("show", conv, "--json"))["record"]["title"]


def test_the_first_prompt_titles_an_untitled_conversation(daemon: Daemon, workdir: Path) -> None:
    conv = new(daemon, workdir, script=ECHO)
    prompt = ("\n  Please refactor the authentication module so that   it uses the new token service\n"
              "and the second line is not part of the title")
    assert daemon.agentctl("send", conv, prompt, "--follow").returncode == 0
    title = title_of(daemon, conv)
    assert title == "Please refactor the authentication module so that it uses…"
    assert len(title) <= 60
    titles = [r for r in daemon.journal(conv) if r["type"] == "title"]
    prompt_seq = next(r["seq"] for r in daemon.journal(conv) if r["type"] == "prompt")
    assert [r["data"] for r in titles] == [title] and titles[0]["seq"] < prompt_seq

    # Later prompts leave it alone.
    assert daemon.agentctl("send", conv, "something else", "--follow").returncode == 0
    assert title_of(daemon, conv) == title

    short = new(daemon, workdir, script=ECHO)
    assert daemon.agentctl("send", short, "fix the build", "--follow").returncode == 0
    assert title_of(daemon, short) == "fix the build"


def test_a_given_title_is_kept_and_a_providers_own_title_wins_over_the_prompt(daemon: Daemon, workdir: Path) -> None:
    mine = new(daemon, workdir, "--title", "Mine")
    assert daemon.agentctl("send", mine, "check the TODOs", "--follow").returncode == 0
    assert title_of(daemon, mine) == "Mine"
    # Not even the provider's own title replaces a title a person gave.
    assert daemon.agentctl("send", mine, "named by you please", "--follow").returncode == 0
    assert title_of(daemon, mine) == "Mine"
    assert one_json(daemon.agentctl("show", mine, "--json"))["record"]["title_source"] == "user"

    conv = new(daemon, workdir)
    assert daemon.agentctl("send", conv, "named by you please", "--follow").returncode == 0
    assert title_of(daemon, conv) == "Named by the provider"
    assert one_json(daemon.agentctl("show", conv, "--json"))["record"]["title_source"] == "provider"
    assert [r["data"] for r in daemon.journal(conv) if r["type"] == "title"] == [
        "named by you please", "Named by the provider"]


def test_agentctl_title_sets_it_and_tells_the_provider_even_after_a_restart(daemon: Daemon, workdir: Path) -> None:
    conv = new(daemon, workdir)
    record = one_json(daemon.agentctl("title", conv, "  First   name ", "--json"))
    assert record == {"ok": True, "conversation": conv, "title": "First name"}  # as set, not as typed
    assert title_of(daemon, conv) == "First name"
    provider_id = one_json(daemon.agentctl("show", conv, "--json"))["record"]["provider_conversation_id"]
    provider_file = daemon.state_dir / "providers" / "script" / f"{provider_id}.json"
    assert json.loads(provider_file.read_text())["title"] == "First name"

    daemon.stop()
    daemon.start()
    said = daemon.agentctl("title", conv[:8], "Second\tname")
    assert said.returncode == 0 and said.stdout == f"title of {conv}: Second name\n"
    assert title_of(daemon, conv) == "Second name"
    assert json.loads(provider_file.read_text())["title"] == "Second name"
    assert "Second name" in daemon.agentctl("ls").stdout

    too_long = daemon.agentctl("title", conv, "x" * 201)
    assert too_long.returncode == 8 and "at most 200 characters" in too_long.stderr
    cleared = daemon.agentctl("title", conv, "")
    assert cleared.returncode == 0 and cleared.stdout == f"title of {conv} cleared\n"
    assert title_of(daemon, conv) == ""


def _computed(browser: str, page: Path, profile: Path, expression: str) -> Any:
    """``expression`` evaluated in ``page`` opened by headless ``browser``, over the DevTools protocol.

    The page's own policy allows no script: the value is read from outside it.
    """
    import httpx
    import trio
    from trio_websocket import open_websocket_url

    proc = subprocess.Popen(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         f"--user-data-dir={profile}", "--remote-debugging-port=0", "--remote-allow-origins=*", page.as_uri()],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert time.monotonic() < deadline and proc.poll() is None, "Chromium did not open its DevTools port"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        while True:
            pages = [p for p in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
                     if p.get("type") == "page" and p.get("url") == page.as_uri()]
            if pages:
                break
            assert time.monotonic() < deadline, "Chromium did not open the page"
            time.sleep(0.1)

        async def evaluate() -> Any:
            async with open_websocket_url(pages[0]["webSocketDebuggerUrl"]) as ws:
                for n in range(1, 600):
                    await ws.send_message(json.dumps({"id": n, "method": "Runtime.evaluate", "params": {
                        "expression": f"document.readyState === 'complete' ? ({expression}) : null",
                        "returnByValue": True}}))
                    while True:
                        msg = json.loads(await ws.get_message())
                        if msg.get("id") == n:
                            break
                    value = msg["result"]["result"].get("value")
                    if value is not None:
                        return value
                    await trio.sleep(0.1)
            raise AssertionError("the page never finished loading")

        return trio.run(evaluate)
    finally:
        proc.kill()
        proc.wait()


def test_html_export_renders_the_agents_markdown_in_a_browser(daemon: Daemon, workdir: Path, tmp_path: Path) -> None:
    browser = _chromium()
    conv = new(daemon, workdir, "--title", "Markdown check")
    assert daemon.agentctl("send", conv, "markdown", "--follow").returncode == 0
    out = tmp_path / "md.html"
    assert daemon.agentctl("export", conv, "--format", "html", "-o", str(out)).returncode == 0
    seen = _computed(browser, out, tmp_path / "profile", """JSON.stringify({
        heading: [...document.querySelectorAll('.md h3')].map(h => h.textContent),
        strong: [...document.querySelectorAll('.md strong')].map(h => h.textContent),
        items: [...document.querySelectorAll('.md li')].map(li => li.textContent),
        block: (document.querySelector('.md pre code') || {}).textContent,
        blockFont: getComputedStyle(document.querySelector('.md pre code')).fontFamily,
        inlineFont: getComputedStyle(document.querySelector('.md p code')).fontFamily,
        textFont: getComputedStyle(document.querySelector('.md p')).fontFamily,
        em: document.querySelectorAll('.md em').length,
        links: document.querySelectorAll('a, img, script').length,
    })""")
    got = json.loads(seen)
    assert got["heading"] == ["Build report"], got
    assert got["strong"] == ["passed"], got
    assert got["block"] == "make check\n", got
    assert got["items"] == ["docs <https://example.invalid/docs> for the rest", "<em>raw html</em> stays text"], got
    assert got["em"] == 0 and got["links"] == 0, got  # the agent's HTML is text; nothing links or loads
    assert "monospace" in got["blockFont"] and "monospace" in got["inlineFont"], got
    assert "monospace" not in got["textFont"], got
