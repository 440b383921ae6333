"""The report of a ``plunder bench`` run: medians of its runs, its tables, the targets.

Each table is built once as a title, headers and rows of text, then printed with rich or
written as Markdown.
"""

from __future__ import annotations

import statistics
from typing import Any

MEDIAN_KEYS = (
    "kill_owned",
    "expiry_owned",
    "expiry_owned_max",
    "join_owned",
    "join_owned_max",
    "stolen",
    "double_claims",
    "rate",
    "seconds",
    "p50",
    "p95",
    "p99",
    "workers",
    "enqueue_seconds",
    "idle_cpu",
    "idle_cpu_max",
    "conns_idle",
    "conns_drain",
    "conns_idle_mean",
    "conns_drain_mean",
    "connections",
    "live",
    "rss_before_mib",
    "rss_with_mib",
    "kib_per_session",
    "rate_alone",
    "rate_unlimited",
    "ratio",
    "utilisation",
    "wait_max_cost8_ms",
    "wait_max_cost1_ms",
    "share",
    "on_holders",
    "elsewhere",
    "elsewhere_holder_free",
    "wait_preferred_ms",
    "wait_plain_ms",
    "extra_wait_ms",
    "wait_preferred_p95_ms",
    "ratio_unlimited",
    "most_at_once",
    "b_p99_plain_ms",
    "b_p99_fair_ms",
    "rate_unordered",
    "overlaps",
    "out_of_order",
    "enqueue_seconds",
    "plain_p50",
    "plain_p99",
    "child_p50",
    "child_p99",
)
COLUMNS = [
    ("enqueue", "enqueue (jobs/s)"),
    ("drain_1", "drain, 1 proc (jobs/s)"),
    ("drain_2", "drain, 2 procs (jobs/s)"),
    ("drain_4", "drain, 4 procs (jobs/s)"),
    ("drain_2gw", "drain, 2 procs, 2 gateways (jobs/s)"),
    ("first_line", "enqueue call→task's first line p50/p95/p99 (ms)"),
    ("latency", "enqueue→start, database stamps p50/p95/p99 (ms)"),
    ("rescue", "kill→rescue (s)"),
    ("depth_small", "drain on small depth (jobs/s)"),
    ("depth_large", "drain on large depth (jobs/s)"),
    ("pool", "1,000 no-ops, -c 8 (jobs/s)"),
    ("sessions", "200 idle remote sessions: gateway's connections, memory each"),
    ("limits", "beside a limit of 10, 4 procs -c 50: no-ops/s, × unlimited, × alone, most at once"),
    ("rebalance", "partitions: kill→owned / expiry→owned / join→owned (s), stolen, double"),
    ("fairness", "tenant b's p99 wait behind a's burst: plain / fair queue (ms)"),
    ("ordered", "ordered keys, 4 procs -c 50: jobs/s ordered / unordered, ×, overlaps"),
    ("flows", "workflows: ack→child p50/p99, beside enqueue→first line p50/p99 (ms); fan jobs/s"),
    ("affinity", "affinity: share on holders while free; preferred / plain wait (ms)"),
    ("cost", "slot cost, 2 procs -c 8: utilisation, most at once, max wait cost 8 / 1 (ms)"),
]
LATENCIES = ("latency", "first_line")
FLEET_PREFIX = "fleet_"  # fleet_1 … fleet_16: scenario 9, one measurement per process count
FLEET_HEADERS = [
    "processes",
    "drain (jobs/s)",
    "ratio to best",
    "idle CPU per process, mean / max (% of a core; read in 10 ms ticks)",
    "connections per process, idle / draining: most (mean)",
    "enqueue took (s)",
]
Table = tuple[str, list[str], list[list[str]]]  # title, headers, rows


# -- medians ------------------------------------------------------------------------------
def median_of(results: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in results if "error" not in r]
    if not good:
        return {"error": results[0]["error"] if results else "not run"}
    out: dict[str, Any] = {"runs": len(good)}
    for key in MEDIAN_KEYS:
        values = [r[key] for r in good if key in r]
        if values:
            out[key] = statistics.median(values)
    if len(good) < len(results):
        out["failed_runs"] = len(results) - len(good)
    return out


