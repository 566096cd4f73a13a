"""Faults injected on purpose, to prove that training survives them.

``TOKENMILL_FAULT="SIGNAL@POINT=STEP"`` or ``"SIGNAL@POINT=STEP,rank=R"`` makes rank R
(default 0) send itself SIGNAL (a name: SIGKILL, SIGSTOP, ...) at a precise point:

- ``step=N``: right after optimizer step N;
- ``checkpoint=N``: while checkpoint N is being written in the background, after its files
  are written and before it is published (``checkpoint.async_save``).

Only the first attempt of a job is hit (``TORCHELASTIC_RESTART_COUNT`` 0 or unset), so a job
restarted by ``--max-restarts`` runs on. Unset, every hook is a dictionary look-up.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from tokenmill.errors import ConfigError

FAULT_ENV = "TOKENMILL_FAULT"
POINTS = ("step", "checkpoint")


@dataclass(frozen=True)
class Fault:
    signal: signal.Signals
    point: str
    step: int
    rank: int = 0


def parse_fault(text: str) -> Fault:
    """``SIGKILL@step=3,rank=1`` -> Fault; ConfigError naming the variable otherwise."""
    try:
        name, _, where = text.partition("@")
        fields = dict(part.split("=", 1) for part in where.split(","))
        point = next(p for p in fields if p != "rank")
        fault = Fault(signal.Signals[name.strip()], point, int(fields[point]), int(fields.get("rank", 0)))
    except (KeyError, ValueError, StopIteration):
        raise ConfigError(
            f"{FAULT_ENV}={text!r}: expected SIGNAL@POINT=STEP[,rank=R], e.g. SIGKILL@step=3,rank=1"
        ) from None
    if fault.point not in POINTS:
        raise ConfigError(f"{FAULT_ENV}={text!r}: the point must be one of {', '.join(POINTS)}")
    return fault


def _active() -> Fault | None:
    text = os.environ.get(FAULT_ENV)
    if not text or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return None
    return parse_fault(text)


def inject(point: str, step: int) -> None:
    """Send this process the configured signal if ``point`` at ``step`` is the fault's."""
    fault = _active()
    if fault is not None and fault.point == point and fault.step == step:
        if int(os.environ.get("RANK", "0")) == fault.rank:
            os.kill(os.getpid(), fault.signal)
