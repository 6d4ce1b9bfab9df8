"""DuckDB's memory on the engine's own TPC-H rows, for `bypass bench engine-serving`.

Called with a JSON job file:
  {"data_dir": ..., "threads": 2, "tables": {name: [[column, type], ...]}, "scan": "select ..."}
Loads every CSV with DuckDB's own reader into an in-memory database, then streams the scan in
record batches (as a server would send it). Prints one JSON object:
  {"version", "load_s", "rss_after_load_mib", "first_batch_ms", "scan_s", "scan_rows",
   "peak_rss_mib", "rss_after_drop_mib"}
"""
import json
import os
import resource
import sys
import time


def rss_mib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return None


def duck_type(kind):
    if kind.startswith("decimal"):
        return kind.upper()
    return {"int32": "INTEGER", "int64": "BIGINT", "date": "DATE", "float64": "DOUBLE",
            "bool": "BOOLEAN", "numeric": "DOUBLE"}.get(kind, "VARCHAR")


def main():
    import duckdb
    job = json.load(open(sys.argv[1]))
    con = duckdb.connect()
    con.execute(f"SET threads = {job['threads']}")
    started = time.perf_counter()
    for name, columns in job["tables"].items():
        spec = ", ".join(f"'{c}': '{duck_type(k)}'" for c, k in columns)
        path = os.path.join(job["data_dir"], name + ".csv")
        con.execute(
            f"CREATE TABLE {name} AS SELECT * FROM read_csv('{path}', header=false, columns={{{spec}}})"
        )
    load_s = time.perf_counter() - started
    after_load = rss_mib("VmRSS")
    started = time.perf_counter()
    reader = con.execute(job["scan"]).to_arrow_reader(2048)
    first_batch_ms = None
    rows = 0
    for batch in reader:
        if first_batch_ms is None:
            first_batch_ms = (time.perf_counter() - started) * 1000.0
        rows += batch.num_rows
    scan_s = time.perf_counter() - started
    peak = rss_mib("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    for name in job["tables"]:
        con.execute(f"DROP TABLE {name}")
    con.execute("CHECKPOINT")
    time.sleep(1.0)
    print(json.dumps({
        "version": duckdb.__version__, "load_s": load_s, "rss_after_load_mib": after_load,
        "first_batch_ms": first_batch_ms, "scan_s": scan_s, "scan_rows": rows,
        "peak_rss_mib": peak, "rss_after_drop_mib": rss_mib("VmRSS"),
    }))


main()
