"""The local record of submitted jobs: SQLite (WAL) under ``$DDPJOB_HOME`` (default ``~/.ddpjob``).

Submission is two-phase: ``reserve`` inserts the job (state PENDING, no handle) and returns its
id; the target submits; ``record_handle`` stores what the target needs to find the job again.
A crash in between leaves a visible job without a handle, never a ghost. Terminal states are
never downgraded (enforced in SQL). Several ``ddpjob`` processes may use one registry at once.

The home is private to the user (0700, the database 0600): specs and plans may carry secrets, and
the spec stored here has the values of secret-looking variables masked (``launcher.spec.secrets``).
A home that cannot be used (read-only, a file in its path, a full disk) is ``HomeUnusable``.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.core.errors import HomeUnusable, JobNotFound
from launcher.core.home import ddpjob_home
from launcher.core.states import TERMINAL, JobState
from launcher.service.records import JobRecord as JobRecord  # the registry's row, named here as before
from launcher.service.records import JobShape
from launcher.spec.secrets import mask_spec

if TYPE_CHECKING:
    import sqlite3

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    target      TEXT NOT NULL,
    state       TEXT NOT NULL,
    spec_json   TEXT NOT NULL,
    handle_json TEXT,
    run_dir     TEXT NOT NULL,
    port        INTEGER,
    message     TEXT NOT NULL DEFAULT '',
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    ended_at    REAL,
    started_at  REAL,
    shape_json  TEXT,
    origin_json TEXT
);
CREATE INDEX IF NOT EXISTS jobs_created ON jobs(created_at);
"""
_ADDED_COLUMNS = {"shape_json": "ALTER TABLE jobs ADD COLUMN shape_json TEXT",
                  "origin_json": "ALTER TABLE jobs ADD COLUMN origin_json TEXT",
                  "started_at": "ALTER TABLE jobs ADD COLUMN started_at REAL"}
_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"  # no 0/o, 1/l: ids are read aloud and typed
_TERMINAL_SQL = tuple(s.value for s in TERMINAL)
# Below this many free bytes a read would fail on a full disk (SQLite grows the WAL's -shm index to
# 32 KiB): the registry is read without that index (Registry._read_only).
_ROOM_TO_WRITE = 64 * 1024


