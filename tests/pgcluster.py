"""A real PostgreSQL for the tests: one throwaway cluster per pytest process, a fresh database per test.

Registered as a pytest plugin by tests/conftest.py, so any test may ask for:

* ``pg_cluster`` (session): a :class:`PgCluster` started from Debian's ``postgresql`` package (the newest
  ``/usr/lib/postgresql/*/bin``, else ``initdb``/``postgres`` on PATH), ``initdb``-ed into a temp dir and
  stopped (and its dir removed) when the session ends. One per pytest-xdist worker: each worker is a
  process with its own session.
* ``pg_db`` (function): a :class:`PgDatabase`, an empty database created for this test from
  ``template0`` and dropped after it; ``pg_db.dsn`` reaches it over the Unix socket as the superuser.

How the cluster runs:

* It listens on a Unix socket in its temp dir (``host`` is that dir) and on 127.0.0.1 at a free port
  (``tcp_dsn``), nothing else. The socket trusts every local role: only the server's own user (and root)
  may enter the 0700 directory. TCP asks for a password (scram-sha-256), so DSN and password tests
  have a real one to get right or wrong; :meth:`PgCluster.create_role` makes such a role.
* ``fsync=off``, ``full_page_writes=off`` and ``synchronous_commit=off``: a crash of the machine
  may lose this cluster, which nobody keeps; a crash of postgres or of a client process loses nothing
  the database acknowledged (it stays in the OS page cache). So no test here can prove durability
  across a power loss; tests of commit ordering and of killed clients are still exact.
* PostgreSQL refuses to run as root. As root (CI) the server runs as the ``postgres`` user of the
  Debian package (else ``nobody``): the temp dir is given to that user, the processes drop to it
  (``subprocess`` ``user=``/``group=``), and the tests, as root, still reach the 0700 socket dir.
  As a normal user the server runs as that user.
* The postmaster gets SIGQUIT when this pytest process dies (PR_SET_PDEATHSIG), so a killed run leaves
  no server behind.

A machine without PostgreSQL fails the test under CI and skips it elsewhere (tests/environment.py).
:class:`PgCluster` works outside pytest too (tests/bench/bench_pg.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import glob
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

#: the cluster's superuser (``initdb -U``)
SUPERUSER = "agentd_test"
#: how long the server may take to accept connections, seconds
START_TIMEOUT_S = 60.0

_PR_SET_PDEATHSIG = 1


def find_bindir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<major>/bin`` holding ``initdb`` and ``postgres``, else PATH's; None."""
    found = []
    for d in glob.glob("/usr/lib/postgresql/*/bin"):
        major = Path(d).parent.name
        if major.isdigit() and os.access(os.path.join(d, "initdb"), os.X_OK) \
                and os.access(os.path.join(d, "postgres"), os.X_OK):
            found.append((int(major), Path(d)))
    if found:
        return max(found)[1]
    initdb, postgres = shutil.which("initdb"), shutil.which("postgres")
    if initdb and postgres and Path(initdb).parent == Path(postgres).parent:
        return Path(initdb).parent
    return None


