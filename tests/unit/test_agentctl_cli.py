"""agentctl's command group: every command listed and found, each loaded only when it is
needed; and how ``main`` ends the process.

``agentctl status --json`` pays for every module agentctl imports at start
(see tests/bench/bench_cli.py), so what loads when is checked here, in fresh
interpreters.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
from click.testing import CliRunner

from agentctl import __version__
from agentctl.cli import COMMANDS, cli


def loaded_after(code: str) -> set[str]:
    """The modules of agentctl, agentd and msgspec loaded after running ``code`` in a fresh interpreter."""
    probe = (
        f"import sys\n{code}\n"
        "import json\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('agentctl', 'agentd', 'msgspec'))))"
    )
    cp = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    return set(json.loads(cp.stdout.splitlines()[-1]))


def test_importing_agentctl_loads_click_but_no_command_and_no_wire_types() -> None:
    loaded = loaded_after("import agentctl.__main__")
    assert {"agentctl.cli", "agentctl.exitcodes"} <= loaded
    assert not {m for m in loaded if m.startswith(("agentctl.commands.", "msgspec", "agentd.wire", "agentd.contract"))}
    assert "agentctl.render" not in loaded and "agentctl.client" not in loaded


def test_a_command_loads_its_own_module_only() -> None:
    code = (
        "from agentctl.cli import cli\n"
        "try:\n"
        "    cli(['status', '--help'], prog_name='agentctl')\n"
        "except SystemExit:\n"
        "    pass"
    )
    loaded = loaded_after(code)
    assert "agentctl.commands.daemon" in loaded
    assert not {"agentctl.commands.conversations", "agentctl.commands.answer", "agentctl.commands.tasks"} & loaded
    for heavy in ("agentctl.render", "agentctl.follow", "agentctl.prompting", "agentctl.client"):
        assert heavy not in loaded, heavy


def test_every_command_is_found_under_its_name_and_listed_in_help() -> None:
    ctx = click.Context(cli)
    assert cli.list_commands(ctx) == sorted(COMMANDS)
    for name in COMMANDS:
        cmd = cli.get_command(ctx, name)
        assert isinstance(cmd, click.Command) and cmd.name == name, name
    assert cli.get_command(ctx, "nope") is None
    out = CliRunner().invoke(cli, ["--help"], prog_name="agentctl").output
    listed = out.split("Commands:")[1].split("Exit codes:")[0]
    assert [line.split()[0] for line in listed.strip().splitlines()] == sorted(COMMANDS)


def test_a_mistyped_command_is_answered_with_the_close_names_even_unloaded_ones() -> None:
    cp = subprocess.run([sys.executable, "-m", "agentctl", "stat"], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2
    assert "Did you mean" in cp.stderr and "'status'" in cp.stderr


def run_main(prelude: str, *args: str) -> subprocess.CompletedProcess[str]:
    code = f"import sys\n{prelude}\nsys.argv = ['agentctl', *{list(args)!r}]\nfrom agentctl.cli import main\nmain()"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_main_ends_with_the_command_s_exit_status_and_its_output_flushed(tmp_path: Path) -> None:
    ok = run_main("", "--version")
    assert (ok.returncode, ok.stdout) == (0, "agentctl, version " + __version__ + "\n")
    unreachable = run_main("", "--socket", str(tmp_path / "none.sock"), "--no-autostart", "status")
    assert unreachable.returncode == 5 and "not running" in unreachable.stderr
    usage = run_main("", "tail")
    assert usage.returncode == 2 and "give a conversation" in usage.stderr
    # what was asked to run at exit still runs: the interpreter then ends as usual
    hooked = run_main("import atexit\natexit.register(lambda: print('at exit'))", "--version")
    assert (hooked.returncode, hooked.stdout) == (0, f"agentctl, version {__version__}\nat exit\n")
    # so does a thread that the normal exit would wait for
    waited = run_main("import threading, time\nthreading.Thread(target=lambda: (time.sleep(0.3), print('done'))).start()",
                      "--version")
    # (either order: under load the thread's 0.3 s can pass before agentctl printed)
    assert waited.returncode == 0
    assert sorted(waited.stdout.splitlines()) == sorted([f"agentctl, version {__version__}", "done"])
