"""A run's claim on its output folder: ``OUTPUT/.lock``, taken before any work, so that two runs
never write, delete or publish in one folder at once (docs/outputs.md, "One run per folder").

The lock is a small JSON object naming the run (id, host, process, start time, command). It is
created only where none exists, and taken over only from a holder that is proven gone:

* on a local disk the launcher holds an OS lock (``flock``) on the file for the whole run; the
  kernel drops it when the process ends, however it ends, so a lock file that nobody holds is
  left by a dead run and is taken over at once;
* on ``gs://`` the object is written with the precondition "no live generation" and removed with
  "this generation", so of two runs exactly one creates it; a lock older than
  ``stale_after_s`` (a job that died without releasing it) is taken over by replacing exactly
  the generation that was read, so two runs cannot both take over the same stale lock.

Before ``manifest.json`` is written the job checks that the lock still names its run
(``check_owner``): a run that lost its folder never publishes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import socket
import time

LOCK_NAME = ".lock"
GCS_PREFIX = "gs://"
STALE_AFTER_S = 72 * 3600  # a gs:// lock this old is taken to be left by a job that died


class OutputBusy(ValueError):
    """Another run holds the output folder (or took it over from this one)."""


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds an output folder: enough for a person to find the run and decide."""

    run_id: str
    host: str
    pid: int
    started: float  # seconds since the epoch
    command: str

    @classmethod
    def this_run(cls, run_id: str, command: str) -> Holder:
        return cls(run_id, socket.gethostname(), os.getpid(), time.time(), command)

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode("utf-8") + b"\n"

    @classmethod
    def decode(cls, data: bytes) -> Holder | None:
        """The holder a lock file names, or None for one that is empty or not ours (a run that
        died between creating the file and writing it)."""
        try:
            fields = json.loads(data.decode("utf-8"))
            return cls(str(fields["run_id"]), str(fields["host"]), int(fields["pid"]),
                       float(fields["started"]), str(fields["command"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        return (f"run {self.run_id}, started {started} on {self.host} (process {self.pid}): "
                f"{self.command}")


def lock_path(output_dir: str) -> str:
    return output_dir.rstrip("/") + "/" + LOCK_NAME


def _busy(output_dir: str, holder: Holder | None, how: str) -> OutputBusy:
    who = holder.describe() if holder else "a run whose lock is being written"
    return OutputBusy(f"{output_dir} is being written by another run ({who}); wait for it to "
                      f"finish or choose another --output. {how}")


class OutputLock:
    """A held lock; ``release`` gives it up (once; later calls do nothing)."""

    def __init__(self, output_dir: str, holder: Holder, release: contextlib.ExitStack):
        self.output_dir = output_dir
        self.holder = holder
        self._release = release

    def release(self) -> None:
        self._release.close()

    def __enter__(self) -> OutputLock:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


def acquire(output_dir: str, holder: Holder, stale_after_s: float = STALE_AFTER_S
            ) -> OutputLock:
    """Takes the lock on ``output_dir`` (local or gs://) for ``holder`` or raises OutputBusy."""
    release = contextlib.ExitStack()
    if output_dir.startswith(GCS_PREFIX):
        _acquire_gcs(output_dir, holder, stale_after_s, release)
    else:
        _acquire_local(output_dir, holder, release)
    return OutputLock(output_dir, holder, release)


def read_holder(output_dir: str) -> Holder | None:
    """The run that holds ``output_dir`` now, or None."""
    if output_dir.startswith(GCS_PREFIX):
        blob = _blob(lock_path(output_dir))
        try:
            return Holder.decode(blob.download_as_bytes())
        except _not_found():
            return None
    try:
        with open(lock_path(output_dir), "rb") as handle:
            return Holder.decode(handle.read())
    except FileNotFoundError:
        return None


def check_owner(output_dir: str, run_id: str) -> None:
    """Raises OutputBusy unless ``run_id`` still holds ``output_dir``: the last check before a
    run publishes its manifest."""
    holder = read_holder(output_dir)
    if holder is None or holder.run_id != run_id:
        raise _busy(output_dir, holder, f"This run ({run_id}) lost its lock and does not write "
                                        "manifest.json.")


def release_if_held(_: object, output_dir: str, run_id: str) -> None:
    """Gives up ``run_id``'s lock from inside the job, its last step on a remote runner (whose
    launcher has exited): only a lock that still names this run is removed."""
    if output_dir.startswith(GCS_PREFIX):
        from google.api_core.exceptions import PreconditionFailed

        blob = _blob(lock_path(output_dir))
        with contextlib.suppress(_not_found(), PreconditionFailed):
            blob.reload()
            generation = blob.generation
            holder = Holder.decode(blob.download_as_bytes(if_generation_match=generation))
            if holder is not None and holder.run_id == run_id:
                blob.delete(if_generation_match=generation)
        return
    holder = read_holder(output_dir)
    if holder is not None and holder.run_id == run_id:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_path(output_dir))


# --------------------------------------------------------------------------- local disk

def _acquire_local(output_dir: str, holder: Holder, release: contextlib.ExitStack) -> None:
    os.makedirs(output_dir, exist_ok=True)
    path = lock_path(output_dir)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            current = Holder.decode(os.pread(fd, 65536, 0))
            os.close(fd)
            raise _busy(output_dir, current, "The lock is released when that process "
                                             "ends.") from None
        # A holder that was releasing unlinked the file we opened: lock the new one instead.
        with contextlib.suppress(FileNotFoundError):
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, holder.encode(), 0)
    os.fsync(fd)

    def unlock() -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # unlinked while still locked, so nobody locks a stale inode
        os.close(fd)

    release.callback(unlock)


# --------------------------------------------------------------------------- gs://

def _blob(path: str):  # -> google.cloud.storage.Blob
    from apache_beam.io.gcp.gcsio import GcsIO

    bucket, _, name = path[len(GCS_PREFIX):].partition("/")
    return GcsIO().client.bucket(bucket).blob(name)


def _not_found() -> type[Exception]:
    from google.api_core.exceptions import NotFound

    return NotFound


def _acquire_gcs(output_dir: str, holder: Holder, stale_after_s: float,
                 release: contextlib.ExitStack) -> None:
    from google.api_core.exceptions import PreconditionFailed

    blob = _blob(lock_path(output_dir))
    data = holder.encode()
    try:
        blob.upload_from_string(data, if_generation_match=0)
    except PreconditionFailed:
        _take_over_stale(output_dir, blob, data, stale_after_s)
    generation = blob.generation

    def unlock() -> None:
        with contextlib.suppress(PreconditionFailed, _not_found()):
            blob.delete(if_generation_match=generation)

    release.callback(unlock)


def _take_over_stale(output_dir: str, blob, data: bytes, stale_after_s: float) -> None:
    """Replaces a lock left by a run that died, exactly the generation read, or raises."""
    from google.api_core.exceptions import PreconditionFailed

    try:
        blob.reload()
        generation, updated = blob.generation, blob.updated  # a download forgets them
        current = Holder.decode(blob.download_as_bytes(if_generation_match=generation))
    except (_not_found(), PreconditionFailed):  # released or replaced meanwhile: a live run
        current = None
        stale = False
    else:
        started = current.started if current else updated.timestamp()
        stale = time.time() - started > stale_after_s
    if not stale:
        raise _busy(output_dir, current,
                    f"A lock older than {stale_after_s / 3600:g} hours is taken over; if no run "
                    f"is writing there, delete {lock_path(output_dir)}.")
    try:
        blob.upload_from_string(data, if_generation_match=generation)
    except PreconditionFailed:
        raise _busy(output_dir, None, "Another run took over the stale lock first.") from None
