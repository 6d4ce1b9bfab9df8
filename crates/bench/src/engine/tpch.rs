//! TPC-H against DuckDB, DataFusion and Polars on the same generated rows (CSV handed to a
//! Python script in the venv of scripts/engine-venv.sh), all with the same thread count.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use bypass_engine::engine::{Engine, EngineSettings};
use bypass_engine::exec::Tier;
use bypass_engine::runtime::{RuntimeKind, RuntimeSettings};
use bypass_engine::tpch;
use bypass_engine::types::{add_months, format_date, parse_date, DataType, Value};

/// The peer script, shipped with the crate.
const PEERS_SCRIPT: &str = include_str!("../../engine/peers.py");
/// The peers, each run in a process of its own so its memory figures are its alone.
const PEERS: [&str; 3] = ["duckdb", "datafusion", "polars"];
/// Relative tolerance when answers are compared across engines.
const ANSWER_TOLERANCE: f64 = 1e-6;

/// Each query's rows as text, the reference the peers' answers are checked against.
pub type Answers = BTreeMap<u8, Vec<Vec<String>>>;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueryTimes {
    pub times_ms: Vec<f64>,
    pub min_ms: Option<f64>,
    pub median_ms: Option<f64>,
    /// Whether the answer equals the engine's (rows and values within 1e-6 relative).
    pub same_answer_as_bypass: Option<bool>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EngineTimes {
    pub version: String,
    pub load_s: f64,
    pub queries: BTreeMap<u8, QueryTimes>,
    /// Geometric mean of the per-query minimum times over the queries every engine answered.
    pub geomean_ms: Option<f64>,
    /// Geometric mean over all 22 queries; None when this engine missed one.
    #[serde(default)]
    pub geomean_all_ms: Option<f64>,
    /// Resident set once the tables are loaded.
    #[serde(default)]
    pub rss_after_load_bytes: Option<u64>,
    /// Peak resident set while the queries ran (tables included; the peak is reset after loading).
    #[serde(default)]
    pub peak_rss_queries_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TpchReport {
    pub scale_factor: f64,
    pub threads: usize,
    pub runs: usize,
    pub engines: BTreeMap<String, EngineTimes>,
}

/// `date 'Y-M-D' ± interval 'N' unit` folded into a date literal, for engines whose SQL
/// front ends lack interval arithmetic (all share the folded text, ours included).
pub fn portable_query(sql: &str) -> String {
    const DATE: &str = "date '";
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(start) = rest.find(DATE) {
        out.push_str(&rest[..start]);
        let candidate = &rest[start..];
        match fold_interval(candidate) {
            Some((used, literal)) => {
                out.push_str(&literal);
                rest = &candidate[used..];
            }
            None => {
                out.push_str(DATE);
                rest = &candidate[DATE.len()..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Parses `date 'D' (+|-) interval 'N' unit` at the start of `text`: (bytes used, literal).
fn fold_interval(text: &str) -> Option<(usize, String)> {
    let rest = text.strip_prefix("date '")?;
    let date_end = rest.find('\'')?;
    let date = parse_date(&rest[..date_end]).ok()?;
    let after = &rest[date_end + 1..];
    let trimmed = after.trim_start();
    let sign = match trimmed.chars().next()? {
        '+' => 1,
        '-' => -1,
        _ => return None,
    };
    let interval = trimmed[1..].trim_start().strip_prefix("interval '")?;
    let amount_end = interval.find('\'')?;
    let amount: i32 = interval[..amount_end].trim().parse().ok()?;
    let unit_text = interval[amount_end + 1..].trim_start();
    let unit: String = unit_text.chars().take_while(|c| c.is_alphabetic()).collect();
    let folded = match unit.to_lowercase().trim_end_matches('s') {
        "day" => date + sign * amount,
        "month" => add_months(date, sign * amount),
        "year" => add_months(date, sign * amount * 12),
        _ => return None,
    };
    let consumed = text.len() - unit_text.len() + unit.len();
    Some((consumed, format!("date '{}'", format_date(folded))))
}

pub(crate) fn type_name(data_type: DataType) -> String {
    match data_type {
        DataType::Bool => "bool".into(),
        DataType::Int16 => "int16".into(),
        DataType::Int32 => "int32".into(),
        DataType::Int64 => "int64".into(),
        DataType::Float32 => "float32".into(),
        DataType::Float64 => "float64".into(),
        DataType::Date => "date".into(),
        DataType::Decimal { precision, scale } => format!("decimal({precision},{scale})"),
        DataType::Text | DataType::Char(_) | DataType::Varchar(_) => "text".into(),
        DataType::Numeric => "numeric".into(),
        DataType::Timestamp => "timestamp".into(),
        DataType::TimestampTz => "timestamptz".into(),
        DataType::Interval => "interval".into(),
    }
}

fn csv_cell(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::Text(s) => format!("\"{}\"", s.replace('"', "\"\"")),
        other => other.to_string(),
    }
}

/// Writes every table as `<dir>/<name>.csv` (no header) for the peers.
pub fn export_csv(engine: &Engine, dir: &Path) -> anyhow::Result<()> {
    for name in tpch::TABLES {
        let table = engine.table(name)?;
        let file = std::fs::File::create(dir.join(format!("{name}.csv")))?;
        let mut writer = std::io::BufWriter::with_capacity(1 << 20, file);
        for (index, chunk) in table.chunks.iter().enumerate() {
            for row in 0..chunk.rows {
                let cells: Vec<String> = table.row_values(index, row).iter().map(csv_cell).collect();
                writeln!(writer, "{}", cells.join(","))?;
            }
        }
        writer.flush()?;
    }
    Ok(())
}

fn summarize(times_ms: Vec<f64>, error: Option<String>) -> QueryTimes {
    QueryTimes {
        min_ms: times_ms.iter().copied().min_by(f64::total_cmp),
        median_ms: crate::report::stats::median(&times_ms),
        times_ms,
        same_answer_as_bypass: None,
        error,
    }
}

/// Times the engine (2 workers by default, specialized, compiled) on every supported query.
pub fn run_bypass(engine: &Engine, runs: usize) -> anyhow::Result<(EngineTimes, Answers)> {
    let mut queries = BTreeMap::new();
    let mut answers = BTreeMap::new();
    for number in tpch::SUPPORTED_QUERIES {
        let sql = portable_query(tpch::query(number).expect("supported"));
        let warm = engine.query(&sql)?;
        answers.insert(number, warm.rows().iter().map(|r| r.iter().map(|v| v.to_string()).collect()).collect());
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            let started = Instant::now();
            engine.query(&sql)?;
            times.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        queries.insert(number, summarize(times, None));
    }
    let times = EngineTimes {
        version: env!("CARGO_PKG_VERSION").into(),
        load_s: 0.0,
        queries,
        geomean_ms: None,
        geomean_all_ms: None,
        rss_after_load_bytes: None,
        peak_rss_queries_bytes: None,
    };
    Ok((times, answers))
}

fn cells_match(ours: &str, theirs: Option<&str>) -> bool {
    let Some(theirs) = theirs else { return ours.is_empty() };
    if ours == theirs {
        return true;
    }
    match (ours.parse::<f64>(), theirs.parse::<f64>()) {
        (Ok(a), Ok(b)) => (a - b).abs() <= ANSWER_TOLERANCE * a.abs().max(b.abs()).max(1.0),
        _ => false,
    }
}

/// Runs the peers through the Python script and folds their output into reports.
pub fn run_peers(
    python: &Path,
    data_dir: &Path,
    threads: usize,
    runs: usize,
    answers: &Answers,
) -> anyhow::Result<BTreeMap<String, EngineTimes>> {
    let tables: BTreeMap<&str, Vec<(String, String)>> = tpch::TABLES
        .iter()
        .map(|&name| {
            let columns = tpch::table_schema(name).expect("known table");
            (name, columns.iter().map(|c| (c.name.clone(), type_name(c.data_type))).collect())
        })
        .collect();
    let queries: BTreeMap<String, String> = tpch::SUPPORTED_QUERIES
        .iter()
        .map(|&n| (n.to_string(), portable_query(tpch::query(n).expect("supported"))))
        .collect();
    let script_path = data_dir.join("peers.py");
    std::fs::write(&script_path, PEERS_SCRIPT)?;
    let mut engines = BTreeMap::new();
    for name in PEERS {
        let job = serde_json::json!({
            "data_dir": data_dir, "threads": threads, "runs": runs, "tables": tables, "queries": queries,
            "engines": [name],
        });
        let job_path = data_dir.join(format!("job-{name}.json"));
        std::fs::write(&job_path, serde_json::to_vec(&job)?)?;
        eprintln!("TPC-H: {name} …");
        let output = std::process::Command::new(python)
            .arg(&script_path)
            .arg(&job_path)
            .output()
            .with_context(|| format!("running {}", python.display()))?;
        // A peer that dies (out of memory, a crash in its library) is a recorded result, not the end.
        let parsed = if output.status.success() {
            serde_json::from_slice(&output.stdout).context("peer script output")?
        } else {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let tail: String = stderr.chars().rev().take(300).collect::<Vec<_>>().into_iter().rev().collect();
            serde_json::json!({ name: { "error": format!("{}: {tail}", output.status) } })
        };
        engines.insert(name.to_string(), peer_times(&parsed[name], answers));
    }
    Ok(engines)
}

fn peer_times(value: &serde_json::Value, answers: &Answers) -> EngineTimes {
    let mut queries = BTreeMap::new();
    for &number in &tpch::SUPPORTED_QUERIES {
        let entry = &value["queries"][number.to_string()];
        let times: Vec<f64> =
            entry["times_ms"].as_array().map_or_else(Vec::new, |a| a.iter().filter_map(|t| t.as_f64()).collect());
        let error = entry["error"].as_str().map(str::to_string).or_else(|| value["error"].as_str().map(str::to_string));
        let mut summary = summarize(times, error);
        if let (Some(rows), Some(ours)) = (entry["rows"].as_array(), answers.get(&number)) {
            let same = rows.len() == ours.len()
                && rows.iter().zip(ours).all(|(row, our_row)| {
                    let cells = row.as_array().cloned().unwrap_or_default();
                    cells.len() == our_row.len() && cells.iter().zip(our_row).all(|(c, o)| cells_match(o, c.as_str()))
                });
            summary.same_answer_as_bypass = Some(same);
        }
        queries.insert(number, summary);
    }
    EngineTimes {
        version: value["version"].as_str().unwrap_or("unavailable").to_string(),
        load_s: value["load_s"].as_f64().unwrap_or(0.0),
        queries,
        geomean_ms: None,
        geomean_all_ms: None,
        rss_after_load_bytes: value["rss_after_load_bytes"].as_u64(),
        peak_rss_queries_bytes: value["peak_rss_queries_bytes"].as_u64(),
    }
}

/// Fills each engine's geometric mean over the queries that every engine answered.
pub fn add_geomeans(engines: &mut BTreeMap<String, EngineTimes>) {
    let common: Vec<u8> = tpch::SUPPORTED_QUERIES
        .iter()
        .copied()
        .filter(|q| engines.values().all(|e| e.queries.get(q).is_some_and(|t| t.min_ms.is_some())))
        .collect();
    for engine in engines.values_mut() {
        engine.geomean_ms = geomean(engine, &common);
        engine.geomean_all_ms = geomean(engine, &tpch::SUPPORTED_QUERIES);
    }
}

/// Geometric mean of `engine`'s minimum times over `queries`; None if it missed one of them.
fn geomean(engine: &EngineTimes, queries: &[u8]) -> Option<f64> {
    if queries.is_empty() {
        return None;
    }
    let logs: Option<Vec<f64>> = queries.iter().map(|q| engine.queries.get(q)?.min_ms.map(f64::ln)).collect();
    Some((logs?.iter().sum::<f64>() / queries.len() as f64).exp())
}

/// `VmRSS` or `VmHWM` of this process from /proc/self/status, in bytes.
fn resident_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))?;
    let kib: u64 = line.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// Resets this process's peak resident set (VmHWM) to its current size, so the peak read
/// later is the queries' and not the data generator's or an earlier section's.
fn reset_peak_resident() -> anyhow::Result<()> {
    std::fs::write("/proc/self/clear_refs", "5").context("resetting the peak resident set")
}

/// Generates TPC-H, runs the engine and the peers. `python` None = engine only.
pub fn run(scale_factor: f64, threads: usize, runs: usize, python: Option<&Path>) -> anyhow::Result<TpchReport> {
    let runtime = RuntimeSettings { kind: RuntimeKind::Specialized, workers: threads, ..RuntimeSettings::default() };
    let engine = Engine::new(EngineSettings { runtime, tier: Tier::Compiled, ..EngineSettings::default() })?;
    let started = Instant::now();
    tpch::load(&engine, scale_factor)?;
    let load_s = started.elapsed().as_secs_f64();
    let rss_after_load_bytes = resident_bytes("VmRSS");
    reset_peak_resident()?;
    let (mut bypass, answers) = run_bypass(&engine, runs)?;
    bypass.load_s = load_s;
    bypass.rss_after_load_bytes = rss_after_load_bytes;
    bypass.peak_rss_queries_bytes = resident_bytes("VmHWM");
    let mut engines = BTreeMap::new();
    if let Some(python) = python {
        let dir = tempfile::Builder::new().prefix("bypass-engine-bench-").tempdir()?;
        export_csv(&engine, dir.path())?;
        drop(engine);
        engines = run_peers(python, dir.path(), threads, runs, &answers)?;
    }
    engines.insert("bypass".to_string(), bypass);
    add_geomeans(&mut engines);
    Ok(TpchReport { scale_factor, threads, runs, engines })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: interval arithmetic is folded into literal dates exactly as the engine evaluates
    // it; method: the TPC-H texts with intervals, checked against hand-computed dates.
    #[test]
    fn folds_interval_arithmetic() {
        assert_eq!(portable_query("where d <= date '1998-12-01' - interval '90' day"), "where d <= date '1998-09-02'");
        let q5 = portable_query(tpch::query(5).expect("supported"));
        assert!(q5.contains("< date '1995-01-01'") && !q5.contains("interval"), "{q5}");
        let q10 = portable_query(tpch::query(10).expect("supported"));
        assert!(q10.contains("< date '1994-01-01'") && !q10.contains("interval"), "{q10}");
        for number in tpch::SUPPORTED_QUERIES {
            assert!(!portable_query(tpch::query(number).expect("supported")).contains("interval"), "Q{number}");
        }
    }
}
