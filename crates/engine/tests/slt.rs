//! sqllogictest files (tests/slt/*.slt) run against the engine and, as the oracle, a real
//! PostgreSQL with the same statements.
//!
//! Records: `statement ok`, `statement error [SQLSTATE]` (PostgreSQL must fail with the same
//! SQLSTATE, except for 0A000, which marks features the engine refuses and PostgreSQL has),
//! and `query <types> [rowsort]` followed by the
//! SQL, `----` and the expected rows (cells separated by spaces, NULL as `NULL`, empty text as
//! `(empty)`). Every query's rows must equal the expected ones in the engine *and* in
//! PostgreSQL; numbers compare within a relative 1e-9 (AVG and decimal division are float64 in
//! the engine). `SLT_COMPLETE=1` rewrites the expected rows from PostgreSQL's answers;
//! `SLT_ONLY=name` runs only the files whose path contains `name`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use bypass_engine::types::Value;
use bypass_engine::{Engine, EngineSettings};
use bypass_testkit::{pg_bin, Postgres};

const SEPARATOR: &str = "\x1f";

#[derive(Debug)]
enum Record {
    /// Comment lines, kept when expected rows are rewritten.
    Comment(String),
    Statement {
        sql: String,
        error: Option<Option<String>>,
        line: usize,
    },
    Query {
        sql: String,
        columns: usize,
        rowsort: bool,
        expected: Vec<String>,
        line: usize,
        header_line: String,
    },
}

fn parse(text: &str) -> anyhow::Result<Vec<Record>> {
    let lines: Vec<&str> = text.lines().collect();
    let mut records = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if line.is_empty() {
            i += 1;
            continue;
        }
        if line.starts_with('#') {
            let mut comment = Vec::new();
            while i < lines.len() && lines[i].trim().starts_with('#') {
                comment.push(lines[i]);
                i += 1;
            }
            records.push(Record::Comment(comment.join("\n")));
            continue;
        }
        let start = i + 1;
        let header: Vec<&str> = line.split_whitespace().collect();
        i += 1;
        let mut sql = Vec::new();
        while i < lines.len() && !lines[i].trim().is_empty() && lines[i].trim() != "----" {
            sql.push(lines[i]);
            i += 1;
        }
        let sql = sql.join("\n");
        match header.as_slice() {
            ["statement", "ok"] => records.push(Record::Statement { sql, error: None, line: start }),
            ["statement", "error", rest @ ..] => {
                records.push(Record::Statement { sql, error: Some(rest.first().map(|s| s.to_string())), line: start })
            }
            ["query", types, rest @ ..] => {
                let mut expected = Vec::new();
                if i < lines.len() && lines[i].trim() == "----" {
                    i += 1;
                    while i < lines.len() && !lines[i].trim().is_empty() {
                        expected.push(lines[i].trim().to_string());
                        i += 1;
                    }
                }
                let rowsort = rest.contains(&"rowsort");
                records.push(Record::Query {
                    sql,
                    columns: types.len(),
                    rowsort,
                    expected,
                    line: start,
                    header_line: line.to_string(),
                });
            }
            other => anyhow::bail!("line {start}: unknown record {other:?}"),
        }
    }
    Ok(records)
}

fn cell_text(text: &str) -> String {
    if text.is_empty() {
        "(empty)".to_string()
    } else {
        text.replace(' ', "_")
    }
}

fn engine_value(value: &Value) -> String {
    match value {
        Value::Null => "NULL".to_string(),
        other => cell_text(&other.to_string()),
    }
}

struct Oracle<'p> {
    postgres: &'p Postgres,
    database: String,
}

impl Oracle<'_> {
    fn run(&self, sql: &str) -> anyhow::Result<Result<Vec<Vec<String>>, String>> {
        let output = Command::new(pg_bin("psql"))
            .args(["-X", "-A", "-t", "-q", "-F", SEPARATOR, "-P", "null=\u{2400}", "-v", "ON_ERROR_STOP=1"])
            .args(["-v", "VERBOSITY=verbose"])
            .args(["-h", self.postgres.host(), "-p", &self.postgres.port().to_string(), "-U", "postgres"])
            .args(["-d", &self.database, "-c", sql])
            .env("LC_ALL", "C")
            .env("PGTZ", "UTC")
            .output()?;
        if !output.status.success() {
            return Ok(Err(String::from_utf8_lossy(&output.stderr).to_string()));
        }
        let text = String::from_utf8(output.stdout)?;
        Ok(Ok(text
            .lines()
            .map(|l| {
                l.split(SEPARATOR).map(|c| if c == "\u{2400}" { "NULL".to_string() } else { cell_text(c) }).collect()
            })
            .collect()))
    }
}

/// The SQLSTATE in psql's verbose error text (`ERROR:  22012: division by zero`).
fn postgres_sqlstate(stderr: &str) -> Option<&str> {
    let after = stderr.split("ERROR:").nth(1)?.trim_start();
    let code = after.get(..5)?;
    (after.get(5..6) == Some(":")).then_some(code)
}

fn rows_text(rows: Vec<Vec<String>>, rowsort: bool) -> Vec<String> {
    let mut lines: Vec<String> = rows.into_iter().map(|r| r.join(" ")).collect();
    if rowsort {
        lines.sort();
    }
    lines
}

