"""Where the PostgreSQL store connects, said without its password, and why a connection failed.

The DSN comes from one of (``[store]`` in agentd.toml):

* ``dsn``: a libpq connection string (``host=db1 dbname=agentd user=agentd``) or URI
  (``postgresql://agentd@db1/agentd``); a password may be in it, but need not be;
* ``dsn_file``: a file holding such a string, checked as the config file is (owned by agentd's
  user or root, not writable by others, no symlink; :func:`agentd._trust.check_config_file`) and,
  since it may hold a password, not readable by group or others either;
* neither: libpq's own environment (``PGHOST``, ``PGDATABASE``, ``PGUSER``, ``PGSERVICE``, ...) and its
  password file (``PGPASSFILE``, ``~/.pgpass``), which libpq reads itself: agentd never sees that
  password. ``dsn`` and ``dsn_file`` combine with the environment the same way (libpq fills what
  they leave out).

The password is never logged, journaled or shown: :func:`masked` replaces it in a DSN before anything
prints it, :func:`resolve` registers it with :mod:`agentd.masking` (so a runtime or a log line that
echoes it is masked too), and errors name the target by :func:`describe`, which has no password.

A failure to connect is a :class:`StoreUnavailable` naming the target and libpq's cause;
``permanent`` says whether a restart can help (a wrong password, a missing database or role, a
malformed DSN: no) or not (the server is down or starting, refused, timed out: yes), and
``exit_code`` is 78 (EX_CONFIG, like a broken config) or 1 accordingly.
"""

from __future__ import annotations

import os
import re

import psycopg
from psycopg import conninfo as _conninfo

from ... import _trust, masking
from ...contract import AgentdError

__all__ = ["StoreUnavailable", "describe", "masked", "read_dsn_file", "resolve", "unavailable"]

#: libpq messages (after "failed: ") that a restart cannot change: the DSN, the account or the database is wrong.
_PERMANENT = re.compile(
    r"password authentication failed|no password supplied|does not exist|no pg_hba\.conf entry|"
    r"not permitted to log in|permission denied for database|invalid (?:integer|connection option|sslmode|"
    r"value|URI)|missing \"=\"|unterminated quoted string|SSL is not enabled on the server|"
    r"server does not support SSL|certificate|Name or service not known|authentication method \d+ not supported|"
    r"SCRAM authentication requires|server requested .* authentication",
    re.IGNORECASE,
)
#: a libpq parse error quotes the part of the DSN it stopped at: that part may be a password
_QUOTED = re.compile(r'"[^"]*"')


class StoreUnavailable(AgentdError):
    """The PostgreSQL store cannot be reached or used: ``target`` (no password), ``cause`` (libpq's words).

    ``permanent`` is True when a restart cannot help (wrong DSN, password, role or database);
    ``exit_code`` is then 78 (EX_CONFIG), else 1. Example text:
    ``PostgreSQL at host db1 port 5432 database agentd user agentd: password authentication failed for
    user "agentd" (a restart cannot fix this: check [store] dsn)``.
    """

    code = "internal"

    def __init__(self, target: str, cause: str, *, permanent: bool) -> None:
        hint = " (a restart cannot fix this: check [store] dsn / dsn_file, PG* variables, ~/.pgpass)" \
            if permanent else ""
        super().__init__(f"PostgreSQL at {target}: {cause}{hint}",
                         details={"target": target, "cause": cause, "permanent": permanent})
        self.target = target
        self.cause = cause
        self.permanent = permanent

    @property
    def exit_code(self) -> int:
        return _trust.EXIT_UNUSABLE if self.permanent else 1


def _parse(dsn: str) -> dict[str, str]:
    """libpq's own parse of ``dsn`` (keywords or URI); raises StoreUnavailable (permanent), never echoing it."""
    try:
        return {k: str(v) for k, v in _conninfo.conninfo_to_dict(dsn).items() if v is not None}
    except psycopg.Error as exc:
        cause = _QUOTED.sub('"…"', str(exc).strip()) or "cannot be parsed"
        raise StoreUnavailable("the configured DSN", f"not a libpq connection string or URI: {cause}",
                               permanent=True) from None


