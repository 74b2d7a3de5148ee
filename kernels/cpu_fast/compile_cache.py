"""Every cached numba kernel of zinfer runs the code numba's on-disk cache holds, on the
run that fills the cache as on every later one.

Why: numba runs the code it has just compiled differently from the same code loaded from
its cache. In the compiling process a parallel kernel's body (and an njit callee such as
cpu_ops.softmax_) runs from the body's own LLVM module; a process that loads the cache
runs the caller's copy, optimized a second time, and fastmath's `reassoc` lets the two
round differently. So cpu-fast's first run after an empty cache gave other greedy ids
than every later run (#16).

How: `route_compiles()`, which the cpu-fast device calls when it is built (never an
import: it changes numba for the whole process), wraps numba's `Dispatcher.compile`. When
a kernel of zinfer.kernels with `cache=True` meets a signature that is neither compiled
here nor in the cache, a helper process (a python3 running this module's main(), started
on the first such kernel and kept until this process exits) compiles it and writes it to
the cache, and this process then loads it from there, as later runs will. Only what a run
needs is compiled, once per cache key (code_cache.numba_dir); a warm cache starts no
helper. If the helper cannot start or fails on a kernel, this process compiles that
kernel itself, as numba would, with a warning: never a dead start.

While the helper compiles, stderr says so: FIRST_COMPILE_NOTE when it starts, then a line
every PROGRESS_EVERY_S with the seconds spent compiling, the kernels done and the one in
hand, and the total once it has been idle for QUIET_S (`_Progress`).

This reads numba's cache through private API (Dispatcher.compile, Cache._index_key,
IndexDataCacheFile._load_index, caching.NullCache, sigutils.normalize_signature), the same
from numba 0.60 to 0.68 (pyproject.toml pins that range). Where it has moved, the kernels
compile in this process with a warning, as numba alone would.
"""

from __future__ import annotations

import atexit
import importlib
import os
import pickle
import subprocess
import sys
import threading
import time
from typing import IO, Any

import structlog
from numba.core import sigutils
from numba.core.caching import NullCache
from numba.core.dispatcher import Dispatcher

from zinfer.kernels.cpu_fast import code_cache

log = structlog.get_logger("zinfer.kernels")

IN_PROCESS_ENV = "ZINFER_COMPILE_IN_PROCESS"  # set (the helper sets it for itself): numba compiles as it always does
KERNEL_MODULES = "zinfer.kernels."
FIRST_COMPILE_NOTE = "zinfer: compiling cpu-fast kernels once (20-30 s); later runs start from cache"
PROGRESS_EVERY_S = 5.0  # a progress line on stderr this often while a kernel compiles
QUIET_S = 3.0  # the helper idle this long after a compile: the total goes out

_lock = threading.Lock()  # one request at a time on the helper's pipes
_helper: "_Helper | None" = None
_helper_broken = False  # it failed once: every later kernel compiles in this process


def route_compiles() -> None:
    """Wrap numba's Dispatcher.compile so that zinfer kernels missing from the cache are
    compiled by the helper process and loaded from the cache. Idempotent; does nothing
    when IN_PROCESS_ENV is set."""
    if os.environ.get(IN_PROCESS_ENV) or getattr(Dispatcher.compile, "zinfer_routed", False):
        return
    numba_compile = Dispatcher.compile

    def compile(self: Any, sig: Any) -> Any:
        if _needs_compiling(self, sig) and _compile_in_helper(self, sig) and _needs_compiling(self, sig):
            log.warning(
                "kernel compiled in this process: the helper cached it but its entry is gone",
                kernel=self.py_func.__qualname__,
            )
        return numba_compile(self, sig)  # now a cache hit, unless the helper failed

    setattr(compile, "zinfer_routed", True)  # noqa: B010 (a function attribute mypy cannot see)
    compile.__doc__ = numba_compile.__doc__
    setattr(Dispatcher, "compile", compile)  # noqa: B010 (numba's method, replaced on purpose)


