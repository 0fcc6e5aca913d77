"""How fast can V-Min's memory cap be, under Conveyor's memory accounting?

A constraint solver (OR-tools CP-SAT) answers, on the model of
`v_schedule_table`: 2K chunks on K workers in a V, F = I = W = 1 each, no
transfer cost, and a worker's memory counted in chunk activations, each held
from the start of its F to the end of its W (what Conveyor's runtime keeps:
a split backward's W needs the saved activations). V-Min's cap is
max(2, ceil(2K/3) + 1) (torch.ops.conveyor.v_memory_cap).

1. Repeated patterns: the micro-batches' F, I and W placed at the same
   offsets every period, as `schedules/modulo.h` builds them (one micro-batch
   per period, or two with their own offsets). For each K, the shortest
   period at which such a pattern fits V-Min's cap, proved: the solver shows
   every shorter period infeasible. 1F1B's steady state takes 6 units per
   micro-batch (a stage's F + B = 2 + 4), so a period of 6 has no steady
   bubble. The same question with each activation freed at the end of its I
   (the zero-bubble authors' accounting, where W keeps little) shows where
   the difference comes from.
2. Whole schedules, for small K and M: the shortest makespan at V-Min's cap
   (optimal where the solver proves it; else the best it finds and its lower
   bound), against Conveyor's v-min and 1F1B. The solver's channels are
   unbounded (v-min is built for channels of one message), so where it proves
   an optimum, that is a lower bound for v-min.

  .venv/bin/python benchmarks/v_min_bounds.py [--workers 3 4 5 6] [--whole 6x16] [--time-limit 120]

It installs OR-tools (benchmarks/requirements.txt) into the running
environment when it is missing, and needs the conveyor package for v-min.
"""
import argparse
import importlib.util
import math
import pathlib
import re
import subprocess
import sys


def ensure_ortools():
    if importlib.util.find_spec("ortools") is None:
        requirements = pathlib.Path(__file__).with_name("requirements.txt")
        print(f"v_min_bounds: installing {requirements.name} (OR-tools)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-r", str(requirements)], check=True)


def v_placement(k):
    """Stage -> worker, as Conveyor's V schedules place them (read off v-min's text)."""
    placement = [0] * (2 * k)
    for worker, line in enumerate(conveyor_ops().schedule("v-min", k, 1).splitlines()[1:]):
        for action in line.split():
            placement[parse_action(action)[1]] = worker
    return placement


def solver(limit):
    from ortools.sat.python import cp_model
    s = cp_model.CpSolver()
    s.parameters.max_time_in_seconds = limit
    s.parameters.num_workers = 2
    return s


def chain(model, f, i, w, stages):
    """One micro-batch's F's down the stages, I's back up, each W after its I."""
    for s in range(1, stages):
        model.Add(f[s] >= f[s - 1] + 1)
    model.Add(i[stages - 1] >= f[stages - 1] + 1)
    for s in range(stages - 1):
        model.Add(i[s] >= i[s + 1] + 1)
    for s in range(stages):
        model.Add(w[s] >= i[s] + 1)


def repeated_pattern(k, per_period, period, cap, freed_at_input, limit):
    """Whether `per_period` micro-batches, each with its own offsets, repeated
    every `period`, fit `cap` on every worker. CP-SAT's status name."""
    from ortools.sat.python import cp_model
    m = cp_model.CpModel()
    stages, placement = 2 * k, v_placement(k)
    horizon = 8 * k + 4 * period
    new = lambda: [m.NewIntVar(0, horizon, "") for _ in range(stages)]  # noqa: E731
    f, i, w = ([new() for _ in range(per_period)] for _ in range(3))
    m.Add(f[0][0] == 0)
    for r in range(per_period):
        chain(m, f[r], i[r], w[r], stages)
        m.Add(f[r][0] <= period - 1)
        if r:
            m.Add(f[r][0] >= f[r - 1][0] + 1)
    ends = i if freed_at_input else w
    shift = 100 * period  # keeps the divisions' numerators positive
    for worker in range(k):
        mine = [s for s in range(stages) if placement[s] == worker]
        slots = []
        for r in range(per_period):
            for s in mine:
                for start in (f[r][s], i[r][s], w[r][s]):
                    slot = m.NewIntVar(0, period - 1, "")
                    m.AddModuloEquality(slot, start, period)
                    slots.append(slot)
        m.AddAllDifferent(slots)  # unit actions: distinct slots modulo the period never overlap
        # Held when an F starts (where the count rises): of each offset's
        # activations, those started at or before it and not yet freed,
        # counted over all repetitions.
        for r2 in range(per_period):
            for c2 in mine:
                held = []
                for r in range(per_period):
                    for c in mine:
                        started = m.NewIntVar(0, 10 ** 4, "")
                        m.AddDivisionEquality(started, f[r2][c2] - f[r][c] + shift, period)
                        freed = m.NewIntVar(0, 10 ** 4, "")
                        m.AddDivisionEquality(freed, f[r2][c2] - ends[r][c] + period - 1 + shift, period)
                        held.append(started - freed + 1)
                m.Add(sum(held) <= cap)
    s = solver(limit)
    return s.StatusName(s.Solve(m))