def masked(dsn: str) -> str:
    """``dsn`` with its password (if any) replaced by ``[redacted]``, as a keyword string; safe to print.

    A DSN libpq cannot parse comes back as ``(unparsable DSN)``: its text might hold a password.
    """
    try:
        params = _parse(dsn)
    except StoreUnavailable:
        return "(unparsable DSN)"
    if "password" in params:
        params["password"] = masking.REDACTED
    return _conninfo.make_conninfo("", **params)


def describe(dsn: str) -> str:
    """Where ``dsn`` connects, for people: ``host H port P database D user U``; never the password.

    Keys the DSN leaves out come from libpq's environment (``PGHOST`` ...), else libpq's defaults
    (the local socket, port 5432, the OS user's name), as libpq itself would pick them.
    """
    try:
        params = _parse(dsn)
    except StoreUnavailable:
        return "the configured DSN"
    env = os.environ
    if "service" in params or "PGSERVICE" in env:
        service = params.get("service") or env["PGSERVICE"]
        prefix = f"service {service} "
    else:
        prefix = ""
    host = params.get("host") or params.get("hostaddr") or env.get("PGHOST") or "the local socket"
    port = params.get("port") or env.get("PGPORT") or "5432"
    user = params.get("user") or env.get("PGUSER") or _os_user()
    dbname = params.get("dbname") or env.get("PGDATABASE") or user
    return f"{prefix}host {host} port {port} database {dbname} user {user}"


def _os_user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (KeyError, ImportError):
        return str(os.geteuid())


def read_dsn_file(path: str | os.PathLike[str]) -> str:
    """The DSN in ``path`` (``~`` expanded; surrounding whitespace stripped), checked as a secret config file.

    Raises :class:`StoreUnavailable` (permanent) when it is missing, empty or not UTF-8, and
    :class:`agentd._trust.Untrusted` when it or its directory breaks the trust rule, or when group or
    others may read it (it may hold a password: chmod 600 it).
    """
    path = os.path.expanduser(path)
    try:
        data = _trust.check_config_file(path, secret=True)
    except FileNotFoundError:
        raise StoreUnavailable(f"dsn_file {os.fspath(path)}", "no such file", permanent=True) from None
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise StoreUnavailable(f"dsn_file {os.fspath(path)}", "not UTF-8 text", permanent=True) from None
    if not text:
        raise StoreUnavailable(f"dsn_file {os.fspath(path)}", "empty", permanent=True)
    return text


def resolve(dsn: str = "", dsn_file: str | os.PathLike[str] = "") -> str:
    """The DSN to connect with: ``dsn``, else the contents of ``dsn_file``, else "" (libpq's environment).

    Checks that libpq can parse it and registers its password for masking. Raises
    :class:`StoreUnavailable` (permanent) when both are given or it cannot be parsed, and what
    :func:`read_dsn_file` raises.
    """
    if dsn and dsn_file:
        raise StoreUnavailable("the configured DSN", "give [store] dsn or dsn_file, not both", permanent=True)
    if dsn_file:
        dsn = read_dsn_file(dsn_file)
    password = _parse(dsn).get("password", "")
    if password:
        masking.register(password)
    return dsn


def unavailable(dsn: str, exc: BaseException) -> StoreUnavailable:
    """The :class:`StoreUnavailable` for ``exc``, a failure to connect to ``dsn`` (psycopg's or an OSError)."""
    text = str(exc).strip()
    # psycopg prefixes libpq's text; libpq prefixes "connection to server at ... failed: ", which describe() says.
    text = re.sub(r"^connection (?:failed|is bad): ", "", text)
    text = re.sub(r"^connection to server (?:at|on socket) .*? failed: ", "", text)
    text = re.sub(r"\s+", " ", text.replace("FATAL: ", "")).strip() or type(exc).__name__
    text = masking.mask_text(text)
    try:
        password = _parse(dsn).get("password", "")
    except StoreUnavailable as bad:
        return bad
    if password:
        text = text.replace(password, masking.REDACTED)
    return StoreUnavailable(describe(dsn), text, permanent=bool(_PERMANENT.search(text)))