def _needs_compiling(dispatcher: Any, sig: Any) -> bool:
    """Whether `dispatcher` is a cached zinfer kernel that would compile `sig` here: not
    compiled in this process yet and not in the on-disk cache."""
    py_func = getattr(dispatcher, "py_func", None)
    cache = getattr(dispatcher, "_cache", None)
    if py_func is None or cache is None or isinstance(cache, NullCache):
        return False
    if not py_func.__module__.startswith(KERNEL_MODULES):
        return False
    try:
        args, _ = sigutils.normalize_signature(sig)  # type: ignore[no-untyped-call]  # numba's, untyped
        if tuple(args) in dispatcher.overloads:
            return False
        # numba's own index lookup, without loading the entry (that is numba's compile's job)
        key = cache._index_key(sig, dispatcher.targetctx.codegen())
        return key not in cache._cache_file._load_index()
    except Exception as exc:  # numba's private cache API moved: compile as numba always did
        log.warning(
            "cannot read numba's cache index; kernels compile in this process",
            kernel=py_func.__qualname__,
            error=f"{type(exc).__name__}: {exc}",
        )
        return False


def _compile_in_helper(dispatcher: Any, sig: Any) -> bool:
    """Have the helper compile dispatcher's `sig` into the cache: True when it did; on any
    failure warn and leave it to this process (numba's compile then compiles it here)."""
    global _helper, _helper_broken
    name = f"{dispatcher.py_func.__module__}.{dispatcher.py_func.__qualname__}"
    with _lock:
        if _helper_broken:
            return False
        try:
            if _helper is None or _helper.owner != os.getpid():  # none yet, or a forked parent's
                _helper = _Helper()
            _helper.progress.begin(name.removeprefix(KERNEL_MODULES))
            try:
                error = _helper.compile(dispatcher.py_func.__module__, dispatcher.py_func.__qualname__, sig)
            finally:
                _helper.progress.end()
        except Exception as exc:  # no helper, a dead one, a signature that does not pickle
            _helper_broken = True
            error = (
                f"helper process failed ({type(exc).__name__}: {exc}); "
                "every kernel compiles in this process from now on"
            )
        if error is not None:
            log.warning(
                "kernel compiled in this process: this run's numbers may differ from later runs'",
                kernel=name,
                error=error,
            )
        return error is None


class _Helper:
    """The helper process and its pipes: pickled (module, qualname, signature) requests
    in, a pickled None (compiled and cached) or error text out."""

    def __init__(self) -> None:
        print(FIRST_COMPILE_NOTE, file=sys.stderr, flush=True)
        self.progress = _Progress()
        # the helper's numba caches where this process's kernels do
        env = {**os.environ, IN_PROCESS_ENV: "1", "NUMBA_CACHE_DIR": str(code_cache.numba_dir())}
        serve = "from zinfer.kernels.cpu_fast.compile_cache import main; main()"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", serve],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self.requests: IO[bytes] = _pipe(self.proc.stdin)
        self.replies: IO[bytes] = _pipe(self.proc.stdout)
        self.owner = os.getpid()  # a forked child must not share these pipes, nor end the helper
        atexit.register(self.close)

    def compile(self, module: str, qualname: str, sig: Any) -> str | None:
        """None once the helper has `sig` of module.qualname in the cache, else its error."""
        pickle.dump((module, qualname, sig), self.requests)
        self.requests.flush()
        reply: str | None = pickle.load(self.replies)  # EOFError when the helper died
        return reply

    def close(self) -> None:
        """Close the helper's input, only in the process that started it: it finishes the
        kernel it is compiling (a background one, such as the decode tape's replay, may
        outlast a short run), writes it to the cache and exits. Not waited for, and never
        killed: a kill mid-write left the cache without that kernel, and the next run
        compiled it in its own process, with other numbers."""
        if self.owner != os.getpid():
            return
        try:
            self.requests.close()
        except OSError:  # already gone
            pass


def _pipe(stream: IO[bytes] | None) -> IO[bytes]:
    """A pipe Popen was asked for (PIPE), as the stream it is."""
    assert stream is not None
    return stream