def summary(result: dict[str, Any]) -> str:
    """One measurement's result on one line, as the run goes."""
    if "error" in result:
        return f"error: {result['error']}"
    if "b_p99_fair_ms" in result:
        plain, fair = result["plain"], result["fair"]
        return (
            f"tenant b ({result['small']} jobs, 1 s after a's {result['jobs']:,}): wait "
            f"p50/p99 {plain['b_wait']['p50']:.0f}/{plain['b_wait']['p99']:.0f} ms plain, "
            f"{fair['b_wait']['p50']:.0f}/{fair['b_wait']['p99']:.0f} ms fair; a drained at "
            f"{plain['a_rate']:,.0f} / {fair['a_rate']:,.0f} jobs/s; a left when b was done: "
            f"{plain['a_left_when_b_done']:,} / {fair['a_left_when_b_done']:,}"
        )
    if "p50" in result:
        return f"p50 {result['p50']:.1f} ms, p95 {result['p95']:.1f} ms, p99 {result['p99']:.1f} ms"
    if "rate_unordered" in result:
        return (
            f"{result['rate']:,.0f} jobs/s ordered, {result['rate_unordered']:,.0f} unordered "
            f"(ratio {result['ratio']:.2f}); overlaps {result['overlaps']}, out of order "
            f"{result['out_of_order']}"
        )
    if "child_p50" in result:
        return (
            f"last parent's ack→child's first line p50 {result['child_p50']:.1f} ms, p99 "
            f"{result['child_p99']:.1f} ms; enqueue→first line p50 {result['plain_p50']:.1f} "
            f"ms, p99 {result['plain_p99']:.1f} ms; fan-out/in of {result['fan']:,}: "
            f"{result['rate']:,.0f} jobs/s in {result['seconds']:.2f}s (enqueue "
            f"{result['enqueue_seconds']:.2f}s)"
        )
    if "share" in result:
        return (
            f"share on holders {result['share']:.1%} ({result['on_holders']} on holders, "
            f"{result['elsewhere_holder_free']} of {result['elsewhere']} elsewhere while one "
            f"was free); wait {result['wait_preferred_ms']:.1f} ms preferred, "
            f"{result['wait_plain_ms']:.1f} ms plain (+{result['extra_wait_ms']:.1f})"
        )
    if "ratio" in result:
        return (
            f"{result['rate']:,.0f} jobs/s beside the limit, {result['rate_alone']:,.0f} alone "
            f"(×{result['ratio']:.2f}, the median of the rounds' ratios), "
            f"{result['rate_unlimited']:,.0f} beside them unlimited "
            f"(×{result['ratio_unlimited']:.2f}); most at once {result['most_at_once']}"
        )
    text = f"{result.get('seconds', 0):.2f}s"
    if "rate" in result:
        text = f"{result['rate']:,.0f} jobs/s in {result['seconds']:.2f}s"
    if "idle_cpu" in result:
        text += (
            f"; idle CPU {result['idle_cpu']:.2f} % (max {result['idle_cpu_max']:.2f} %), "
            f"connections/proc {result['conns_idle']} idle, {result['conns_drain']} draining"
        )
    return text


# -- tables -------------------------------------------------------------------------------
def cell(m: dict[str, Any] | None, measurement: str) -> str:
    if m is None:
        return "—"
    if "error" in m:
        return "n/a"
    if measurement in LATENCIES:
        return f"{m['p50']:.1f} / {m['p95']:.1f} / {m['p99']:.1f}"
    if measurement == "rescue":
        return f"{m['seconds']:.1f}"
    if measurement == "rebalance":
        return (
            f"{m['kill_owned']:.1f} / {m['expiry_owned']:.2f} / {m['join_owned']:.2f}, "
            f"{m['stolen']:.0f}, {m['double_claims']:.0f}"
        )
    if measurement == "sessions":
        return f"{m['connections']:.0f} conns, {m['kib_per_session']:.0f} KiB each"
    if measurement == "limits":
        return (
            f"{m['rate']:,.0f}, ×{m['ratio_unlimited']:.2f}, ×{m['ratio']:.2f}, "
            f"{m['most_at_once']:.0f}"
        )
    if measurement == "fairness":
        return f"{m['b_p99_plain_ms']:,.0f} / {m['b_p99_fair_ms']:,.0f}"
    if measurement == "ordered":
        return (
            f"{m['rate']:,.0f} / {m['rate_unordered']:,.0f}, ×{m['ratio']:.2f}, "
            f"{m['overlaps'] + m['out_of_order']:.0f}"
        )
    if measurement == "flows":
        return (
            f"{m['child_p50']:.1f}/{m['child_p99']:.1f} beside "
            f"{m['plain_p50']:.1f}/{m['plain_p99']:.1f}; {m['rate']:,.0f}"
        )
    if measurement == "cost":
        return (
            f"{m['utilisation']:.0%}, {m['most_at_once']:.0f}, "
            f"{m['wait_max_cost8_ms']:.0f} / {m['wait_max_cost1_ms']:.0f}"
        )
    if measurement == "affinity":
        return (
            f"{m['share']:.1%}, {m['wait_preferred_ms']:.1f} / {m['wait_plain_ms']:.1f} "
            f"(+{m['extra_wait_ms']:.1f})"
        )
    return f"{m['rate']:,.0f}"


