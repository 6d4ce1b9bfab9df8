//! Parquet loading: rows written to a Parquet file (several row groups, snappy, NULLs, every
//! loadable type) and loaded with `COPY … (FORMAT parquet)` answer queries exactly like
//! PostgreSQL given the same rows as CSV; bad files and missing columns are typed errors.

mod common;

use std::io::Write;
use std::sync::Arc;

use bypass_engine::{Engine, EngineError, EngineSettings};
use bypass_testkit::{pg_bin, Postgres};
use parquet::basic::Compression;
use parquet::data_type::{BoolType, ByteArray, ByteArrayType, DoubleType, Int32Type, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

const ROWS: usize = 3_000;
const ROW_GROUP_ROWS: usize = 1_000;
const NAMES: [&str; 5] = ["alpha", "beta", "gamma", "delta", "epsilon"];

/// One generated row: id, big (NULL every 7th), ratio, name (NULL every 11th), day, price
/// in cents, flag.
struct Row {
    id: i32,
    big: Option<i64>,
    ratio: f64,
    name: Option<&'static str>,
    day: i32,
    price_cents: i64,
    flag: bool,
}

fn rows() -> Vec<Row> {
    (0..ROWS)
        .map(|i| {
            let n = i as i64;
            Row {
                id: i as i32,
                big: (i % 7 != 0).then_some(n * 1_000_003 - 5_000_000_000),
                ratio: (i % 13) as f64 / 8.0,
                name: (i % 11 != 0).then_some(NAMES[i % NAMES.len()]),
                day: 8_000 + (i % 400) as i32,
                price_cents: (n * 7_919) % 1_000_000 - 250_000,
                flag: i % 3 == 0,
            }
        })
        .collect()
}

const SCHEMA: &str = "message t {
    required int32 id;
    optional int64 big;
    required double ratio;
    optional binary name (UTF8);
    required int32 day (DATE);
    required int64 price (DECIMAL(12,2));
    required boolean flag;
}";

fn write_parquet(path: &std::path::Path, rows: &[Row]) -> anyhow::Result<()> {
    let schema = Arc::new(parse_message_type(SCHEMA)?);
    let properties = Arc::new(WriterProperties::builder().set_compression(Compression::SNAPPY).build());
    let mut writer = SerializedFileWriter::new(std::fs::File::create(path)?, schema, properties)?;
    for group in rows.chunks(ROW_GROUP_ROWS) {
        let mut row_group = writer.next_row_group()?;
        let mut index = 0;
        while let Some(mut column) = row_group.next_column()? {
            write_column(&mut column, index, group)?;
            column.close()?;
            index += 1;
        }
        row_group.close()?;
    }
    writer.close()?;
    Ok(())
}

fn write_column(
    column: &mut parquet::file::writer::SerializedColumnWriter<'_>,
    index: usize,
    group: &[Row],
) -> anyhow::Result<()> {
    let levels = |present: &dyn Fn(&Row) -> bool| group.iter().map(|r| i16::from(present(r))).collect::<Vec<_>>();
    match index {
        0 => column.typed::<Int32Type>().write_batch(&group.iter().map(|r| r.id).collect::<Vec<_>>(), None, None)?,
        1 => column.typed::<Int64Type>().write_batch(
            &group.iter().filter_map(|r| r.big).collect::<Vec<_>>(),
            Some(&levels(&|r| r.big.is_some())),
            None,
        )?,
        2 => {
            column.typed::<DoubleType>().write_batch(&group.iter().map(|r| r.ratio).collect::<Vec<_>>(), None, None)?
        }
        3 => column.typed::<ByteArrayType>().write_batch(
            &group.iter().filter_map(|r| r.name.map(ByteArray::from)).collect::<Vec<_>>(),
            Some(&levels(&|r| r.name.is_some())),
            None,
        )?,
        4 => column.typed::<Int32Type>().write_batch(&group.iter().map(|r| r.day).collect::<Vec<_>>(), None, None)?,
        5 => column.typed::<Int64Type>().write_batch(
            &group.iter().map(|r| r.price_cents).collect::<Vec<_>>(),
            None,
            None,
        )?,
        6 => column.typed::<BoolType>().write_batch(&group.iter().map(|r| r.flag).collect::<Vec<_>>(), None, None)?,
        other => anyhow::bail!("unexpected column {other}"),
    };
    Ok(())
}