def shortest_period(k, per_period, cap, freed_at_input, longest, limit):
    """The shortest period (per micro-batch) from 6 up to `longest` at which a
    pattern fits, every shorter one proved infeasible: a table cell."""
    for period in range(6 * per_period, int(longest * per_period) + 1):
        status = repeated_pattern(k, per_period, period, cap, freed_at_input, limit)
        if status in ("OPTIMAL", "FEASIBLE"):
            return f"{period / per_period:g}"
        if status != "INFEASIBLE":
            return f"> {(period - 1) / per_period:g} ({status.lower()} at {period / per_period:g})"
    return f"> {longest:g}"


def parse_action(text):
    """'11I3' -> ('i', 11, 3): kind, stage, micro-batch."""
    stage, kind, microbatch = re.fullmatch(r"(\d+)([FIW])(\d+)", text).groups()
    return kind.lower(), int(stage), int(microbatch)


def unit_timeline(text):
    """Start times of a schedule's actions, each taking 1 and starting as soon
    as its worker is free and its input is done: {(kind, stage, micro-batch): start}."""
    lines = [[parse_action(a) for a in line.split()] for line in text.splitlines()[1:] if line.strip()]
    stages = 1 + max(s for line in lines for _, s, _ in line)
    ends, start, free, at = {}, {}, [0] * len(lines), [0] * len(lines)
    while any(at[w] < len(line) for w, line in enumerate(lines)):
        moved = False
        for w, line in enumerate(lines):
            while at[w] < len(line):
                kind, s, j = line[at[w]]
                needs = {"f": [("f", s - 1, j)] if s else [],
                         "i": [("i", s + 1, j)] if s + 1 < stages else [("f", s, j)],
                         "w": [("i", s, j)]}[kind]
                if any(n not in ends for n in needs):
                    break
                start[kind, s, j] = max([free[w]] + [ends[n] for n in needs])
                ends[kind, s, j] = free[w] = start[kind, s, j] + 1
                at[w] += 1
                moved = True
        if not moved:
            raise ValueError("the schedule waits forever")
    return start


def whole_schedule(k, microbatches, cap, limit, hint):
    """The shortest makespan of M micro-batches at `cap`, the solver starting
    from `hint` (start times): (status, makespan, lower bound)."""
    from ortools.sat.python import cp_model
    m = cp_model.CpModel()
    stages, placement = 2 * k, v_placement(k)
    horizon = 12 * microbatches + 8 * k
    start = {(a, s, j): m.NewIntVar(0, horizon, "") for a in "fiw" for s in range(stages) for j in range(microbatches)}
    for j in range(microbatches):
        chain(m, *([start[a, s, j] for s in range(stages)] for a in "fiw"), stages)
        for s in range(stages):
            for a in "fiw":
                if j:
                    m.Add(start[a, s, j] >= start[a, s, j - 1] + 1)  # each stage's actions in micro-batch order
    end = m.NewIntVar(0, horizon, "")
    for worker in range(k):
        mine = [s for s in range(stages) if placement[s] == worker]
        m.AddNoOverlap([m.NewIntervalVar(start[a, s, j], 1, start[a, s, j] + 1, "")
                        for a in "fiw" for s in mine for j in range(microbatches)])
        times, changes = [], []
        for s in mine:
            for j in range(microbatches):
                times += [start["f", s, j], start["w", s, j] + 1]
                changes += [1, -1]
        m.AddReservoirConstraint(times, changes, 0, cap)
    for v in start.values():
        m.Add(end >= v + 1)
    m.Minimize(end)
    for key, at in hint.items():
        m.AddHint(start[key], at)
    s = solver(limit)
    status = s.Solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return s.StatusName(status), math.nan, s.BestObjectiveBound()
    return s.StatusName(status), s.ObjectiveValue(), s.BestObjectiveBound()