def _server_user() -> pwd.struct_passwd | None:
    """Whom the server runs as: None (ourselves) unless we are root, then ``postgres`` or ``nobody``."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("running as root, and neither a postgres nor a nobody user exists to run PostgreSQL as")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # Runs in the child after it dropped to the server user (subprocess sets uid before preexec_fn).
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGQUIT, 0, 0, 0)


class PgCluster:
    """A running throwaway PostgreSQL cluster (see the module docstring); :meth:`stop` ends it.

    ``host`` is the Unix socket directory, ``port`` the port of both the socket and 127.0.0.1,
    ``version`` the server's major version, ``bindir`` where its programs are.
    """

    def __init__(self, bindir: Path, *, base: Path | None = None) -> None:
        self.bindir = bindir
        self.version = int(bindir.parent.name) if bindir.parent.name.isdigit() else 0
        self._user = _server_user()
        if base is None and self._user is not None:
            base = Path("/tmp")  # not $TMPDIR: the server's user must be able to reach it (a root-only dir would not do)
        self.root = Path(tempfile.mkdtemp(prefix="agentd-pg-", dir=base))
        self.data = self.root / "data"
        self.host = str(self.root)  # the socket dir: short, well under the AF_UNIX limit
        self.log = self.root / "postgres.log"
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._names = itertools.count(1)

    # ------------------------------------------------------------------ running

    def _run_as(self) -> dict[str, object]:
        if self._user is None:
            return {}
        return {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}

    def start(self) -> PgCluster:
        """initdb and start the server; returns once it accepts connections. Raises RuntimeError naming the log."""
        if self._user is not None:
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)
        os.chmod(self.root, 0o700)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8", "TZ": "UTC"}
        init = subprocess.run(
            [str(self.bindir / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "-E", "UTF8", "--locale=C.UTF-8",
             "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync"],
            env=env, cwd=self.root, capture_output=True, **self._run_as())  # type: ignore[call-overload]
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed ({init.returncode}): {init.stderr.decode(errors='replace')[-2000:]}")
        for attempt in range(5):
            self.port = _free_port()
            log = open(self.log, "ab")
            try:
                self._proc = subprocess.Popen(
                    [str(self.bindir / "postgres"), "-D", str(self.data), "-k", self.host, "-p", str(self.port),
                     "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "full_page_writes=off",
                     "-c", "synchronous_commit=off", "-c", "max_connections=200", "-c", "shared_buffers=32MB",
                     "-c", "log_min_messages=warning", "-c", "unix_socket_permissions=0700"],
                    env=env, cwd=self.root, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    preexec_fn=_die_with_parent, **self._run_as())  # type: ignore[call-overload]
            finally:
                log.close()
            if self._wait_ready():
                return self
            self._proc.kill()
            self._proc.wait()
        raise RuntimeError(f"postgres did not start; see {self.log}:\n{self._log_tail()}")

    def _wait_ready(self) -> bool:
        import psycopg

        assert self._proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False  # the port was taken meanwhile, or a real failure: start() retries, then reports
            try:
                psycopg.connect(self.dsn(), connect_timeout=2).close()
                return True
            except psycopg.OperationalError:
                time.sleep(0.05)
        return False

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError as exc:
            return f"(unreadable: {exc})"

    def stop(self) -> None:
        """Stop the server (fast shutdown, then SIGKILL after 30 s) and remove its directory; idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # postgres: SIGINT is the fast shutdown
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ reaching it

    def dsn(self, dbname: str = "postgres", *, user: str = SUPERUSER) -> str:
        """A libpq keyword DSN over the Unix socket (trusted: no password)."""
        return f"host={self.host} port={self.port} dbname={dbname} user={user}"

    def tcp_dsn(self, dbname: str = "postgres", *, user: str = SUPERUSER, password: str | None = None) -> str:
        """A ``postgresql://`` URI over 127.0.0.1 (password required), with ``password`` in it when given."""
        auth = user if password is None else f"{user}:{password}"
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{dbname}"

    def execute(self, sql: str, dbname: str = "postgres") -> list[tuple[object, ...]]:
        """Run ``sql`` as the superuser in autocommit; its rows ([] when it returns none)."""
        import psycopg

        with psycopg.connect(self.dsn(dbname), autocommit=True) as conn:
            cur = conn.execute(sql)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def create_database(self, name: str | None = None) -> str:
        """Create an empty database (from template0); its name."""
        name = name or f"t{os.getpid()}_{next(self._names)}"
        self.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return name

    def drop_database(self, name: str) -> None:
        """Drop ``name``, ending its connections first (WITH (FORCE)); no error when it is gone."""
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def create_role(self, name: str, password: str, *, database: str | None = None) -> None:
        """A login role with ``password`` (scram-sha-256 over TCP), owning ``database`` when given."""
        self.execute(f"CREATE ROLE \"{name}\" LOGIN PASSWORD '{password}'")
        if database:
            self.execute(f'ALTER DATABASE "{database}" OWNER TO "{name}"')
            self.execute(f'ALTER SCHEMA public OWNER TO "{name}"', dbname=database)


@dataclasses.dataclass
class PgDatabase:
    """A database of its own for one test: ``name``, ``dsn`` (Unix socket, superuser), ``cluster``."""

    cluster: PgCluster
    name: str

    @property
    def dsn(self) -> str:
        return self.cluster.dsn(self.name)

    def execute(self, sql: str) -> list[tuple[object, ...]]:
        return self.cluster.execute(sql, self.name)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """This worker's PostgreSQL cluster, started on first use, stopped at the end of the session."""
    from environment import unavailable  # here: the benchmarks import this module outside pytest

    bindir = find_bindir()
    if bindir is None:
        unavailable("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb, no initdb on PATH): "
                    "apt-get install postgresql")
    cluster = PgCluster(bindir)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_db(pg_cluster: PgCluster) -> Iterator[PgDatabase]:
    """An empty database for this test, dropped after it."""
    db = PgDatabase(pg_cluster, pg_cluster.create_database())
    try:
        yield db
    finally:
        pg_cluster.drop_database(db.name)
