"""Repeatability of ``target='auto'`` under a bursty load: the same pick in every run, within the bound (issue 51).

Per ``hybrid.zoo`` model (``--models``), ``--runs`` sessions tune it from an empty decision cache, each a process of
its own: ``HYBRID_CACHE_DIR`` a fresh empty folder, then ``hybrid.compile(path)`` with nothing given (target 'auto').
The load is bursty, as LoadGen's tests are when several systems take turns on one machine: a session calls the model
back to back (a closed loop) for a random ``--burst-s`` seconds, at batch 1 and batch 8 in turn, then pauses for a
random ``--pause-s`` seconds, longer than the tuner's time bound (``TuningPolicy.decide_within_s``). The sessions of
one model take turns, one burst at a time, so each one's pause is the others' bursts (plus a sleep to its drawn
length): nothing else runs beside a burst but the idle sessions' background work. A session ends once both its
buckets are decided with no candidate left open (untimed or under test), or after ``--max-bursts`` bursts.

Per model and bucket the table gives the runs' picks and how many agree, every other candidate's ratio to the pick
(``cm.tuning``, median over runs) with its outcomes, whether the closest one's gap lies beyond the tie band
(``TuningPolicy.tie_rel``), and how much of the bucket's own traffic (seconds of its bursts from its first call) and how
many calls it took to decide (``decided_after_s`` on the clock, read against the bursts).

    flock /tmp/coord/bench.lock python benchmarks/repeatability.py --write-results
    python benchmarks/repeatability.py --models neg_dim --runs 2 --burst-s 2,3 --pause-s 5,8   # a quick look
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import random
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import machine_info, table
from _results import add_argument, command_line, write_results

MODELS = ("neg_dim", "crnn", "encoder")  # small to middle zoo models with a dynamic batch dim (they tune online)
BATCHES = (1, 8)
OPEN = ("open",)  # a candidate still under test, or untimed and waiting for the re-check
TIMED = ("faster", "slower", "tie")
READY_TIMEOUT_S = 600.0  # a session's start: imports and the zoo model's load
REPLY_SLACK_S = 180.0  # a burst's answer comes this long after its seconds at most (cm.tuning, a slow first call)
WATCH_S = 0.2  # how often a session reads cm.tuning: a decision is placed on its clock within this


# ---------------------------------------------------------------------------------------------- pure helpers
def parse_range(text: str) -> tuple[float, float]:
    """``'5,10'`` -> ``(5.0, 10.0)``: a low and a high bound, low <= high, both positive."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH in seconds (like 5,10), got {text!r}")
    try:
        low, high = float(parts[0]), float(parts[1])
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two numbers LOW,HIGH, got {text!r}") from None
    if not 0 < low <= high:
        raise argparse.ArgumentTypeError(f"expected 0 < LOW <= HIGH, got {text!r}")
    return low, high


def traffic_s(bursts: Iterable[tuple[float, float]], first: float, until: float) -> float:
    """Seconds of the bucket's bursts ``(start, end)`` that lie between its first call and ``until``."""
    return sum(max(0.0, min(end, until) - max(start, first)) for start, end in bursts)


def group_cpu_s(pgids: Iterable[int], proc: Path = Path("/proc")) -> float:
    """CPU seconds used by the processes of these process groups so far (children they reaped included).

    Read from ``/proc/PID/stat`` (0 where there is none): the idle sessions' background work (their checks, compiles)
    during another's burst, which the table reports beside the picks.
    """
    wanted, ticks, total = set(pgids), os.sysconf("SC_CLK_TCK"), 0
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # a process that ended while the folder was read
        if int(fields[2]) in wanted:
            total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return total / ticks


def batch_of(record: Mapping[str, Any]) -> int:
    """The batch of a bucket as ``BucketTuning.as_dict`` gives it: the first input's leading dim."""
    return int(record["key"][0][1][0])


def settled(record: Mapping[str, Any]) -> bool:
    """Whether a bucket is decided with no candidate open (under test, or untimed and waiting for a re-check)."""
    return record["state"] == "decided" and not any(c["outcome"] in OPEN for c in record["candidates"])