class _Progress:
    """Tells stderr how the helper's compiles go. While the first run of compiles lasts
    (the one a new cache makes before the first answer), a line every PROGRESS_EVERY_S:
    `zinfer: compiling cpu-fast kernels: 15 s, 6 done, now cpu_ops._glu`; once the helper
    has been idle for QUIET_S, the total: `zinfer: compiled 8 cpu-fast kernels in 10 s`.
    Later compiles (the decode graph's replay, a new batch shape) run while the answer
    streams, so they are counted quietly and told at exit, with the one still in hand
    (it finishes in the background). Seconds are those spent compiling. begin() and end()
    bracket each compile; a daemon thread prints the first run's lines."""

    def __init__(self) -> None:
        self.done = 0
        self.busy_s = 0.0  # compiling, finished compiles only
        self.current: str | None = None
        self.began = 0.0  # when `current` began
        self.ended = 0.0  # when the last compile ended
        self.told_total = True  # nothing to total yet
        self.last_line = time.monotonic()  # FIRST_COMPILE_NOTE's
        self.owner = os.getpid()
        self._cond = threading.Condition()
        threading.Thread(target=self._run, name="zinfer-compile-progress", daemon=True).start()
        atexit.register(self._at_exit)

    def begin(self, name: str) -> None:
        with self._cond:
            self.current, self.began = name, time.monotonic()
            self.told_total = False
            self._cond.notify()

    def end(self) -> None:
        with self._cond:
            self.ended = time.monotonic()
            self.busy_s += self.ended - self.began
            self.done += 1
            self.current = None
            self._cond.notify()

    def _seconds(self, now: float) -> float:
        return self.busy_s + (now - self.began if self.current is not None else 0.0)

    def _run(self) -> None:
        """The first run of compiles' lines, until its total."""
        with self._cond:
            while True:
                now = time.monotonic()
                if self.current is not None:
                    if now - self.last_line >= PROGRESS_EVERY_S:
                        seconds = self._seconds(now)
                        done = f"{self.done} done, now {self.current}"
                        _say(f"zinfer: compiling cpu-fast kernels: {seconds:.0f} s, {done}")
                        self.last_line = now
                    self._cond.wait(PROGRESS_EVERY_S - (now - self.last_line))
                elif not self.told_total and now - self.ended >= QUIET_S:
                    _say(self._total())
                    self.told_total = True
                    return
                else:
                    self._cond.wait(None if self.told_total else QUIET_S - (now - self.ended))

    def _total(self) -> str:
        kernels = f"{self.done} cpu-fast kernel{'s' * (self.done != 1)}"
        return f"zinfer: compiled {kernels} in {self.busy_s:.0f} s; later runs start from cache"

    def _at_exit(self) -> None:
        if self.owner != os.getpid():
            return
        with self._cond:
            if self.current is not None:
                seconds = self._seconds(time.monotonic())
                _say(
                    f"zinfer: compiled {self.done} cpu-fast kernels in {seconds:.0f} s; "
                    f"{self.current} finishes compiling in the background"
                )
            elif not self.told_total:
                _say(self._total())
            self.told_total = True


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr closed
        pass


def _kernel(module: str, qualname: str) -> Any:
    """The numba dispatcher defined in `module` whose function is named `qualname`."""
    for value in vars(importlib.import_module(module)).values():
        if isinstance(value, Dispatcher) and value.py_func.__qualname__ == qualname:
            return value
    raise LookupError(f"no numba kernel {qualname} in {module}")


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """The helper's loop: compile each requested kernel signature (numba writes it to the
    cache) until `requests` ends; reply None or the error."""
    while True:
        try:
            module, qualname, sig = pickle.load(requests)
        except EOFError:
            return
        try:
            _kernel(module, qualname).compile(sig)
            reply = None
        except Exception as exc:  # reported to the parent, which then compiles it itself
            reply = f"{type(exc).__name__}: {exc}"
        try:
            pickle.dump(reply, replies)
            replies.flush()
        except BrokenPipeError:  # the parent has exited (close): its kernel is cached all the same
            return


def main() -> None:
    """Serve on the original stdout; anything else written to stdout goes to stderr."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.stdin.buffer, replies)
