"""How many CPU threads the embedded policy's forwards use: measured once per machine, then cached (issue 37).

torch's default (one thread per core) is not the fastest for one-token decode steps: on the 2-core development
machine a demo session ran 60.8 s with 2 threads and 50.8 s with 1 (the same 729 tokens). A step reads 270 MB of
weights with matrix-vector products and spends ~18 ms in small kernels and Python dispatch, so a second thread adds
synchronisation to every small kernel and little bandwidth. A prompt's matrix-matrix products, by contrast, use
every core. So the count is measured per phase: `measure_plan` times one-token decode steps and a short prompt at
each candidate count (`candidate_counts`), round-robin so that a burst of load elsewhere hits every count alike, and
`choose` takes the fastest (a count within `TIE_TOLERANCE` of a smaller one loses to it: fewer threads leave cores
to the rest of the process). The result is stored as JSON in the model cache folder under a key of CPU model, usable
CPU count, torch version and dtype (`machine_key`), so later starts read it instead of measuring; another machine,
torch or dtype measures again. Delete the file to measure again on the same machine.

`torch.set_num_threads` sets the OpenMP team size of the calling thread, and the default that threads which have
not yet run a parallel operation pick up; a thread that already ran one keeps its own count (measured with torch
2.13: a worker thread started before the call still ran 2 threads after the main thread set 1). It is process-wide
for MKL and for new threads, so treat it as process-wide: `use_threads` switches only when the count differs (a
switch costs about a microsecond) and `threads_restored` puts the caller's count back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from learning.engines.files import file_lock, store_keyed

log = logging.getLogger(__name__)

PLAN_FILENAME = "threads.json"  # in the model cache folder (the converted model folder's parent)
PLAN_FORMAT = 1  # bump to measure again everywhere (part of the key)
MAX_CANDIDATES = 8
TIE_TOLERANCE = 0.03  # a count must be more than 3 % faster than every smaller count to be chosen
PROBE_BUDGET_S = 2.5  # round-robin rounds stop once this much time is spent (after the first full round)
PROBE_ROUNDS = 4
HOPELESS = 4.0  # a count this many times slower than the fastest decode step is not timed further


@dataclass(frozen=True, slots=True)
class ThreadPlan:
    """Thread counts per phase: one-token decode steps, and everything else (prompts, scoring, group steps)."""

    decode: int
    prefill: int
    source: str = "fixed"  # "fixed" (given), "measured" (probed now) or "cached" (read from the plan file)
    timings: dict[str, dict[str, float]] = field(default_factory=dict)  # phase -> {count: seconds}, when measured

    def __post_init__(self) -> None:
        if self.decode < 1 or self.prefill < 1:
            raise ValueError(f"thread counts must be >= 1, not decode={self.decode}, prefill={self.prefill}")


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one, else `os.cpu_count()`)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def candidate_counts(cpus: int, cap: int = MAX_CANDIDATES) -> list[int]:
    """Thread counts worth timing on `cpus` CPUs: all of 1..cpus up to `cap` of them, else `cap` counts spread
    from 1 to `cpus` (both ends always included)."""
    cpus = max(1, int(cpus))
    if cpus <= cap:
        return list(range(1, cpus + 1))
    if cap < 2:
        return [1]
    step = (cpus - 1) / (cap - 1)
    return sorted({1 + round(i * step) for i in range(cap)})


def choose(timings: Mapping[int, float], tolerance: float = TIE_TOLERANCE) -> int:
    """The fastest count of measured `timings` (count -> seconds); a larger count must beat the best smaller one by
    more than `tolerance` (relative) to win."""
    if not timings:
        raise ValueError("no timings to choose from")
    best = None
    for count in sorted(timings):
        seconds = timings[count]
        if best is None or seconds < timings[best] * (1.0 - tolerance):
            best = count
    assert best is not None
    return best


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` knows."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            name, _, value = line.partition(":")
            if name.strip() in ("model name", "Hardware", "cpu model") and value.strip():
                return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def machine_key(dtype: str, extra: str = "") -> str:
    """The plan file's key: CPU model, usable CPUs, torch version, dtype (and `extra`, e.g. the model's name)."""
    import torch

    parts = [f"v{PLAN_FORMAT}", cpu_model(), f"{available_cpus()}cpu", f"torch {torch.__version__}", dtype]
    if extra:
        parts.append(extra)
    return " | ".join(parts)


def use_threads(count: int) -> None:
    """`torch.set_num_threads(count)` unless the calling thread already runs that many."""
    import torch

    if torch.get_num_threads() != count:
        torch.set_num_threads(count)


@contextlib.contextmanager
def threads_restored() -> Iterator[None]:
    """Run the block, then give the calling thread back the thread count it had before."""
    import torch

    before = torch.get_num_threads()
    try:
        yield
    finally:
        use_threads(before)


def measure_plan(
    counts: Sequence[int],
    decode_step: Callable[[], object],
    prefill: Callable[[], object],
    budget_s: float = PROBE_BUDGET_S,
    rounds: int = PROBE_ROUNDS,
    clock: Callable[[], float] = time.perf_counter,
) -> ThreadPlan:
    """Time `decode_step` (one decode step) and `prefill` (one short prompt) at each of `counts` threads.

    Round-robin rounds (every count once per round, the first round warming up thread pools and kernels) until
    `rounds` rounds or `budget_s` seconds; each count keeps its fastest time (the least disturbed by other load). A
    count whose decode step takes more than `HOPELESS` times the fastest one so far is dropped at once, its prompt
    untimed: with other processes busy on the cores, a thread team waits for its descheduled members at every
    parallel region (measured on the shared 2-core machine: 2.4 s per step with 2 threads, 67 ms with 1). The
    calling thread's count is restored after.
    """
    counts = sorted({int(c) for c in counts if int(c) >= 1})
    if not counts:
        raise ValueError("no thread counts to measure")
    best: dict[str, dict[int, float]] = {"decode": {}, "prefill": {}}
    alive = list(counts)
    started = clock()

    def timed(fn: Callable[[], object]) -> float:
        t0 = clock()
        fn()
        return clock() - t0

    with threads_restored():
        for done in range(max(1, rounds)):
            if done and clock() - started > budget_s:
                break
            for count in list(alive):
                use_threads(count)
                seconds = timed(decode_step)
                best["decode"][count] = min(seconds, best["decode"].get(count, seconds))
                if seconds > HOPELESS * min(best["decode"].values()):
                    alive.remove(count)
                    continue
                seconds = timed(prefill)
                best["prefill"][count] = min(seconds, best["prefill"].get(count, seconds))
    timings = {phase: {str(c): round(s, 6) for c, s in sorted(t.items())} for phase, t in best.items()}
    return ThreadPlan(decode=choose(best["decode"]), prefill=choose(best["prefill"]), source="measured",
                      timings=timings)


def read_plan(path: Path, key: str) -> ThreadPlan | None:
    """The plan stored under `key` in the plan file, or None (no file, another key, unreadable)."""
    try:
        entries = json.loads(Path(path).read_text(encoding="utf-8"))
        entry = entries[key]
        return ThreadPlan(decode=int(entry["decode"]), prefill=int(entry["prefill"]), source="cached",
                          timings=entry.get("timings", {}))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_plan(path: Path, key: str, plan: ThreadPlan) -> None:
    """Store `plan` under `key`, keeping the other keys' entries (atomic replace)."""
    entry = asdict(plan)
    entry.pop("source")
    store_keyed(path, key, {**entry, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")})


def cached_plan(path: Path, key: str, measure: Callable[[], ThreadPlan]) -> ThreadPlan:
    """The plan stored under `key` in `path`, else `measure()`'s, stored there for the next start.

    A folder that cannot be written (a read-only model folder) only costs measuring again next time.
    """
    path = Path(path)
    plan = read_plan(path, key)
    if plan is not None:
        return plan
    with contextlib.ExitStack() as stack:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            stack.enter_context(file_lock(path.with_name(f".{path.name}.lock")))
        except OSError as exc:
            log.info("no lock for %s (%s); measuring without it", path, exc)
        plan = read_plan(path, key)  # another process measured while we waited for the lock
        if plan is not None:
            return plan
        plan = measure()
        try:
            write_plan(path, key, plan)
        except OSError as exc:
            log.info("could not store the thread plan in %s (%s); it is measured again next start", path, exc)
    log.info("embedded policy threads measured: decode %d, prefill %d (%s)", plan.decode, plan.prefill,
             plan.timings)
    return plan


# -- backing off when the cores are shared ----------------------------------------------------------------------------

SLOW_FACTOR = 6.0  # a forward this many times slower than the plan's measurement means the cores are oversubscribed
# … and never below this. The collapse it guards against makes every call take seconds (1.8-3 s measured), while a
# one-off stall of tens of ms (a GC pause, the agent's own threads) is noise: at 50 ms the guard tripped on an idle
# machine in `make demo` (a 50 ms step against 8 ms measured) and printed an alarming warning for nothing.
SLOW_FLOOR_S = 0.5
BACKOFF_S = 60.0  # how long one thread serves after a trip, before the plan's counts are tried again
MAX_BACKOFF_S = 600.0  # the back-off doubles while trips follow each other, up to this
PROBE_PROMPT = 64  # tokens of the prompt the plan's prefill timing was taken on (measure_plan's callers)


@dataclass(slots=True)
class ContentionGuard:
    """Falls back to one thread while the cores are oversubscribed, for engines whose threads spin at every barrier.

    Why: llama.cpp's worker threads busy-wait at each of the hundreds of barriers in a forward pass. When more
    threads want the CPU than there are cores (another process decoding, a training step, torch work in the same
    process), a forward can fall into a mode where every call waits out descheduled peers. Measured on the 2-core
    machine (`tests/benchmarks/contention.py`, 24 greedy tokens of SmolLM2 Q4_1 beside a 2-thread torch process):
    0.95 s on 1 thread idle, 0.60 s on 2; beside the neighbour 1.05-1.56 s on 1 thread, while 2 threads took 1.2-1.6 s
    in four runs and 73 s in two, every call (prompt or one-token step) then taking about 3 s. One thread degrades
    gracefully (it is merely time-sliced), so a forward at more than one thread that takes more than `factor` times
    the plan's measurement switches both phases to one thread for `backoff_s`; then the plan's counts are tried
    again. A trip that comes within one back-off of the last one ending doubles the back-off (up to
    `max_backoff_s`), so a neighbour that stays costs a probe every ten minutes, not every minute.

    What is expected: for a one-token step, the plan's measured step at its decode count (taken behind a 64-token
    prompt; a step behind a long context is up to ~2× slower, well inside `factor`); for a prompt of n tokens, the
    plan's 64-token prompt time at its prefill count, scaled by n / 64 when n is longer (shorter prompts are allowed
    the whole 64-token time; attention grows faster than linearly, so a prompt of several thousand tokens on torch
    may trip it falsely, at the cost of one back-off on one thread). A phase the plan has no timing for at its count
    is not judged; a plan with no timing at all (a fixed count from the settings) gets no guard: a count given by hand
    is honoured as given.
    """

    plan: ThreadPlan
    engine: str = "the embedded policy"  # named in the log line of a trip
    factor: float = SLOW_FACTOR
    floor_s: float = SLOW_FLOOR_S
    backoff_s: float = BACKOFF_S
    max_backoff_s: float = MAX_BACKOFF_S
    clock: Callable[[], float] = time.monotonic
    until: float = 0.0  # clock() before which one thread serves
    trips: int = 0
    streak: int = 0  # trips in a row, each within one back-off of the previous one's end

    def _timing(self, phase: str, count: int) -> float | None:
        value = self.plan.timings.get(phase, {}).get(str(count))
        return float(value) if value else None

    @property
    def expected_step_s(self) -> float | None:
        """The plan's measured one-token step at its decode count (None: not measured)."""
        return self._timing("decode", self.plan.decode)

    def expected_s(self, tokens: int) -> float | None:
        """The plan's time for a forward of `tokens` new tokens (one row) at its own counts; None: not measured."""
        if tokens <= 1:
            return self.expected_step_s
        prompt = self._timing("prefill", self.plan.prefill)
        return prompt * max(tokens, PROBE_PROMPT) / PROBE_PROMPT if prompt is not None else None

    @property
    def active(self) -> bool:
        """Whether this guard can ever back off (more than one thread, with a measurement to compare against)."""
        return ((self.plan.decode > 1 and self.expected_step_s is not None)
                or (self.plan.prefill > 1 and self._timing("prefill", self.plan.prefill) is not None))

    def counts(self) -> tuple[int, int]:
        """(decode, prefill) threads for the next forward: the plan's, or (1, 1) while backing off."""
        if self.until and self.clock() < self.until:
            return 1, 1
        return self.plan.decode, self.plan.prefill

    def observe(self, seconds: float, tokens: int, threads: int) -> bool:
        """Record a forward of `tokens` new tokens (one row) that took `seconds` on `threads` threads; True when it
        trips the back-off (logged: a warning the first time, then at info level)."""
        expected = self.expected_s(tokens)
        if threads <= 1 or expected is None or seconds <= max(self.factor * expected, self.floor_s):
            return False
        now = self.clock()
        self.streak = self.streak + 1 if self.until and now - self.until < self.backoff_s else 1
        backoff = min(self.backoff_s * 2 ** (self.streak - 1), self.max_backoff_s)
        self.until = now + backoff
        self.trips += 1
        say = log.warning if self.trips == 1 else log.info
        say("%s: a forward of %d token(s) took %.2f s on %d threads (%.3f s on an idle machine): the CPU is "
            "oversubscribed, so one thread serves for the next %.0f s (back-off %d)", self.engine, tokens, seconds,
            threads, expected, backoff, self.trips)
        return True

    @classmethod
    def for_plan(cls, plan: ThreadPlan, engine: str) -> ContentionGuard | None:
        """A guard for a measured or cached plan that can back off; None for a fixed or single-thread plan."""
        guard = cls(plan, engine)
        return guard if plan.source != "fixed" and guard.active else None