def others(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The bucket's candidates other than the serving one."""
    return [c for c in record["candidates"] if c["label"] != record["serving"] and c["outcome"] != "serving"]


def runner_up(record: Mapping[str, Any]) -> tuple[str, float] | None:
    """The other candidate closest to the pick: its label and its call time over the pick's (None: no other ratio).

    Only candidates the rule judged (faster, slower, tie) count; a rejected or failed one has no speed.
    """
    judged = [(c["ratio"], c["label"]) for c in others(record) if c["ratio"] is not None and c["outcome"] in TIMED]
    if not judged:
        return None
    ratio, label = min(judged)
    return label, ratio


def picks_label(picks: Sequence[str | None]) -> tuple[str, int]:
    """``('onnxruntime:cpu x4, openvino:cpu x1', 4)``: the picks by count (None: not decided) and the most agreeing."""
    counts = collections.Counter(p or "not decided" for p in picks)
    text = ", ".join(f"{label} x{n}" for label, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    decided = [n for label, n in counts.items() if label != "not decided"]
    return text, max(decided, default=0)


def candidates_label(records: Sequence[Mapping[str, Any]]) -> str:
    """Each other candidate over the runs: the median of its ratios to the pick, and its outcomes by count.

    A candidate the check pruned is shown as such (its ratio is the check's bound, not a timing).
    """
    ratios: dict[str, list[float]] = collections.defaultdict(list)
    outcomes: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for record in records:
        for c in others(record):
            if c["ratio"] is not None:
                ratios[c["label"]].append(c["ratio"])
            pruned = c["outcome"] == "slower" and c["reason"].startswith("pruned")
            outcomes[c["label"]]["pruned" if pruned else c["outcome"]] += 1
    parts = []
    for label in sorted(outcomes, key=lambda lb: (statistics.median(ratios[lb]) if ratios[lb] else float("inf"), lb)):
        ratio = f" {statistics.median(ratios[label]):.3g}" if ratios[label] else ""
        said = ", ".join(f"{o} x{n}" for o, n in outcomes[label].most_common())
        parts.append(f"{label}{ratio} ({said})")
    return "; ".join(parts) or "none"


class Watch:
    """When each bucket was first decided and first settled, read from ``cm.tuning`` as often as it is given.

    A session's thread feeds it a snapshot every ``WATCH_S``, bursts and pauses alike, so a decision is placed on the
    clock within that much, wherever it falls; the record at the settling is kept (its candidates' ratios).
    """

    def __init__(self) -> None:
        self.buckets: dict[int, dict[str, Any]] = {}

    def see(self, tuning: Iterable[Mapping[str, Any]], now: float) -> None:
        for record in tuning:
            b = self.buckets.setdefault(batch_of(record), {"decided": None, "settled": None, "record": None,
                                                           "flips": 0})
            if b["decided"] is None and record["state"] == "decided":
                b["decided"] = now
            if b["settled"] is None and settled(record):
                b["settled"], b["record"] = now, dict(record)
            elif b["record"] is not None and record["serving"] != b["record"]["serving"]:
                b["flips"] += 1  # counts snapshots, not changes: any is worth a look in the log
                b["record"] = {**b["record"], "later": record["serving"]}

    def settled_all(self, batches: Iterable[int]) -> bool:
        return all(self.buckets.get(b, {}).get("settled") is not None for b in batches)


def bucket_outcome(watched: Mapping[str, Any] | None, batch: int, bursts: Sequence[tuple[float, float]],
                   first: float | None) -> dict[str, Any]:
    """What one session's bucket came to.

    Args:
        watched: The bucket's entry of :class:`Watch` (None: the bucket never showed in ``cm.tuning``).
        batch: The bucket's batch.
        bursts: The bucket's bursts, ``(start, end)`` on the session's clock.
        first: When the bucket's first call started on that clock (None: it had none).

    Returns:
        ``pick`` (the serving candidate when the bucket settled; None if it never did), ``record`` (its
        ``cm.tuning`` record then), ``traffic_s`` (the seconds of its bursts from its first call to
        ``decided_after_s``), ``settle_traffic_s`` (the same to when it settled: decided with no candidate open),
        ``bursts`` (its bursts that began before it settled), ``calls``, ``wall_s`` (``decided_after_s``) and
        ``flips`` (later snapshots that showed another candidate serving).
    """
    out: dict[str, Any] = {"batch": batch, "pick": None, "record": None, "traffic_s": None, "settle_traffic_s": None,
                           "bursts": None, "calls": None, "wall_s": None, "flips": 0}
    if watched is None or watched["record"] is None or first is None:
        return out
    record, at = watched["record"], watched["settled"]
    out.update(pick=record["serving"], record=record, calls=record["decided_after_calls"],
               wall_s=record["decided_after_s"], flips=watched["flips"],
               settle_traffic_s=traffic_s(bursts, first, at), bursts=sum(start < at for start, _ in bursts))
    if record["decided_after_s"] is not None:
        out["traffic_s"] = traffic_s(bursts, first, first + record["decided_after_s"])
    return out


def _median_max(values: Sequence[float], fmt: str = "{:.1f}") -> str:
    if not values:
        return "-"
    return f"{fmt.format(statistics.median(values))} / {fmt.format(max(values))}"


def summary_row(model: str, batch: int, outcomes: Sequence[Mapping[str, Any]], tie_rel: float,
                bound_s: float) -> list[str]:
    """One row of the table: a model's bucket over its runs (``bucket_outcome`` of each)."""
    picks, same = picks_label([o["pick"] for o in outcomes])
    decided = [o for o in outcomes if o["pick"] is not None]
    gaps = [g[1] for o in decided if (g := runner_up(o["record"])) is not None]
    gap = statistics.median(gaps) if gaps else None
    beyond = gap is not None and abs(gap - 1.0) > tie_rel
    if gap is None:
        verdict = "no other candidate judged"
    elif beyond:
        verdict = "holds" if same == len(outcomes) else f"fails ({same}/{len(outcomes)})"
    else:
        verdict = "tie: any pick"
    traffic = [o["traffic_s"] for o in decided if o["traffic_s"] is not None]
    settle = [o["settle_traffic_s"] for o in decided]
    worst = max(traffic + settle, default=None)
    within = "-" if worst is None else ("yes" if worst <= bound_s else f"no ({worst:.1f} s)")
    flips = sum(o["flips"] > 0 for o in outcomes)
    busy = [b for o in outcomes for b in o.get("background", ())]
    return [model, f"{batch}", picks + (f" (another later in {flips})" if flips else ""), f"{same}/{len(outcomes)}",
            candidates_label([o["record"] for o in decided]),
            "-" if gap is None else f"{gap:.3f} ({'beyond' if beyond else 'within'} +/-{tie_rel:.0%})", verdict,
            _median_max(traffic), _median_max(settle), within, _median_max([o["calls"] for o in decided], "{:.0f}"),
            _median_max([o["wall_s"] for o in decided]), _median_max([o["bursts"] for o in decided], "{:.0f}"),
            f"{len(outcomes) - len(decided)}", _median_max(busy, "{:.2f}")]


HEADERS = ["model", "batch", "picks", "same pick", "other candidates: ratio to the pick (median), outcomes",
           "closest gap (median)", "same pick where the gap exceeds the tie band",
           "decided after: traffic s (median / max)", "settled after: traffic s (median / max)", "within the bound",
           "decided after calls (median / max)", "decided after clock s (median / max)",
           "bursts to settle (median / max)", "not settled", "other sessions' cores busy in its bursts (median / max)"]


# ---------------------------------------------------------------------------------------------- the session (child)
def session(name: str, zoo_folder: str) -> None:
    """One tuning session, driven over stdin/stdout in JSON lines: ``{'burst': batch, 'seconds': s}`` or ``{}`` (end).

    ``HYBRID_CACHE_DIR`` is set by the parent to a fresh empty folder before this process imports hybrid.
    """
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever hybrid or a runtime prints goes to the log, never into the protocol
    assert not any(Path(os.environ["HYBRID_CACHE_DIR"]).iterdir()), "the decision cache must start empty"
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("hybrid").setLevel(logging.INFO)  # the tuner's decisions, in the session's log
    import hybrid
    from hybrid import zoo

    m = zoo.build(name, folder=zoo_folder)
    feeds = {1: m.feeds(seed=0)}
    feeds[8] = m.feeds(seed=1, shapes={k: (8, *s[1:]) for k, s in m.shapes.items()})
    cm = hybrid.compile(m.path)  # target='auto', nothing given
    watch, lock, stop = Watch(), threading.Lock(), threading.Event()

    def watching() -> None:
        while not stop.wait(WATCH_S):
            tuning = [t.as_dict() for t in cm.tuning]
            with lock:
                watch.see(tuning, time.perf_counter())

    watcher = threading.Thread(target=watching, daemon=True)
    watcher.start()
    first: dict[int, float] = {}
    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        ask = json.loads(line)
        if "burst" not in ask:
            break
        batch, f = int(ask["burst"]), feeds[int(ask["burst"])]
        calls, start = 0, time.perf_counter()
        while True:
            t0 = time.perf_counter()
            if t0 - start >= ask["seconds"]:
                break
            first.setdefault(batch, t0)
            cm.run(f)
            calls += 1
        end = time.perf_counter()
        tuning = [t.as_dict() for t in cm.tuning]
        with lock:
            watch.see(tuning, end)
            reply = {"batch": batch, "start": start, "end": end, "calls": calls,
                     "first": {str(b): t for b, t in first.items()}, "tuning": tuning,
                     "watch": {str(b): w for b, w in watch.buckets.items()}, "settled": watch.settled_all(BATCHES)}
            proto.write(json.dumps(reply) + "\n")
    stop.set()
    watcher.join()
    cm.close()


# ---------------------------------------------------------------------------------------------- the driver (parent)
class Session:
    """A session process: its own process group (ended whole, its check process with it), its log, its answers."""

    def __init__(self, name: str, zoo_folder: Path, folder: Path) -> None:
        cache = folder / "cache"
        cache.mkdir(parents=True)
        self.log_path = folder / "session.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 -- closed in close()
        env = {**os.environ, "HYBRID_CACHE_DIR": str(cache)}
        self.proc = subprocess.Popen([sys.executable, __file__, "--session", name, "--zoo-folder", str(zoo_folder)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     env=env, start_new_session=True)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        self.last: dict[str, Any] = {}

    def read(self, timeout_s: float) -> dict[str, Any]:
        if not self._sel.select(timeout_s):
            raise RuntimeError(f"session {self.proc.pid}: no answer in {timeout_s:.0f} s{self.tail()}")
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"session {self.proc.pid} ended (exit {self.proc.wait()}){self.tail()}")
        return json.loads(line)

    def burst(self, batch: int, seconds: float) -> dict[str, Any]:
        self.proc.stdin.write(json.dumps({"burst": batch, "seconds": seconds}) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        self.last = self.read(seconds + REPLY_SLACK_S)
        return self.last

    def tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()[-15:]
        except OSError:
            return ""
        return ":\n  " + "\n  ".join(lines) if lines else ""

    def close(self) -> None:
        """Ask the session to end; end its process group if it does not within a few seconds."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.stdin.write("{}\n")  # type: ignore[union-attr]
                self.proc.stdin.close()  # type: ignore[union-attr]
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)  # its check process and anything else it started
            except ProcessLookupError:
                break
            time.sleep(0.5)
        self.proc.wait()
        self._sel.close()
        self._log.close()


def tune_model(name: str, zoo_folder: Path, folder: Path, runs: int, burst_s: tuple[float, float],
               pause_s: tuple[float, float], max_bursts: int, rng: random.Random, progress: bool,
               logs: Path | None = None) -> tuple[list[dict[str, Any]], list[float]]:
    """Run ``runs`` sessions of one model in turns; return each session's buckets (``bucket_outcome``) and pauses."""
    sessions: list[Session] = []
    try:
        for k in range(runs):
            sessions.append(Session(name, zoo_folder, folder / f"{name}-{k}"))
        for s in sessions:
            s.read(READY_TIMEOUT_S)
        active = list(range(runs))
        ended: dict[int, float] = {}
        due: dict[int, float] = {}
        pauses: list[float] = []
        bursts: dict[int, list[tuple[int, float, float, float]]] = {k: [] for k in range(runs)}  # + others' busy
        while active:
            for k in list(active):
                wait = due.get(k, 0.0) - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if k in ended:
                    pauses.append(time.monotonic() - ended[k])
                batch = BATCHES[len(bursts[k]) % len(BATCHES)]
                others_pgids = [s.proc.pid for j, s in enumerate(sessions) if j != k]
                cpu0 = group_cpu_s(others_pgids)
                snap = sessions[k].burst(batch, rng.uniform(*burst_s))
                busy = (group_cpu_s(others_pgids) - cpu0) / (snap["end"] - snap["start"])
                ended[k] = time.monotonic()
                due[k] = ended[k] + rng.uniform(*pause_s)
                bursts[k].append((batch, snap["start"], snap["end"], busy))
                if progress:
                    states = ", ".join(f"batch {batch_of(r)}: {r['phase']} on {r['serving']}" for r in snap["tuning"])
                    print(f"{name} run {k + 1}/{runs} burst {len(bursts[k])} (batch {batch}, "
                          f"{snap['end'] - snap['start']:.1f} s, {snap['calls']} calls): {states}",
                          file=sys.stderr, flush=True)
                if snap["settled"] or len(bursts[k]) >= max_bursts:
                    active.remove(k)
        out = []
        for k, s in enumerate(sessions):
            for batch in BATCHES:
                mine = [(a, b, busy) for bb, a, b, busy in bursts[k] if bb == batch]
                out.append(bucket_outcome(s.last["watch"].get(str(batch)), batch, [(a, b) for a, b, _ in mine],
                                          s.last["first"].get(str(batch)))
                           | {"run": k, "background": [busy for *_, busy in mine]})
        return out, pauses
    finally:
        for k, s in enumerate(sessions):
            s.close()
            if logs is not None:
                logs.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(s.log_path, logs / f"{name}-{k + 1}.log")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help="zoo models, comma-separated")
    ap.add_argument("--runs", type=int, default=5, help="sessions per model, each from an empty decision cache")
    ap.add_argument("--burst-s", type=parse_range, default=(5.0, 10.0), help="a burst's seconds: LOW,HIGH")
    ap.add_argument("--pause-s", type=parse_range, default=(30.0, 60.0), help="a pause's seconds: LOW,HIGH")
    ap.add_argument("--max-bursts", type=int, default=16, help="a session ends after this many bursts at most")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write every session's buckets here")
    ap.add_argument("--logs", type=Path, help="keep each session's log (the tuner's decisions) in this folder")
    ap.add_argument("--session", help=argparse.SUPPRESS)
    ap.add_argument("--zoo-folder", help=argparse.SUPPRESS)
    add_argument(ap, "repeatability")
    args = ap.parse_args()
    if args.session:
        session(args.session, args.zoo_folder)
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the sessions are ended in the finally blocks
    from hybrid import zoo
    from hybrid.runtime.auto import TuningPolicy

    policy = TuningPolicy()
    print(machine_info(), flush=True)
    folder = Path(tempfile.mkdtemp(prefix="hybrid-repeatability-"))
    rng = random.Random(args.seed)
    rows, raw, all_pauses = [], [], []
    started = time.monotonic()
    try:
        for name in args.models.split(","):
            m = zoo.build(name)  # built once into the user's cache; each session reads it from there
            outcomes, pauses = tune_model(name, m.path.parent.parent, folder, args.runs, args.burst_s, args.pause_s,
                                          args.max_bursts, rng, sys.stderr.isatty(), args.logs)
            all_pauses += pauses
            raw.append({"model": name, "path": str(m.path), "buckets": outcomes})
            for batch in BATCHES:
                rows.append(summary_row(name, batch, [o for o in outcomes if o["batch"] == batch], policy.tie_rel,
                                        policy.decide_within_s))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    wall = time.monotonic() - started
    text = table(HEADERS, rows)
    print(text, flush=True)
    pause_text = (f"{min(all_pauses):.1f}-{max(all_pauses):.1f} s" if all_pauses else "none")
    notes = (f"{args.runs} sessions per model, each a process from an empty decision cache, "
             f"`hybrid.compile(path)` with nothing given; bursts of {args.burst_s[0]:g}-{args.burst_s[1]:g} s "
             f"(closed loop) at batch 1 and 8 in turn, one session bursting at a time; its pauses measured "
             f"{pause_text} (drawn in {args.pause_s[0]:g}-{args.pause_s[1]:g} s); a session ends when both buckets are "
             f"decided with no candidate open, or after {args.max_bursts} bursts (then 'not decided'). Ratios: a "
             f"candidate's call time over the pick's, from `cm.tuning` (a pruned one's is the check's bound). Tie band "
             f"+/-{policy.tie_rel:.0%} (`TuningPolicy.tie_rel`); bound: {policy.decide_within_s:g} s of the bucket's "
             f"own traffic (`TuningPolicy.decide_within_s`, pauses not counted) or {policy.decide_within_calls} "
             f"calls where those take longer. Traffic s: the bucket's burst seconds from its first call to "
             f"`decided_after_s` (decided), or to when `cm.tuning` (read every {WATCH_S:g} s) first showed it decided "
             f"with no candidate open, untimed or under test (settled). Wall time {wall / 60:.1f} min.")
    print(notes, flush=True)
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))
    if args.write_results is not None:
        write_results(args.write_results or "repeatability", "Repeatability under a bursty load: the same pick "
                      "in every run, decided within the bound of traffic (issue 51)", command_line(), text, notes)


if __name__ == "__main__":
    main()
