"""Runs TPC-H queries in DuckDB, DataFusion and Polars on the engine's own generated data.

Called by `bypass bench engine` with a JSON job file:
  {"data_dir": ..., "threads": 2, "runs": 5, "tables": {name: [[column, type], ...]},
   "queries": {"1": "select ...", ...}, "engines": ["duckdb", "datafusion", "polars"]}
Types: int32, int64, decimal(p,s), date, text. Prints one JSON object:
  {engine: {"version": ..., "load_s": ..., "queries": {q: {"times_ms": [...], "rows": [[...]], "error": ...}}}}
Each engine gets the same CSV files, loaded into memory first (not timed with the queries).
"""
import json
import os
import sys
import time


def arrow_schema(columns):
    import pyarrow as pa
    fields = []
    for name, kind in columns:
        if kind == "int32":
            t = pa.int32()
        elif kind == "int64":
            t = pa.int64()
        elif kind.startswith("decimal"):
            precision, scale = kind[len("decimal("):-1].split(",")
            t = pa.decimal128(int(precision), int(scale))
        elif kind == "date":
            t = pa.date32()
        elif kind == "float64":
            t = pa.float64()
        elif kind == "bool":
            t = pa.bool_()
        else:
            t = pa.string()
        fields.append(pa.field(name, t))
    return pa.schema(fields)


def read_tables(job):
    import pyarrow.csv as csv
    tables = {}
    for name, columns in job["tables"].items():
        schema = arrow_schema(columns)
        path = os.path.join(job["data_dir"], name + ".csv")
        tables[name] = csv.read_csv(
            path,
            read_options=csv.ReadOptions(column_names=[c for c, _ in columns]),
            convert_options=csv.ConvertOptions(column_types=schema, strings_can_be_null=False),
        )
    return tables


def cell(value):
    if value is None:
        return None
    return str(value)


def time_queries(job, run_one):
    results = {}
    for number, sql in job["queries"].items():
        entry = {"times_ms": [], "rows": None, "error": None}
        try:
            rows = run_one(sql)  # warm-up, also the answer
            entry["rows"] = [[cell(v) for v in row] for row in rows]
            for _ in range(job["runs"]):
                started = time.perf_counter()
                run_one(sql)
                entry["times_ms"].append((time.perf_counter() - started) * 1000.0)
        except Exception as error:  # a failing query is a recorded result, not the end
            entry["error"] = f"{type(error).__name__}: {error}"[:300]
        results[number] = entry
    return results


def run_duckdb(job, tables):
    import duckdb
    started = time.perf_counter()
    con = duckdb.connect()
    con.execute(f"SET threads = {job['threads']}")
    for name, table in tables.items():
        con.register("arrow_input", table)
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM arrow_input")
        con.unregister("arrow_input")
    load_s = time.perf_counter() - started
    queries = time_queries(job, lambda sql: con.execute(sql).fetchall())
    return {"version": duckdb.__version__, "load_s": load_s, "queries": queries}


def run_datafusion(job, tables):
    import datafusion
    started = time.perf_counter()
    config = datafusion.SessionConfig().with_target_partitions(job["threads"])
    ctx = datafusion.SessionContext(config)
    for name, table in tables.items():
        batches = table.to_batches(max_chunksize=8192)
        parts = [batches[i::job["threads"]] for i in range(job["threads"])]
        parts = [p for p in parts if p] or [batches]
        ctx.register_record_batches(name, parts)
    load_s = time.perf_counter() - started

    def run(sql):
        batches = ctx.sql(sql).collect()
        rows = []
        for batch in batches:
            rows.extend(tuple(r.values()) for r in batch.to_pylist())
        return rows

    queries = time_queries(job, run)
    return {"version": datafusion.__version__, "load_s": load_s, "queries": queries}


def run_polars(job, tables):
    import polars as pl
    started = time.perf_counter()
    frames = {name: pl.from_arrow(table) for name, table in tables.items()}
    context = pl.SQLContext(frames=frames)
    load_s = time.perf_counter() - started
    queries = time_queries(job, lambda sql: context.execute(sql, eager=True).rows())
    return {"version": pl.__version__, "load_s": load_s, "queries": queries}


def main():
    job = json.load(open(sys.argv[1]))
    os.environ["POLARS_MAX_THREADS"] = str(job["threads"])
    tables = read_tables(job)
    runners = {"duckdb": run_duckdb, "datafusion": run_datafusion, "polars": run_polars}
    output = {}
    for engine in job["engines"]:
        try:
            output[engine] = runners[engine](job, tables)
        except Exception as error:
            output[engine] = {"error": f"{type(error).__name__}: {error}"[:300]}
    json.dump(output, sys.stdout)


if __name__ == "__main__":
    main()