fn lines_match(ours: &[String], theirs: &[String]) -> bool {
    ours.len() == theirs.len()
        && ours.iter().zip(theirs).all(|(a, b)| {
            let (x, y): (Vec<&str>, Vec<&str>) = (a.split(' ').collect(), b.split(' ').collect());
            x.len() == y.len() && x.iter().zip(&y).all(|(p, q)| common::cells_match(p, q))
        })
}

/// Runs one file; returns the failures and, in completion mode, the rewritten text.
fn run_file(path: &Path, postgres: &Postgres, complete: bool) -> anyhow::Result<(Vec<String>, String)> {
    let data_dir = path.parent().expect("slt files live in a directory").join("data");
    let text = std::fs::read_to_string(path)?.replace("__DATA__", &data_dir.display().to_string());
    let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("slt").replace('-', "_");
    let database = format!("slt_{name}");
    postgres.psql(&format!("drop database if exists {database}"))?;
    postgres.psql(&format!("create database {database}"))?;
    let oracle = Oracle { postgres, database };
    let engine = Engine::new(EngineSettings::default())?;
    let mut failures = Vec::new();
    let mut rewritten = Vec::new();
    for record in parse(&text)? {
        match record {
            Record::Comment(text) => rewritten.push(format!("{text}\n")),
            Record::Statement { sql, error, line } => {
                let ours = engine.execute(&sql);
                match (&error, ours) {
                    (None, Err(e)) => failures.push(format!("line {line}: engine failed: {e}\n{sql}")),
                    (Some(_), Ok(_)) => {
                        failures.push(format!("line {line}: engine accepted a statement that must fail\n{sql}"))
                    }
                    (Some(Some(state)), Err(e)) if e.sqlstate() != state => {
                        failures.push(format!("line {line}: SQLSTATE {} ({e}), expected {state}", e.sqlstate()))
                    }
                    _ => {}
                }
                match (&error, oracle.run(&sql)?) {
                    (None, Err(e)) => failures.push(format!("line {line}: PostgreSQL failed: {e}")),
                    (Some(Some(state)), Ok(_)) if state != "0A000" => {
                        failures.push(format!("line {line}: PostgreSQL accepted a statement that must fail"))
                    }
                    (Some(Some(state)), Err(e))
                        if state != "0A000" && postgres_sqlstate(&e) != Some(state.as_str()) =>
                    {
                        failures.push(format!("line {line}: PostgreSQL failed differently from {state}: {e}"))
                    }
                    _ => {}
                }
                let header = match &error {
                    None => "statement ok".to_string(),
                    Some(None) => "statement error".to_string(),
                    Some(Some(state)) => format!("statement error {state}"),
                };
                rewritten.push(format!("{header}\n{sql}\n"));
            }
            Record::Query { sql, columns, rowsort, expected, line, header_line } => {
                let theirs = match oracle.run(&sql)? {
                    Ok(rows) => rows_text(rows, rowsort),
                    Err(e) => {
                        failures.push(format!("line {line}: PostgreSQL failed: {e}"));
                        Vec::new()
                    }
                };
                let ours = match engine.query(&sql) {
                    Ok(result) => {
                        if result.names.len() != columns {
                            failures.push(format!(
                                "line {line}: {} columns, the record says {columns}",
                                result.names.len()
                            ));
                        }
                        rows_text(result.rows().iter().map(|r| r.iter().map(engine_value).collect()).collect(), rowsort)
                    }
                    Err(e) => {
                        failures.push(format!("line {line}: engine failed: {e}\n{sql}"));
                        Vec::new()
                    }
                };
                let expected = if complete { theirs.clone() } else { expected };
                if !lines_match(&theirs, &expected) {
                    failures.push(format!("line {line}: PostgreSQL {theirs:?} vs expected {expected:?}"));
                }
                if !lines_match(&ours, &expected) {
                    failures.push(format!("line {line}: engine {ours:?} vs expected {expected:?}\n{sql}"));
                }
                rewritten.push(format!("{header_line}\n{sql}\n----\n{}\n", expected.join("\n")));
            }
        }
    }
    Ok((failures, rewritten.join("\n")))
}

fn slt_files() -> anyhow::Result<Vec<PathBuf>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/slt");
    // `SLT_ONLY=name` runs the files whose path contains `name` (while working on one).
    let only = std::env::var("SLT_ONLY").ok();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "slt"))
        .filter(|p| only.as_deref().is_none_or(|only| p.to_string_lossy().contains(only)))
        .collect();
    files.sort();
    Ok(files)
}

// Goal: every SQL feature and operator behaves like PostgreSQL; method: each .slt file runs in
// a fresh engine and a fresh PostgreSQL database, every query's rows must equal the expected
// rows in both systems, every `statement error` must fail in the engine with its SQLSTATE.
#[test]
fn sqllogictest_files() -> anyhow::Result<()> {
    let postgres = Postgres::start()?;
    let complete = std::env::var("SLT_COMPLETE").is_ok_and(|v| v == "1");
    let files = slt_files()?;
    assert!(files.len() >= 6 || std::env::var("SLT_ONLY").is_ok(), "the slt directory has the feature files");
    let mut failures = Vec::new();
    for file in &files {
        let (file_failures, rewritten) = run_file(file, &postgres, complete)?;
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("?").to_string();
        failures.extend(file_failures.into_iter().map(|f| format!("{name}: {f}")));
        if complete {
            let data_dir = file.parent().expect("dir").join("data").display().to_string();
            std::fs::write(file, rewritten.replace(&data_dir, "__DATA__"))?;
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n\n"));
    Ok(())
}