/// The same rows as CSV for PostgreSQL (written from the generator, not from the engine).
fn load_postgres(postgres: &Postgres, rows: &[Row]) -> anyhow::Result<()> {
    postgres.psql(
        "create table t (id integer, big bigint, ratio double precision, name text, day date, \
         price numeric(12,2), flag boolean)",
    )?;
    let mut file = tempfile::NamedTempFile::new()?;
    for r in rows {
        let big = r.big.map(|v| v.to_string()).unwrap_or_default();
        let day = bypass_engine::types::format_date(r.day);
        let price = bypass_engine::types::format_decimal(r.price_cents, 2);
        writeln!(file, "{},{big},{},{},{day},{price},{}", r.id, r.ratio, r.name.unwrap_or(""), r.flag)?;
    }
    file.flush()?;
    let copy = format!("\\copy t from '{}' with (format csv)", file.path().display());
    let output = std::process::Command::new(pg_bin("psql"))
        .args(["-X", "-v", "ON_ERROR_STOP=1", "-h", postgres.host(), "-p", &postgres.port().to_string()])
        .args(["-U", "postgres", "-d", "postgres", "-c", &copy])
        .output()?;
    anyhow::ensure!(output.status.success(), "COPY failed: {}", String::from_utf8_lossy(&output.stderr));
    Ok(())
}

const QUERIES: [&str; 5] = [
    "select count(*), count(big), count(name), sum(big), sum(price), min(day), max(day), sum(ratio) from t",
    "select name, count(*), sum(price), min(big), max(big) from t group by name order by name",
    "select id, big, ratio, name, day, price, flag from t where flag and price < 0 order by id limit 40",
    "select day, count(*) from t where name is null group by day order by day limit 25",
    "select extract(year from day), sum(price) from t group by extract(year from day) order by 1",
];

// Goal: Parquet loading reads every type, NULL and row group correctly. Method: the same
// generated rows go to a Parquet file (engine, COPY FORMAT parquet) and to CSV (PostgreSQL);
// five queries over all columns must give equal answers.
#[test]
fn parquet_rows_answer_like_postgres() -> anyhow::Result<()> {
    let rows = rows();
    let directory = tempfile::tempdir()?;
    let path = directory.path().join("t.parquet");
    write_parquet(&path, &rows)?;
    let postgres = Postgres::start()?;
    load_postgres(&postgres, &rows)?;
    let engine = Engine::new(EngineSettings::default())?;
    engine.query(
        "create table t (id integer, big bigint, ratio double precision, name text, day date, \
         price numeric(12,2), flag boolean)",
    )?;
    let loaded = engine.query(&format!("copy t from '{}' (format parquet)", path.display()))?;
    assert_eq!(loaded.tag, format!("COPY {ROWS}"));
    for sql in QUERIES {
        let ours = common::engine_rows(&engine, sql)?;
        let theirs = common::postgres_rows(&postgres, sql)?;
        assert!(!theirs.is_empty(), "{sql}: PostgreSQL returned no rows");
        if let Err(difference) = common::compare(&ours, &theirs, false) {
            panic!("{sql}: {difference}");
        }
    }
    Ok(())
}

// Goal: bad Parquet input is a typed error and the engine keeps working. Method: a file that
// is not Parquet, a table column the file lacks, a value that does not fit its column.
#[test]
fn bad_parquet_input_is_a_typed_error() -> anyhow::Result<()> {
    let directory = tempfile::tempdir()?;
    let path = directory.path().join("t.parquet");
    write_parquet(&path, &rows())?;
    let garbage = directory.path().join("garbage.parquet");
    std::fs::write(&garbage, b"definitely not parquet")?;
    let engine = Engine::new(EngineSettings::default())?;
    engine.query("create table a (id integer, missing text)")?;
    engine.query("create table b (id integer, price numeric(4,2))")?;
    let not_parquet = engine.query(&format!("copy a (id) from '{}' (format parquet)", garbage.display()));
    assert!(matches!(not_parquet, Err(EngineError::InvalidValue(_))), "{not_parquet:?}");
    let missing = engine.query(&format!("copy a from '{}' (format parquet)", path.display()));
    assert!(matches!(&missing, Err(EngineError::InvalidValue(m)) if m.contains("missing")), "{missing:?}");
    let too_wide = engine.query(&format!("copy b from '{}' (format parquet)", path.display()));
    assert!(matches!(&too_wide, Err(EngineError::InvalidValue(m)) if m.contains("numeric(4,2)")), "{too_wide:?}");
    let options = engine.query(&format!("copy a (id) from '{}' (format parquet, header true)", path.display()));
    assert!(matches!(options, Err(EngineError::Unsupported(_))), "{options:?}");
    let loaded = engine.query(&format!("copy a (id) from '{}' (format parquet)", path.display()))?;
    assert_eq!(loaded.tag, format!("COPY {ROWS}"));
    Ok(())
}