def conveyor_ops():
    import torch
    import conveyor  # noqa: F401  (registers torch.ops.conveyor)
    return torch.ops.conveyor


def v_min_cap(k):
    return int(conveyor_ops().v_memory_cap("v-min", k))


def conveyor_makespans(k, microbatches):
    """Conveyor's v-min (makespan, peak chunk activations, text) and 1F1B's makespan, simulated."""
    ops = conveyor_ops()
    text = ops.schedule("v-min", k, microbatches)
    v_min = ops.simulate(text, [1.0] * (2 * k), [2.0] * (2 * k), 0.0)[0]
    peak = 0
    for line in text.splitlines()[1:]:
        held = 0
        for action in line.split():
            held += {"f": 1, "w": -1}.get(parse_action(action)[0], 0)
            peak = max(peak, held)
    one_f_one_b = ops.simulate(ops.schedule("1f1b", k, microbatches), [2.0] * k, [4.0] * k, 0.0)[0]
    return v_min, peak, text, one_f_one_b


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 3, 4, 5, 6, 7, 8])
    parser.add_argument("--whole", nargs="*", default=["3x8", "3x16", "5x8", "6x8", "6x16"],
                        help="K x M cases for whole schedules (none: skip them)")
    parser.add_argument("--time-limit", type=float, default=120, help="seconds per repeated pattern's solve")
    parser.add_argument("--whole-time-limit", type=float, default=600, help="seconds per whole schedule's solve")
    args = parser.parse_args()
    ensure_ortools()

    print("\nRepeated patterns at V-Min's cap: the shortest period per micro-batch (F = I = W = 1; 6 has no "
          "steady bubble, as 1F1B's steady state)\n")
    print("| K | V-Min's cap | one micro-batch per period, freed at W | two per period, freed at W "
          "| one per period, freed at I |")
    print("|---|---|---|---|---|")
    for k in args.workers:
        cap = v_min_cap(k)
        one = shortest_period(k, 1, cap, False, 12, args.time_limit)
        # Two micro-batches with their own offsets, each period shorter than one's:
        two = one
        if one != "6" and not one.startswith(">"):
            two = shortest_period(k, 2, cap, False, int(one) - 0.5, args.time_limit)
            if two.startswith(">"):
                two = f"none below {one}"
        freed_at_input = shortest_period(k, 1, cap, True, 12, args.time_limit)
        print(f"| {k} | {cap} | {one} | {two} | {freed_at_input} |", flush=True)

    print("\nWhole schedules at V-Min's cap (makespan; 1F1B's stage is F = 2, B = 4)\n")
    print("| K | M | cap | best found | proved | Conveyor's v-min (peak) | 1F1B | v-min / best | best / 1F1B |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case in args.whole:
        k, microbatches = (int(x) for x in case.split("x"))
        cap = v_min_cap(k)
        ours, peak, text, base = conveyor_makespans(k, microbatches)
        status, best, bound = whole_schedule(k, microbatches, cap, args.whole_time_limit, unit_timeline(text))
        proved = "optimal" if status == "OPTIMAL" else f"{status.lower()}, bound {bound:.0f}"
        print(f"| {k} | {microbatches} | {cap} | {best:.0f} | {proved} | {ours:.0f} ({peak}) | {base:.0f} "
              f"| {ours / best:.3f} | {best / base:.3f} |", flush=True)


if __name__ == "__main__":
    main()
