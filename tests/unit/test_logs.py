"""Logging: the rendered lines a user (or journald) sees, and that secrets never show."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import os
import pathlib
import re

import pytest
import structlog

from agentd import logs, masking
from agentd.logs import configure_logging, get_logger, register_secret

SYSTEMD_VARS = ("JOURNAL_STREAM", "INVOCATION_ID", "NO_COLOR")


class TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch):
    for var in SYSTEMD_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(masking, "_registry", masking._Registry())
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


def json_lines(buf: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_json_lines_carry_utc_timestamp_level_event_and_keys() -> None:
    buf = io.StringIO()
    configure_logging("info", "json", stream=buf)
    get_logger("agentd.test").info("conversation.opened", conversation="c1", seq=3, path=pathlib.Path("/x"))
    [line] = json_lines(buf)
    assert list(line)[:4] == ["timestamp", "level", "event", "logger"]
    assert line["level"] == "info" and line["event"] == "conversation.opened" and line["logger"] == "agentd.test"
    assert line["conversation"] == "c1" and line["seq"] == 3 and line["path"] == "/x"
    ts = dt.datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00"))
    assert line["timestamp"].endswith("Z") and ts.utcoffset() == dt.timedelta(0)
    assert abs(dt.datetime.now(dt.timezone.utc) - ts) < dt.timedelta(minutes=1)


def test_level_filters_structlog_and_stdlib_loggers() -> None:
    buf = io.StringIO()
    configure_logging("warning", "json", stream=buf)
    log = get_logger("agentd.test")
    log.info("dropped")
    log.warning("kept")
    logging.getLogger("somelib").info("dropped too")
    logging.getLogger("somelib").error("lib %s", "failed")
    assert [(l["event"], l["level"]) for l in json_lines(buf)] == [("kept", "warning"), ("lib failed", "error")]


def test_reconfiguring_replaces_the_handler() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", "json", stream=first)
    configure_logging("debug", "json", stream=second)
    get_logger().debug("once")
    assert first.getvalue() == ""
    assert [l["event"] for l in json_lines(second)] == ["once"]


def test_exceptions_are_rendered_into_the_json_line() -> None:
    buf = io.StringIO()
    configure_logging("info", "json", stream=buf)
    try:
        raise ValueError("runtime exited")
    except ValueError:
        get_logger().exception("runtime.failed")
    [line] = json_lines(buf)
    assert line["level"] == "error"
    assert "Traceback" in line["exception"] and "ValueError: runtime exited" in line["exception"]


# --------------------------------------------------------------------------- format choice


def test_auto_is_console_on_a_terminal() -> None:
    buf = TTY()
    configure_logging("info", "auto", stream=buf)
    get_logger("agentd.test").info("hello", n=1)
    out = buf.getvalue()
    assert "\x1b[" in out  # colored on a terminal
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert not plain.startswith("{")
    assert "hello" in plain and "[agentd.test]" in plain and "n=1" in plain


def test_console_honours_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    buf = TTY()
    configure_logging("info", "console", stream=buf)
    get_logger().info("hello", n=1)
    assert "\x1b[" not in buf.getvalue()
    assert re.match(
        r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z \[info\s*\] hello\s+\[test_logs\] n=1$", buf.getvalue().strip()
    )


def test_auto_is_json_when_not_a_terminal() -> None:
    buf = io.StringIO()
    configure_logging("info", "auto", stream=buf)
    get_logger().info("hello")
    assert json_lines(buf)[0]["event"] == "hello"


@pytest.mark.parametrize("var", ["JOURNAL_STREAM", "INVOCATION_ID"])
def test_auto_is_json_under_systemd_even_on_a_terminal(var: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(var, "8:1234" if var == "JOURNAL_STREAM" else "abc")
    buf = TTY()
    configure_logging("info", "auto", stream=buf)
    get_logger().info("hello")
    assert json_lines(buf)[0]["event"] == "hello"


def test_json_to_the_journal_carries_a_syslog_priority_prefix(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open(tmp_path / "journal", "w+") as stream:
        st = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        configure_logging("info", "auto", stream=stream)
        get_logger().info("hello")
        get_logger().error("bad")
        logging.getLogger("lib").warning("careful")
    lines = (tmp_path / "journal").read_text().splitlines()
    assert [line[:3] for line in lines] == ["<6>", "<3>", "<4>"]
    assert json.loads(lines[1][3:])["event"] == "bad"


def test_json_to_another_stream_under_systemd_has_no_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOURNAL_STREAM", "8:1234")
    buf = io.StringIO()
    configure_logging("info", "json", stream=buf)
    get_logger().info("hello")
    assert buf.getvalue().startswith("{")


def test_unknown_level_or_format_is_rejected() -> None:
    with pytest.raises(ValueError, match="level"):
        configure_logging("verbose", "json")
    with pytest.raises(ValueError, match="format"):
        configure_logging("info", "xml")


# --------------------------------------------------------------------------- redaction


def test_values_under_secret_looking_keys_are_redacted() -> None:
    buf = io.StringIO()
    configure_logging("info", "json", stream=buf)
    get_logger().info(
        "provider.started",
        api_key="sk-1",
        github_token="ghp_x",
        client_secret="s",
        Password="p",
        authorization="Bearer abc",
        env={"OPENAI_API_KEY": "sk-2", "PATH": "/bin"},
        headers=[{"Authorization": "Bearer def"}],
        model="gpt-5",
        has_token=True,
    )
    [line] = json_lines(buf)
    for key in ("api_key", "github_token", "client_secret", "Password", "authorization"):
        assert line[key] == "[redacted]"
    assert line["env"] == {"OPENAI_API_KEY": "[redacted]", "PATH": "/bin"}
    assert line["headers"] == [{"Authorization": "[redacted]"}]
    assert line["model"] == "gpt-5" and line["has_token"] is True
    for secret in ("sk-1", "ghp_x", "Bearer", "sk-2"):
        assert secret not in buf.getvalue()


SECRET = "sk-ant-api03-Zx9YqW"


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_registered_secret_is_redacted_everywhere(fmt: str) -> None:
    buf = io.StringIO()
    configure_logging("debug", fmt, stream=buf)
    register_secret(SECRET)
    log = get_logger("agentd.providers.copilot")

    class Holder:
        def __repr__(self) -> str:
            return f"Holder(key={SECRET})"

    log.info(f"starting with {SECRET}", note=f"url=https://x/?k={SECRET}&a=1", args=["--key", SECRET], obj=Holder())
    try:
        raise RuntimeError(f"401 for key {SECRET}")
    except RuntimeError:
        log.exception("request.failed")
    logging.getLogger("httpx").warning("sent %s", SECRET)
    out = buf.getvalue()
    assert SECRET not in out
    assert out.count("[redacted]") >= 6
    assert "url=https://x/?k=[redacted]&a=1" in out


def test_secret_needing_json_escapes_is_redacted() -> None:
    secret = 'pa"ss\\word-42'
    buf = io.StringIO()
    configure_logging("info", "json", stream=buf)
    register_secret(secret)

    class Holder:
        def __repr__(self) -> str:
            return f"<{secret}>"

    get_logger().info("x", value=f"a{secret}b", obj=Holder())
    [line] = json_lines(buf)
    assert line["value"] == "a[redacted]b" and line["obj"] == "<[redacted]>"


def test_overlapping_secrets_are_redacted_whole() -> None:
    buf = io.StringIO()
    configure_logging("info", "json", stream=buf)
    register_secret("abcd1234")
    register_secret("abcd1234efgh5678")
    get_logger().info("x", v="abcd1234efgh5678")
    assert json_lines(buf)[0]["v"] == "[redacted]"


def test_empty_and_very_short_secrets_are_ignored() -> None:
    buf = io.StringIO()
    configure_logging("info", "json", stream=buf)
    register_secret("")
    register_secret("   ")
    register_secret("a")
    register_secret(None)
    get_logger().info("a banana")
    assert json_lines(buf)[0]["event"] == "a banana"
