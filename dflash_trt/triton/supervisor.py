"""Keep a tritonserver serving: notice a dead server or a dead model process and restart, boundedly.

tritonserver 2.51's behaviour (docs/reliability.md): when a model's Python stub dies (kill -9, OOM)
the server keeps answering ready while every new request fails ("Stub process ... is not healthy"),
and the requests in flight never get a final response. Reloading only that model (explicit model
control: unload + load) serves new requests again, but the in-flight requests still hang and
the dead model version is never released (the server's exit then times out). Restarting the server
is the only way those clients get an answer (their connection closes: a clear error, not a hang), so
that is what the supervisor does, for a dead server and a dead model process alike:

- it polls the server process and, per model, its stub processes (`TritonServer.model_processes`);
- a failure is followed by a restart after a back-off (1, 2, 4 ... 30 s, reset by 5 healthy minutes);
  more than `max_restarts` within `window_s` is fatal: `serve` exits with the reasons;
- while restarting, the server is down, so readiness (`/v2/health/ready`) follows health;
- every restart is counted: the server's model processes see `DFLASH_TRT_SERVER_RESTARTS` and report
  it as the `dflash_server_restarts_total` counter on Triton's metrics port.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from dflash_trt.errors import DFlashTrtError
from dflash_trt.triton.server import TritonServer

RESTARTS_ENV = "DFLASH_TRT_SERVER_RESTARTS"


class GaveUpError(DFlashTrtError):
    """The server kept failing: more restarts than allowed within the window."""


@dataclass
class RestartPolicy:
    max_restarts: int = 5  # within window_s; one more is fatal
    window_s: float = 600.0
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    healthy_reset_s: float = 300.0  # this long without a failure: the back-off starts over
    history: deque = field(default_factory=deque)  # monotonic times of restarts

    def delay(self, now: float) -> float:
        """Seconds to wait before the next restart; GaveUpError past the budget."""
        while self.history and now - self.history[0] > self.window_s:
            self.history.popleft()
        if len(self.history) >= self.max_restarts:
            raise GaveUpError(f"tritonserver failed {len(self.history) + 1} times within {self.window_s:.0f} s; "
                              "giving up (see the server output for why)")
        recent = [t for t in self.history if now - t < self.healthy_reset_s]
        return min(self.max_delay_s, self.first_delay_s * 2 ** len(recent))


class Supervisor:
    """Watches `server` (started) until `stopped` is set; `on_event(message)` hears what it does."""

    def __init__(self, server: TritonServer, policy: RestartPolicy | None = None, poll_s: float = 0.5,
                 start_timeout_s: float = 180.0, on_event=print):
        self.server, self.policy, self.poll_s = server, policy or RestartPolicy(), poll_s
        self.start_timeout_s, self.on_event = start_timeout_s, on_event
        self.restarts = 0
        self.expected = self._stub_counts()

    def _stub_counts(self) -> dict[str, int]:
        return {model: len(pids) for model, pids in self.server.model_processes().items()}

    def failure(self) -> str | None:
        """Why the server is not healthy now, or None."""
        process = self.server.process
        if process.poll() is not None:
            return f"tritonserver exited with code {process.returncode}"
        alive = self._stub_counts()
        for model, count in self.expected.items():
            if alive.get(model, 0) < count:
                return f"the model process of '{model}' died"
        return None

    def watch(self, stopped: threading.Event) -> None:
        while not stopped.wait(self.poll_s):
            reason = self.failure()
            if reason is not None:
                self._restart(reason, stopped)

    def _restart(self, reason: str, stopped: threading.Event) -> None:
        now = time.monotonic()
        delay = self.policy.delay(now)
        self.on_event(f"{reason}; restarting tritonserver in {delay:.0f} s")
        self.server.stop(timeout=5)
        if stopped.wait(delay):
            return
        self.policy.history.append(time.monotonic())
        self.restarts += 1
        self.server.env[RESTARTS_ENV] = str(self.restarts)
        try:
            self.server.start(self.start_timeout_s)
        except DFlashTrtError as exc:  # it failed to come up: the next poll sees it dead and backs off
            self.on_event(f"restart {self.restarts} failed: {exc.format_message()}")
            return
        self.expected = self._stub_counts()
        self.on_event(f"tritonserver restarted ({self.restarts} restart(s) so far); ready")