@contextmanager
def _setup_lock(db: Path) -> Iterator[None]:
    """One process at a time sets the database up (WAL mode, tables): SQLite answers two that do it
    at once with "database is locked" at once, without waiting (seen with two submits on a new home)."""
    import fcntl

    fd = os.open(f"{db}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class Registry:
    """Job records in ``<home>/registry.db``; one short-lived connection per operation."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or ddpjob_home()
        self.path = self.home / "registry.db"
        self._ready = False

    def runs_dir(self) -> Path:
        return self.home / "runs"

    def _prepare(self) -> None:
        """Create the home and the database private to the user, and make older ones private."""
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        _private(self.home, 0o700)
        _private(self.runs_dir(), 0o700)  # made by the first submit; here only an older one is made private
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))  # SQLite gives -wal/-shm the same mode
        for suffix in ("", "-wal", "-shm"):
            _private(Path(f"{self.path}{suffix}"), 0o600)

    @contextmanager
    def _connect(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        import sqlite3  # here, not at the top: render and --help never open the registry

        try:
            with self._connection(write) as conn:
                yield conn
        except (OSError, sqlite3.OperationalError) as e:
            raise HomeUnusable(str(self.home), _cause(e, self.home)) from e
        except sqlite3.DatabaseError as e:
            if type(e) is not sqlite3.DatabaseError:  # integrity, programming errors: ddpjob's own bugs
                raise
            raise HomeUnusable(str(self.home), f"{self.path}: {e}") from e

    def _full(self) -> bool:
        """Whether the registry's disk has no room left (and a database with its tables is there to be
        read: a new home on a full disk is refused as before)."""
        try:
            fs = os.statvfs(self.home)
            return fs.f_bavail * fs.f_frsize < _ROOM_TO_WRITE and self.path.stat().st_size > 0
        except OSError:
            return False

    @contextmanager
    def _read_only(self) -> Iterator[sqlite3.Connection]:
        """A reading connection that needs no new byte on disk: in EXCLUSIVE locking mode SQLite
        keeps the WAL index in its own memory, not in the -shm file (it holds the database's lock
        until the connection closes: one short read). Not ``mode=ro``: a read-only connection to a
        WAL database needs the -shm file all the same."""
        import sqlite3

        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA locking_mode=EXCLUSIVE")
            yield conn
        finally:
            conn.close()

    @contextmanager
    def _connection(self, write: bool) -> Iterator[sqlite3.Connection]:
        import sqlite3

        if not write and self._full():
            with self._read_only() as conn:
                yield conn
            return
        if not self._ready:
            self._prepare()
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA busy_timeout=30000")
            if not self._ready:
                with _setup_lock(self.path):
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.executescript(_SCHEMA)
                    have = {r[1] for r in conn.execute("PRAGMA table_info(jobs)")}
                    for column, sql in _ADDED_COLUMNS.items():  # a registry written before they were recorded
                        if column not in have:
                            conn.execute(sql)
                self._ready = True
            if write:
                # IMMEDIATE takes the write lock up front: read-then-write (id, port) stays atomic.
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            else:
                yield conn
        finally:
            conn.close()

    def reserve(
        self,
        name: str,
        target: str,
        spec: dict[str, object],
        *,
        port: int | None = None,
        port_picker: Callable[[set[int]], int] | None = None,
        origin: dict[str, object] | None = None,
    ) -> tuple[str, int | None]:
        """Phase one: insert a PENDING job with a new id (and, for targets that need one, a port).

        Args:
            port: a port the job will use (the spec's ``master_port``), recorded so that other jobs
                of this machine avoid it.
            port_picker: returns a port free on this machine and not in the ports of live jobs it is
                given; called inside the same transaction as the insert, so two submits at the same
                moment never get the same port.
            origin: where the spec came from (``launcher.service.origin``; names, never values).
        Returns:
            (job id, the port recorded or None).
        """
        import secrets  # (hashlib and random with it: not on the path of render, list or status)
        import sqlite3

        now = time.time()
        with self._connect(write=True) as conn:
            if port is None and port_picker is not None:
                busy = _busy_ports(conn)
                port = port_picker(busy)
            for _ in range(20):
                job_id = f"{name}-{''.join(secrets.choice(_ALPHABET) for _ in range(5))}"
                run_dir = str(self.runs_dir() / job_id)
                try:
                    conn.execute(
                        "INSERT INTO jobs (id, name, target, state, spec_json, run_dir, port, created_at, updated_at,"
                        " origin_json) VALUES (:id, :name, :target, :state, :spec, :run_dir, :port, :now, :now, :origin)",
                        {"id": job_id, "name": name, "target": target, "state": JobState.PENDING.value,
                         "spec": json.dumps(mask_spec(spec), sort_keys=True), "run_dir": run_dir, "port": port,
                         "now": now, "origin": json.dumps(origin, sort_keys=True) if origin else None},
                    )
                    return job_id, port
                except sqlite3.IntegrityError:
                    continue
        raise RuntimeError("could not allocate a unique job id after 20 tries")

    def reassign_port(self, job_id: str, port_picker: Callable[[set[int]], int]) -> int:
        """A new rendezvous port for a live job whose port was taken by another program before the
        rendezvous; chosen and recorded in one transaction, like ``reserve``."""
        with self._connect(write=True) as conn:
            busy = _busy_ports(conn)
            port = port_picker(busy)
            conn.execute("UPDATE jobs SET port = :port WHERE id = :id", {"port": port, "id": job_id})
        return port

    def release(self, job_id: str) -> None:
        """Take back a reservation that was never submitted (its plan failed): no trace is left."""
        with self._connect(write=True) as conn:
            conn.execute("DELETE FROM jobs WHERE id = :id AND handle_json IS NULL", {"id": job_id})

    def delete(self, job_id: str) -> None:
        """Forget a job (``ddpjob rm``); the caller removes its files."""
        with self._connect(write=True) as conn:
            conn.execute("DELETE FROM jobs WHERE id = :id", {"id": job_id})

    def record_handle(self, job_id: str, handle: dict[str, object], shape: JobShape | None = None) -> None:
        """Phase two: what the target returned, so later shells can find the job, and the shape of
        the plan (``runs``, ``nodes``, ``procs_per_node``) that ``logs`` and ``cancel`` check against."""
        with self._connect(write=True) as conn:
            conn.execute(
                "UPDATE jobs SET handle_json = :h, shape_json = COALESCE(:shape, shape_json), updated_at = :now"
                " WHERE id = :id",
                {"h": json.dumps(handle, sort_keys=True), "now": time.time(), "id": job_id,
                 "shape": json.dumps(shape.to_json(), sort_keys=True) if shape else None},
            )

    def update_state(self, job_id: str, state: JobState, message: str | None = None, *,
                     started: float | None = None, ended: float | None = None) -> None:
        """Move a job to ``state`` unless it is already terminal (terminal states are final), with when it
        started and, in a terminal state, ended as its target records them: an end it does not say is now."""
        now = time.time()
        with self._connect(write=True) as conn:
            conn.execute(
                "UPDATE jobs SET state = :state, message = COALESCE(:msg, message), updated_at = :now,"
                " started_at = COALESCE(:started, started_at),"
                " ended_at = CASE WHEN :terminal THEN COALESCE(ended_at, :ended, :now) ELSE ended_at END"
                f" WHERE id = :id AND state NOT IN ({','.join(f':t{i}' for i in range(len(_TERMINAL_SQL)))})",
                {"state": state.value, "msg": message, "now": now, "terminal": state in TERMINAL, "id": job_id,
                 "started": started, "ended": ended, **{f"t{i}": v for i, v in enumerate(_TERMINAL_SQL)}},
            )

    def note_state(self, rec: JobRecord, state: JobState, message: str | None = None, *,
                   started: float | None = None, ended: float | None = None) -> JobRecord:
        """``update_state``, then the record as stored; where the home takes no write (a full disk),
        the record with that state in memory only: status and list still answer, and the next call
        with room stores it."""
        try:
            self.update_state(rec.id, state, message, started=started, ended=ended)
        except HomeUnusable:
            if rec.state.terminal:
                return rec
            import dataclasses

            return dataclasses.replace(rec, state=state, message=rec.message if message is None else message,
                                       started_at=started or rec.started_at,
                                       ended_at=(ended or time.time()) if state.terminal else None)
        return self.get(rec.id)

    def get(self, job_id: str) -> JobRecord:
        """The job with this id, or with an id that starts with it when only one does.

        Raises:
            JobNotFound: no such job, an empty or blank id (never a prefix of everything), or a
                prefix shared by several jobs (they are listed).
        """
        if not job_id.strip():
            raise JobNotFound(job_id)
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is not None:
                return _record(row)
            prefixed = [r[0] for r in conn.execute(
                "SELECT id FROM jobs WHERE substr(id, 1, :n) = :prefix ORDER BY created_at DESC LIMIT 11",
                {"n": len(job_id), "prefix": job_id})]
            if len(prefixed) == 1:
                row = conn.execute("SELECT * FROM jobs WHERE id = ?", (prefixed[0],)).fetchone()
                if row is not None:
                    return _record(row)
            ids = [] if prefixed else [r[0] for r in conn.execute("SELECT id FROM jobs ORDER BY created_at DESC LIMIT 500")]
        if len(prefixed) > 1:
            raise JobNotFound(job_id, prefixed[:10] + (["..."] if len(prefixed) > 10 else []), ambiguous=True)
        import difflib

        raise JobNotFound(job_id, difflib.get_close_matches(job_id, ids, n=3, cutoff=0.6))

    def list(self, limit: int | None = None, target: str | None = None, *, states: Iterable[JobState] = (),
             name: str | None = None) -> list[JobRecord]:
        """Jobs, newest first: of ``target``, in one of ``states``, with a name matching the glob
        ``name`` (``sweep-*``), when given."""
        sql = "SELECT * FROM jobs WHERE 1 = 1"
        params: dict[str, object] = {}
        if target:
            sql += " AND target = :target"
            params["target"] = target
        wanted = sorted({s.value for s in states})
        if wanted:
            sql += f" AND state IN ({','.join(f':s{i}' for i in range(len(wanted)))})"
            params.update({f"s{i}": v for i, v in enumerate(wanted)})
        if name:
            sql += " AND name GLOB :name"
            params["name"] = name
        sql += " ORDER BY created_at DESC, id"
        if limit:
            sql += " LIMIT :limit"
            params["limit"] = limit
        with self._connect() as conn:
            return [_record(r) for r in conn.execute(sql, params)]


def _record(row: sqlite3.Row) -> JobRecord:
    return JobRecord(
        id=row["id"], name=row["name"], target=row["target"], state=JobState.parse(row["state"]),
        spec=json.loads(row["spec_json"]), handle=json.loads(row["handle_json"]) if row["handle_json"] else None,
        run_dir=row["run_dir"], port=row["port"], message=row["message"], created_at=row["created_at"],
        updated_at=row["updated_at"], ended_at=row["ended_at"],
        shape=JobShape.from_json(json.loads(row["shape_json"])) if row["shape_json"] else None,
        origin=json.loads(row["origin_json"]) if row["origin_json"] else None,
        # A registry from before started_at, read without a write (a full disk): its column is not added yet.
        started_at=row["started_at"] if "started_at" in row.keys() else None,  # noqa: SIM118 - a Row's `in` looks at values
    )


def _private(path: Path, mode: int) -> None:
    """Take group and others' bits off ``path`` (ddpjob's own files; someone else's are left)."""
    st = path.stat() if path.exists() else None
    if st is not None and st.st_mode & 0o077:
        try:
            os.chmod(path, stat.S_IMODE(st.st_mode) & mode)
        except PermissionError:
            pass


def _cause(e: BaseException, home: Path) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror if not e.filename or str(e.filename) == str(home) else f"{e.filename}: {e.strerror}"
    return str(e)


def _busy_ports(conn: sqlite3.Connection) -> set[int]:
    """The rendezvous ports recorded for jobs that have not ended."""
    sql = f"SELECT port FROM jobs WHERE port IS NOT NULL AND state NOT IN ({','.join('?' * len(_TERMINAL_SQL))})"
    return {r[0] for r in conn.execute(sql, _TERMINAL_SQL)}
