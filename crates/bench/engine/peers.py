"""Runs TPC-H queries in DuckDB, DataFusion and Polars on the engine's own generated data.

Called by `bypass bench engine` with a JSON job file:
  {"data_dir": ..., "threads": 2, "runs": 5, "tables": {name: [[column, type], ...]},
   "queries": {"1": "select ...", ...}, "engines": ["duckdb", "datafusion", "polars"]}
Types: int32, int64, decimal(p,s), date, text. Prints one JSON object:
  {engine: {"version": ..., "load_s": ..., "rss_after_load_bytes": ..., "peak_rss_queries_bytes": ...,
            "queries": {q: {"times_ms": [...], "rows": [[...]], "error": ...}}}}
Each engine gets the same CSV files, loaded into memory first (not timed with the queries).
The caller runs one engine per process so memory figures are that engine's alone: the peak
resident set is reset after loading (/proc/self/clear_refs) and read after the last query.
"""
import gc
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


def resident_bytes(field):
    """VmRSS or VmHWM of this process, in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return None


def release_arrow_memory():
    """Hands Arrow's freed buffers back to the system, so the input does not count as the engine's."""
    import pyarrow as pa
    pa.default_memory_pool().release_unused()


def reset_peak_resident():
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


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


def load_duckdb(job, tables):
    import duckdb
    con = duckdb.connect()
    con.execute(f"SET threads = {job['threads']}")
    for name, table in tables.items():
        con.register("arrow_input", table)
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM arrow_input")
        con.unregister("arrow_input")
    tables.clear()  # DuckDB holds its own copy; the Arrow input would only inflate its memory
    return duckdb.__version__, lambda sql: con.execute(sql).fetchall()


def load_datafusion(job, tables):
    import datafusion
    config = datafusion.SessionConfig().with_target_partitions(job["threads"])
    ctx = datafusion.SessionContext(config)
    for name, table in tables.items():
        batches = table.to_batches(max_chunksize=8192)
        parts = [batches[i::job["threads"]] for i in range(job["threads"])]
        parts = [p for p in parts if p] or [batches]
        ctx.register_record_batches(name, parts)

    def run(sql):
        batches = ctx.sql(sql).collect()
        rows = []
        for batch in batches:
            rows.extend(tuple(r.values()) for r in batch.to_pylist())
        return rows

    return datafusion.__version__, run


def load_polars(job, tables):
    import polars as pl
    frames = {name: pl.from_arrow(table) for name, table in tables.items()}
    context = pl.SQLContext(frames=frames)
    return pl.__version__, lambda sql: context.execute(sql, eager=True).rows()


LOADERS = {"duckdb": load_duckdb, "datafusion": load_datafusion, "polars": load_polars}


def run_engine(job, engine):
    """Loads the CSV files into `engine`, then times every query; memory as the module says."""
    tables = read_tables(job)
    started = time.perf_counter()
    version, run_one = LOADERS[engine](job, tables)
    del tables
    gc.collect()
    release_arrow_memory()
    load_s = time.perf_counter() - started
    rss_after_load = resident_bytes("VmRSS")
    reset_peak_resident()
    queries = time_queries(job, run_one)
    return {
        "version": version,
        "load_s": load_s,
        "rss_after_load_bytes": rss_after_load,
        "peak_rss_queries_bytes": resident_bytes("VmHWM"),
        "queries": queries,
    }


def main():
    job = json.load(open(sys.argv[1]))
    os.environ["POLARS_MAX_THREADS"] = str(job["threads"])
    output = {}
    for engine in job["engines"]:
        try:
            output[engine] = run_engine(job, engine)
        except Exception as error:
            output[engine] = {"error": f"{type(error).__name__}: {error}"[:300]}
    json.dump(output, sys.stdout)


if __name__ == "__main__":
    main()
