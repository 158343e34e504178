"""Stopping a long command cleanly: SIGTERM (``kill``, ``timeout``, Slurm, Kubernetes) and SIGINT (Ctrl-C) end every
process the command started (FLARE's simulator, sites and POC processes included), and the command says
"interrupted" and exits with 128 + the signal's number, as a shell reports a process the signal ended.

What the run saved stays where it is (the last good global model in its workspace); the next run moves a workspace
that did not finish aside as incomplete (``flare.simulation``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

import psutil

from ..core.errors import UserError

GRACE_SECONDS = 10  # how long the started processes get to end on SIGTERM before they are killed
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class CommandInterrupted(UserError):
    """The command was stopped by a signal; the message says which and how many processes it ended."""

    def __init__(self, signal_number: int, ended: int) -> None:
        self.exit_code = 128 + signal_number
        name = signal.Signals(signal_number).name
        super().__init__(
            f"interrupted ({name}): ended the {ended} process(es) it had started; what the run saved so far is kept"
        )


class _Stop(BaseException):  # raised in the main thread by the handler; BaseException, so no `except Exception` eats it
    def __init__(self, signal_number: int) -> None:
        super().__init__(signal_number)
        self.signal_number = signal_number


def end_started_processes(grace: float = GRACE_SECONDS) -> int:
    """Terminate every descendant of this process, kill those still there after ``grace`` seconds; how many."""
    started = psutil.Process().children(recursive=True)
    for process in started:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(started, timeout=grace)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=grace)
    return len(started)


@contextlib.contextmanager
def stopped_cleanly() -> Iterator[None]:
    """Run the block; on SIGTERM or SIGINT end what it started and raise :class:`CommandInterrupted`."""

    def stop(signal_number: int, _frame: object) -> None:
        raise _Stop(signal_number)

    if threading.current_thread() is not threading.main_thread():  # only the main thread may handle signals
        yield
        return
    previous = {number: signal.signal(number, stop) for number in STOP_SIGNALS}
    try:
        yield
    except (_Stop, KeyboardInterrupt) as interruption:
        number = interruption.signal_number if isinstance(interruption, _Stop) else signal.SIGINT
        for signal_number in STOP_SIGNALS:  # a second Ctrl-C does not cut the clean-up short
            signal.signal(signal_number, signal.SIG_IGN)
        raise CommandInterrupted(number, end_started_processes()) from None
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
