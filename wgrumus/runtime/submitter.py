"""A CPU adapter's submission thread: replayed steps handed over in order, so the host runs ahead.

On a CPU adapter ``queue.submit`` runs the kernels in the calling thread, so a replayed step
would cost the host its whole device time. Replays hand their queue work to this per-device
thread (at most ``DEPTH`` ahead; small host writes queue behind them), and every other queue
operation of the device first ``drain``s it, so the queue sees the work in program order and
pooled buffers are reused safely. A job's failure is raised by the next ``put`` or ``drain`` and
the jobs behind it are dropped. Host waits time out after ``TIMEOUT`` s (``SubmitTimeout``).
"""
from __future__ import annotations

import atexit
import collections
import os
import threading

from .errors import SubmitTimeout

DEPTH = 8  # jobs queued at most (a replayed step is one job)
TIMEOUT = float(os.environ.get("WGRUMUS_SUBMIT_TIMEOUT", 600))


class Submitter:
    def __init__(self, name: str, depth: int = DEPTH, timeout: float | None = None):
        self.name, self.depth = name, depth
        self.timeout = TIMEOUT if timeout is None else timeout
        self._cv = threading.Condition()
        self._jobs: collections.deque = collections.deque()
        self._busy = False  # a job is running
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.queued_max = 0  # the most jobs waiting at once (tests, benchmarks)

    def busy(self) -> bool:
        """Jobs queued or running (or a failure not raised yet)."""
        with self._cv:
            return bool(self._jobs) or self._busy or self._error is not None

    def put(self, fn, *args) -> None:
        """Queue ``fn(*args)`` behind the jobs already queued (waits while ``depth`` are)."""
        with self._cv:
            self._raise()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"wgrumus-submit:{self.name}")
                self._thread.start()
                atexit.register(self._at_exit)
            self._wait(lambda: len(self._jobs) < self.depth or self._error is not None,
                       f"a queue slot (the {self.depth} queued jobs did not start)")
            self._raise()
            self._jobs.append((fn, args))
            self.queued_max = max(self.queued_max, len(self._jobs))
            self._cv.notify_all()

    def drain(self) -> None:
        """Wait until every queued job has run; raise the first failure among them."""
        if not self.busy() or threading.current_thread() is self._thread:
            return
        with self._cv:
            self._wait(lambda: not self._jobs and not self._busy, "the queued work to finish")
            self._raise()

    def _at_exit(self) -> None:
        """Queued steps finish before the interpreter tears wgpu down under the thread."""
        try:
            self.drain()
        except Exception:  # noqa: BLE001 - reported to the host already, or nobody to tell
            pass

    def _wait(self, ready, what: str) -> None:
        if not self._cv.wait_for(ready, self.timeout):
            raise SubmitTimeout(
                f"the submission thread of {self.name} did not finish in {self.timeout:g} s "
                f"while waiting for {what} ({len(self._jobs)} jobs queued, one running: "
                f"{self._busy}): a kernel that does not end, or steps slower than that; set "
                "WGRUMUS_SUBMIT_TIMEOUT (seconds) higher for slow steps")

    def _raise(self) -> None:
        err, self._error = self._error, None
        if err is not None:
            raise RuntimeError(f"replayed work queued on {self.name} failed in its submission "
                               f"thread: {err!r}") from err

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._jobs)
                self._busy = True  # before the job leaves the queue: busy() never sees neither
                fn, args = self._jobs.popleft()
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - raised in the host thread
                with self._cv:
                    self._error = e
                    self._jobs.clear()  # later work would build on the failed step
            finally:
                fn = args = None  # the job's buffers are dropped here, not at the next job
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()