def main_table(report: dict[str, Any]) -> Table | None:
    medians = report["medians"]
    sizes = report["options"]["sizes"]
    used = [c for c in COLUMNS if any(c[0] in medians.get(s, {}) for s in medians)]
    if not used:
        return None
    title = (
        f"plunder bench — medians of {report['options']['repeat']} runs; "
        f"N = {sizes['jobs']:,}, depth: {sizes['depth_jobs']:,} jobs on "
        f"{sizes['deep_small']:,} / {sizes['deep_large']:,}"
    )
    rows = [
        [system, *(cell(by.get(key), key) for key, _ in used)]
        for system, by in medians.items()
        if any(key in by for key, _ in used)
    ]
    return title, ["system", *(t for _, t in used)], rows


def fleet(by_measurement: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Scenario 9's measured counts, fewest processes first, each with its ratio to the
    best count's drain rate."""
    counts = [
        m
        for name, m in by_measurement.items()
        if name.startswith(FLEET_PREFIX) and "error" not in m
    ]
    counts.sort(key=lambda m: m["workers"])
    best = max((m["rate"] for m in counts), default=0.0)
    return [m | {"ratio": m["rate"] / best if best else None} for m in counts]


def fleet_tables(report: dict[str, Any]) -> list[Table]:
    tables: list[Table] = []
    jobs = report["options"]["sizes"].get("fleet_jobs", 0)
    for system, by_measurement in report["medians"].items():
        rows = [
            [
                f"{m['workers']:.0f}",
                f"{m['rate']:,.0f}",
                f"{m['ratio']:.2f}",
                f"{m['idle_cpu']:.2f} / {m['idle_cpu_max']:.2f}",
                f"{m['conns_idle']:.0f} ({m['conns_idle_mean']:.2f}) / "
                f"{m['conns_drain']:.0f} ({m['conns_drain_mean']:.2f})",
                f"{m['enqueue_seconds']:.2f}",
            ]
            for m in fleet(by_measurement)
        ]
        if rows:
            title = (
                f"{system}: cost as the fleet grows — workers `-c 50`, all idle before "
                f"{jobs:,} no-op jobs arrive in batches (scenario 9)"
            )
            tables.append((title, FLEET_HEADERS, rows))
    return tables


def targets_table(report: dict[str, Any], met_no: str) -> Table:
    rows = []
    for row in report["targets"]:
        value = "n/a" if row["value"] is None else f"{row['value']:,.2f} {row['unit']}"
        rows.append([row["target"], value, {True: "yes", False: met_no, None: "—"}[row["met"]]])
    return "targets", ["target", "measured", "met"], rows


def print_tables(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table as RichTable

    console = Console(highlight=False)
    console.width = max(console.width, 170)
    main = main_table(report)
    tables = [*([main] if main else []), *fleet_tables(report), targets_table(report, "NO")]
    for title, headers, rows in tables:
        table = RichTable(title=title)
        for i, header in enumerate(headers):
            table.add_column(header, justify="left" if i == 0 else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    for note in report["notes"]:
        console.print(f"• {note}", soft_wrap=True)


def markdown(report: dict[str, Any]) -> str:
    """The tables as Markdown: the main table first and untitled, each other one under
    its title."""
    main = main_table(report)
    lines: list[str] = []
    for table in [*fleet_tables(report), targets_table(report, "**no**")]:
        lines += ["", table[0], "", *_markdown_rows(table)]
    return "\n".join([*(_markdown_rows(main) if main else []), *lines]).lstrip("\n") + "\n"


def _markdown_rows(table: Table) -> list[str]:
    _, headers, rows = table
    return [
        "| " + " | ".join(headers) + " |",
        "|---|" + "---:|" * (len(headers) - 1),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


# -- targets ------------------------------------------------------------------------------
class Goals:
    """The targets' rows, built one check at a time."""

    def __init__(self, medians: dict[str, dict[str, Any]]) -> None:
        self.medians = medians
        self.rows: list[dict[str, Any]] = []

    def get(self, system: str, measurement: str, key: str = "rate") -> float | None:
        m = self.medians.get(system, {}).get(measurement)
        return None if not m or "error" in m or key not in m else float(m[key])

    def ratio(
        self, name: str, a: float | None, b: float | None, goal: float, higher: bool = True
    ) -> None:
        value = None if a is None or b is None or b == 0 else a / b
        self.check(name, value, goal, "×", higher=higher)

    def check(
        self,
        name: str,
        value: float | None,
        goal: float,
        unit: str,
        *,
        higher: bool = True,
        strict: bool = False,
    ) -> None:
        met = None
        if value is not None:
            met = value >= goal if higher else (value < goal if strict else value <= goal)
        self.rows.append({"target": name, "value": value, "goal": goal, "unit": unit, "met": met})


def targets(medians: dict[str, dict[str, Any]], variants: dict[str, str]) -> list[dict[str, Any]]:
    """The issue's targets, each with what was measured and whether it is met.
    ``variants``: plunder_pg's variant systems and the worker flags that make each."""
    goals = Goals(medians)
    _throughput(goals, variants)
    _latency(goals)
    _depth_and_sqlite(goals)
    _fleet(goals)
    _gateway(goals)
    _limits(goals)
    _affinity(goals)
    return goals.rows


def _limits(goals: Goals) -> None:
    """Scenario 11, on each backend that ran it."""
    for system in ("plunder_pg", "plunder_sqlite"):
        ratio, most = (
            goals.get(system, "limits", "ratio"),
            goals.get(system, "limits", "most_at_once"),
        )
        if ratio is None:
            continue
        # the target: beside the limit, against the same jobs without it; and the
        # stricter one, against the no-ops alone (what the limited jobs cost at all)
        unlimited = goals.get(system, "limits", "ratio_unlimited")
        goals.check(
            f"{system}: no-ops beside a limit of 10 ≥ 0.9× beside it unlimited", unlimited, 0.9, "×"
        )
        goals.check(f"{system}: no-ops beside a limit of 10 ≥ 0.9× alone", ratio, 0.9, "×")
        goals.check(f"{system}: a limit of 10 never exceeded", most, 10.0, "at once", higher=False)


def _throughput(goals: Goals, variants: dict[str, str]) -> None:
    get = goals.get
    for drain in ("drain_1", "drain_2"):
        procs = drain[-1]
        mine, peer = get("plunder_pg", drain), get("pgqueuer", drain)
        goals.ratio(f"plunder drain ({procs} proc) ≥ 2.0× PgQueuer", mine, peer, 2.0)
    goals.ratio(
        "plunder enqueue ≥ 1.0× PgQueuer",
        get("plunder_pg", "enqueue"),
        get("pgqueuer", "enqueue"),
        1.0,
    )
    for drain in ("drain_1", "drain_2"):
        procs = drain[-1]
        mine, bound = get("plunder_pg", drain), get("raw_pg", drain)
        goals.ratio(f"plunder drain ({procs} proc) ≥ 0.5× raw bound (batch 100)", mine, bound, 0.5)
    # the same drains with a worker's options for short jobs (nothing turned off)
    for system, flags in variants.items():
        for drain in ("drain_1", "drain_2"):
            procs = drain[-1]
            mine = get(system, drain)
            name = f"plunder drain ({procs} proc, `{flags}`)"
            goals.ratio(f"{name} ≥ 2.0× PgQueuer", mine, get("pgqueuer", drain), 2.0)
            goals.ratio(f"{name} ≥ 0.5× raw bound", mine, get("raw_pg", drain), 0.5)


def _latency(goals: Goals) -> None:
    get = goals.get
    goals.ratio(
        "enqueue→start (database stamps) p50 ≤ 1.5× raw LISTEN/NOTIFY bound",
        get("plunder_pg", "latency", "p50"),
        get("raw_pg", "latency", "p50"),
        1.5,
        higher=False,
    )
    p99 = get("plunder_pg", "latency", "p99")
    goals.check("enqueue→start (database stamps) p99 ≤ 8 ms", p99, 8.0, "ms", higher=False)
    # the issue's: from before the producer's enqueue call to the task's first line
    for key, goal in (("p50", 2.5), ("p99", 5.0)):
        value = get("plunder_pg", "first_line", key)
        name = f"enqueue call→task's first line {key} ≤ {goal} ms (PostgreSQL)"
        goals.check(name, value, goal, "ms", higher=False)
    rescue = get("plunder_pg", "rescue", "seconds")
    goals.check("rescue ≤ 10 s (defaults)", rescue, 10.0, "s", higher=False)
    _partitions(goals)


def _affinity(goals: Goals) -> None:
    """Scenario 13, where it ran: ≥ 95 % on holders while one was free; a preferred job's
    wait with every holder busy ≤ 10 ms beyond a plain job's."""
    if goals.get("plunder_pg", "affinity", "share") is None:
        return
    share = goals.get("plunder_pg", "affinity", "share")
    goals.check("plunder_pg: affinity, share on free holders", share, 0.95, "", higher=True)
    extra = goals.get("plunder_pg", "affinity", "extra_wait_ms")
    goals.check("plunder_pg: affinity, extra wait with holders busy", extra, 10.0, "ms",
                higher=False)  # fmt: skip


def _partitions(goals: Goals) -> None:
    """Scenario 12, where it ran: full ownership within janitor interval + 1 s (2 s at
    the defaults) of an expiry or a join, and no job claimed twice."""
    for system in ("plunder_pg", "plunder_sqlite"):
        if goals.get(system, "rebalance", "expiry_owned_max") is None:
            continue
        for key, event in (("expiry_owned_max", "an expiry"), ("join_owned_max", "a join")):
            value = goals.get(system, "rebalance", key)
            goals.check(f"{system}: partitions owned ≤ 2 s after {event}", value, 2.0, "s",
                        higher=False)  # fmt: skip
        double = goals.get(system, "rebalance", "double_claims")
        goals.check(f"{system}: no double claims in a rebalance", double, 0.0, "jobs",
                    higher=False)  # fmt: skip


def _depth_and_sqlite(goals: Goals) -> None:
    get = goals.get
    for system, label in (("plunder_pg", "depth"), ("plunder_sqlite", "SQLite depth")):
        goals.ratio(
            f"{label}: drain on large / small depth ≥ 0.8",
            get(system, "depth_large"),
            get(system, "depth_small"),
            0.8,
        )
    drain = get("plunder_sqlite", "drain_1")
    goals.check("SQLite drain, 1 proc ≥ 15,000 jobs/s", drain, 15_000, "jobs/s")
    enqueue = get("plunder_sqlite", "enqueue")
    goals.check("SQLite enqueue ≥ 50,000 jobs/s", enqueue, 50_000, "jobs/s")


def _fleet(goals: Goals) -> None:
    counts = fleet(goals.medians.get("plunder_pg", {}))
    if not counts:
        return
    for m in counts:
        name = f"fleet: drain with {m['workers']:.0f} idle procs ≥ 0.8× the best count"
        goals.check(name, m["ratio"], 0.8, "×")
    idle = max(m["idle_cpu_max"] for m in counts)
    goals.check(
        "fleet: an idle worker < 1 % of a core (most, any count)",
        idle,
        1.0,
        "%",
        higher=False,
        strict=True,
    )
    held = max(max(m["conns_idle"], m["conns_drain"]) for m in counts)
    goals.check(
        "fleet: ≤ 3 connections per worker (most, any count)", held, 3.0, "conns", higher=False
    )


def _gateway(goals: Goals) -> None:
    """Through the gateway (plunder_gw), against the direct path in the same run."""
    get = goals.get
    goals.ratio(
        "gateway: remote drain (1 proc, 1 gateway) ≥ 0.5× direct",
        get("plunder_gw", "drain_1"),
        get("plunder_pg", "drain_1"),
        0.5,
    )
    goals.ratio(
        "gateway: 2 procs through 2 gateways > 1.0× through 1",
        get("plunder_gw", "drain_2gw"),
        get("plunder_gw", "drain_2"),
        1.0,
    )
    for key, goal in (("p50", 5.0), ("p99", 15.0)):
        name = f"gateway: enqueue call→task's first line {key} ≤ {goal:g} ms"
        goals.check(name, get("plunder_gw", "first_line", key), goal, "ms", higher=False)
    connections = get("plunder_gw", "sessions", "connections")
    goals.check("gateway: 200 sessions on ≤ 10 connections", connections, 10.0, "conns",
                higher=False)  # fmt: skip
