"""Run one measurement of one system in this interpreter and print its result.

    python -m bench.runner SYSTEM MEASUREMENT PARAMS_JSON

The harness starts this under the main interpreter for plunder and the raw bounds, and
under ``bench/.venv/bin/python`` for the peers, so no peer library is ever imported into
the harness (or into plunder's environment).
"""

from __future__ import annotations

import importlib
import sys
import traceback

from bench.common import BenchError, Params, emit

MODULES = {
    "plunder_pg": "bench.systems.plunder",
    "plunder_pg_serial": "bench.systems.plunder",
    "plunder_pg_process": "bench.systems.plunder",
    "plunder_pg_metrics": "bench.systems.plunder",
    "plunder_pg_default": "bench.systems.plunder",
    "plunder_sqlite": "bench.systems.plunder",
    "plunder_gw": "bench.systems.plunder_gateway",
    "raw_pg": "bench.systems.raw_pg",
    "raw_sqlite": "bench.systems.raw_sqlite",
    "pgqueuer": "bench.systems.pgqueuer",
    "procrastinate": "bench.systems.procrastinate",
    "dbos_pg": "bench.systems.dbos",
    "dbos_sqlite": "bench.systems.dbos",
}


def main(argv: list[str]) -> int:
    system, measurement, params = argv[0], argv[1], Params.from_json(argv[2])
    module = importlib.import_module(MODULES[system])
    try:
        result = module.SCENARIOS[measurement](params)
    except BenchError as exc:
        emit({"error": str(exc)})
        return 0
    except Exception as exc:
        traceback.print_exc()
        emit({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
