//! Hostile and careless clients against the engine's listener, message by message on a raw
//! socket: invalid UTF-8 and comment-only queries answer as real PostgreSQL 15 answers (same
//! message sequence, same SQLSTATEs); malformed, oversized and random messages, a failed-login
//! flood, deep nesting and clients that leave mid-query end only their own connection, and the
//! next client is answered.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(not(feature = "global-mimalloc"))]
use bypass_engine::control::TrackingAllocator;
use bypass_engine::{tpch, Engine, EngineSettings};
use bypass_testkit::Postgres;
use bypass_wire::frontend::build;
use bypass_wire::login::{Login, LoginRequest, LoginStep};
use bypass_wire::BackendMessage;
use common::{start_server, ENGINE_DATABASE, ENGINE_PASSWORD, ENGINE_USER};

// Memory is charged to statements by the allocator the `bypass` binary installs (the library
// installs it itself when a workspace build turns on `global-mimalloc`).
#[cfg(not(feature = "global-mimalloc"))]
#[global_allocator]
static ALLOCATOR: TrackingAllocator<std::alloc::System> = TrackingAllocator(std::alloc::System);

/// Bound on every read: an answer comes within milliseconds when the server works.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// One raw protocol connection.
struct Raw {
    stream: TcpStream,
    input: Vec<u8>,
}

/// A backend message: tag, and the SQLSTATE and message of an ErrorResponse.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    tag: char,
    code: Option<String>,
    message: Option<String>,
}

impl Raw {
    fn open(address: SocketAddr) -> anyhow::Result<Raw> {
        let stream = TcpStream::connect(address)?;
        stream.set_read_timeout(Some(READ_TIMEOUT))?;
        stream.set_nodelay(true)?;
        Ok(Raw { stream, input: Vec::new() })
    }

    /// Connects and logs in (SCRAM when `password` is set, trust otherwise).
    fn login(address: SocketAddr, user: &str, database: &str, password: Option<&str>) -> anyhow::Result<Raw> {
        let mut raw = Raw::open(address)?;
        let mut request = LoginRequest::trust(user, database);
        request.password = password.map(str::to_string);
        let (mut login, startup) = Login::start(request);
        raw.send(&startup)?;
        loop {
            let (tag, body) = raw.message()?.ok_or_else(|| anyhow::anyhow!("closed during login"))?;
            match login.on_message(BackendMessage::decode(tag, &body)?)? {
                LoginStep::Send(bytes) => raw.send(&bytes)?,
                LoginStep::Continue => {}
                LoginStep::Done(_) => return Ok(raw),
            }
        }
    }

    fn engine(address: SocketAddr) -> anyhow::Result<Raw> {
        Raw::login(address, ENGINE_USER, ENGINE_DATABASE, Some(ENGINE_PASSWORD))
    }

    fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// The next message, or `None` when the server closed the connection.
    fn message(&mut self) -> anyhow::Result<Option<(u8, Vec<u8>)>> {
        loop {
            if self.input.len() >= 5 {
                let length = u32::from_be_bytes([self.input[1], self.input[2], self.input[3], self.input[4]]) as usize;
                if self.input.len() > length {
                    let body = self.input[5..1 + length].to_vec();
                    let tag = self.input[0];
                    self.input.drain(..1 + length);
                    return Ok(Some((tag, body)));
                }
            }
            let mut chunk = [0u8; 8192];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Ok(None),
                Ok(read) => self.input.extend_from_slice(&chunk[..read]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Messages up to and including ReadyForQuery (or up to the close).
    fn answers(&mut self) -> anyhow::Result<Vec<Answer>> {
        let mut answers = Vec::new();
        while let Some((tag, body)) = self.message()? {
            let (code, message) = match BackendMessage::decode(tag, &body)? {
                BackendMessage::ErrorResponse(fields) => (
                    fields.code().map(|c| String::from_utf8_lossy(c).into_owned()),
                    fields.message().map(|m| String::from_utf8_lossy(m).into_owned()),
                ),
                _ => (None, None),
            };
            answers.push(Answer { tag: tag as char, code, message });
            if tag == b'Z' {
                break;
            }
        }
        Ok(answers)
    }

    /// The answers to `sent` (whole messages): up to the ReadyForQuery of each Sync and Query.
    fn answers_to(&mut self, sent: &[u8]) -> anyhow::Result<Vec<Answer>> {
        let (mut at, mut ready) = (0, 0);
        while at + 5 <= sent.len() {
            ready += usize::from(matches!(sent[at], b'S' | b'Q'));
            at += 1 + u32::from_be_bytes([sent[at + 1], sent[at + 2], sent[at + 3], sent[at + 4]]) as usize;
        }
        let mut answers = Vec::new();
        for _ in 0..ready.max(1) {
            answers.extend(self.answers()?);
        }
        Ok(answers)
    }

    /// A simple query's answer as (tags, SQLSTATEs).
    fn query(&mut self, sql: &[u8]) -> anyhow::Result<Vec<Answer>> {
        self.send(&query_message(sql))?;
        self.answers()
    }

    /// Reads until the server closes the connection (bytes before the close are returned).
    fn until_closed(&mut self) -> anyhow::Result<Vec<Answer>> {
        let mut answers = Vec::new();
        loop {
            let before = answers.len();
            answers.extend(self.answers()?);
            if answers.len() == before || answers.last().is_some_and(|a| a.tag != 'Z') {
                return Ok(answers);
            }
        }
    }
}

/// A Query message with arbitrary bytes as its text.
fn query_message(sql: &[u8]) -> Vec<u8> {
    let mut out = vec![b'Q'];
    out.extend_from_slice(&(sql.len() as u32 + 5).to_be_bytes());
    out.extend_from_slice(sql);
    out.push(0);
    out
}

/// A Parse message with arbitrary bytes as its text.
fn parse_message(sql: &[u8]) -> Vec<u8> {
    let mut out = vec![b'P'];
    out.extend_from_slice(&(sql.len() as u32 + 8).to_be_bytes());
    out.push(0);
    out.extend_from_slice(sql);
    out.extend_from_slice(&[0, 0, 0]);
    out
}

/// A message of `tag` with `body` as it is (names and strings with invalid UTF-8).
fn raw_message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// Statement and portal names with invalid UTF-8, in each message that carries one.
fn invalid_name_cases() -> Vec<(&'static str, Vec<u8>)> {
    let with_sync = |mut bytes: Vec<u8>| {
        build::sync(&mut bytes);
        bytes
    };
    let mut bind = Vec::new();
    build::parse(&mut bind, "", "select 1", &[]);
    // Portal "p\xff", statement "": no parameter formats, no parameters, no result formats.
    bind.extend(raw_message(b'B', b"p\xff\0\0\0\0\0\0\0\0"));
    vec![
        ("invalid UTF-8 in a statement name (Parse)", with_sync(raw_message(b'P', b"s\xff\0select 1\0\0\0"))),
        ("invalid UTF-8 in a portal name (Bind)", with_sync(bind)),
        ("invalid UTF-8 in a statement name (Describe)", with_sync(raw_message(b'D', b"S\xc3\x28\0"))),
        ("invalid UTF-8 in a portal name (Execute)", with_sync(raw_message(b'E', b"\xfe\0\0\0\0\0"))),
        ("invalid UTF-8 in a portal name (Close)", with_sync(raw_message(b'C', b"P\x80\0"))),
    ]
}

/// Portals run with a row limit: PortalSuspended once the limit is reached (even with no
/// rows left: PostgreSQL does not look ahead), the rest on the next Execute, and a portal of
/// an implicit transaction gone after Sync (34000).
fn suspended_portal_cases() -> Vec<(&'static str, Vec<u8>)> {
    let execute = |out: &mut Vec<u8>, max_rows: u32| {
        let mut body = vec![0];
        body.extend_from_slice(&max_rows.to_be_bytes());
        out.extend(raw_message(b'E', &body));
    };
    let three = "select 1 union all select 2 union all select 3";
    let mut resumed = Vec::new();
    build::parse(&mut resumed, "", three, &[]);
    build::bind(&mut resumed, "", "", &[]);
    execute(&mut resumed, 2);
    execute(&mut resumed, 2);
    execute(&mut resumed, 2);
    build::sync(&mut resumed);
    let mut exact = Vec::new();
    build::parse(&mut exact, "", three, &[]);
    build::bind(&mut exact, "", "", &[]);
    execute(&mut exact, 3);
    execute(&mut exact, 1);
    build::sync(&mut exact);
    let mut after_sync = Vec::new();
    build::parse(&mut after_sync, "", three, &[]);
    build::bind(&mut after_sync, "", "", &[]);
    execute(&mut after_sync, 1);
    build::sync(&mut after_sync);
    execute(&mut after_sync, 1);
    build::sync(&mut after_sync);
    vec![
        ("a portal resumed by later Executes", resumed),
        ("a portal suspended with no rows left", exact),
        ("a suspended portal after the Sync of its implicit transaction", after_sync),
    ]
}

/// The protocol exchanges of the PostgreSQL comparison; each is sent on a fresh connection.
fn protocol_cases() -> Vec<(&'static str, Vec<u8>)> {
    let mut extended_comment = parse_message(b"-- nothing but a comment");
    build::bind(&mut extended_comment, "", "", &[]);
    extended_comment.extend_from_slice(&[b'E', 0, 0, 0, 9, 0, 0, 0, 0, 0]);
    build::sync(&mut extended_comment);
    let mut extended_invalid = parse_message(b"select 'caf\xc3\x28'");
    build::sync(&mut extended_invalid);
    let mut bind_invalid = Vec::new();
    build::parse(&mut bind_invalid, "", "select $1::text", &[25]);
    build::bind(&mut bind_invalid, "", "", &[Some(b"\xff\xfe")]);
    build::sync(&mut bind_invalid);
    let mut startup_again = Vec::new();
    bypass_wire::startup::encode_startup(&mut startup_again, &[("user", "postgres")]);
    let mut cases = vec![
        ("invalid UTF-8 in a query", query_message(b"select 'caf\xc3\x28'")),
        ("a lone continuation byte", query_message(b"select '\x80'")),
        ("a truncated sequence at the end", query_message(b"select 1 -- \xe2\x82")),
        ("comment-only query", query_message(b"-- nothing but a comment")),
        ("block comment only", query_message(b"/* a */ /* b */")),
        ("whitespace and semicolons", query_message(b" ; ;\n")),
        ("empty query", query_message(b"")),
        ("comment-only Parse/Bind/Execute", extended_comment),
        ("invalid UTF-8 in Parse", extended_invalid),
        ("invalid UTF-8 in a text parameter", bind_invalid),
        // Type byte 0 after login: PostgreSQL refuses at once ("invalid frontend message type 0").
        ("a StartupPacket after login", startup_again),
        ("an SSLRequest after login", vec![0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]),
    ];
    cases.extend(invalid_name_cases());
    cases.extend(suspended_portal_cases());
    cases
}

#[test]
fn invalid_utf8_and_empty_queries_answer_as_postgres() -> anyhow::Result<()> {
    let postgres = Postgres::start()?;
    let postgres_address: SocketAddr = format!("{}:{}", postgres.host(), postgres.port()).parse()?;
    let engine = Arc::new(Engine::new(EngineSettings::default())?);
    let server = start_server(engine)?;
    for (name, bytes) in protocol_cases() {
        let mut ours = Raw::engine(server.address)?;
        ours.send(&bytes)?;
        let ours = ours.answers_to(&bytes)?;
        let mut theirs = Raw::login(postgres_address, "postgres", "postgres", None)?;
        theirs.send(&bytes)?;
        let theirs = theirs.answers_to(&bytes)?;
        // Same messages and SQLSTATEs; for 22021 the same text too (it names the bad bytes).
        let strip = |answers: &[Answer]| -> Vec<(char, Option<String>)> {
            answers.iter().map(|a| (a.tag, a.code.clone())).collect()
        };
        assert_eq!(strip(&ours), strip(&theirs), "{name}: engine {ours:?}, PostgreSQL {theirs:?}");
        for (a, b) in ours.iter().zip(&theirs) {
            if a.code.as_deref() == Some("22021") {
                assert_eq!(a.message, b.message, "{name}");
            }
        }
    }
    Ok(())
}

/// A small deterministic generator (xorshift64*), so a failure reproduces.
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn bytes(&mut self, count: usize) -> Vec<u8> {
        (0..count).map(|_| self.next() as u8).collect()
    }

    /// A message with a frontend tag, a plausible length and a random body: mostly decodable
    /// framing with broken contents.
    fn message(&mut self) -> Vec<u8> {
        const TAGS: &[u8] = b"QPBEDCSHFdcfpX!\0";
        let tag = TAGS[(self.next() % TAGS.len() as u64) as usize];
        let length = (self.next() % 64) as usize;
        let body = self.bytes(length);
        let mut out = vec![tag];
        out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }
}

/// The server still answers a new client's `select 1`.
fn answers_select_1(address: SocketAddr) -> anyhow::Result<()> {
    let answers = Raw::engine(address)?.query(b"select 1")?;
    let tags: String = answers.iter().map(|a| a.tag).collect();
    anyhow::ensure!(tags == "TDCZ", "select 1 after abuse answered {answers:?}");
    Ok(())
}

#[test]
fn listener_survives_hostile_clients() -> anyhow::Result<()> {
    let engine = Arc::new(Engine::new(EngineSettings::default())?);
    tpch::load(&engine, 0.01)?;
    let server = start_server(engine)?;
    let address = server.address;

    // Garbage instead of a startup packet, and a startup packet that claims 2 GiB.
    let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
    for length in [0usize, 3, 8, 200, 5000] {
        let mut raw = Raw::open(address)?;
        let _ = raw.send(&noise.bytes(length));
        let _ = raw.stream.shutdown(std::net::Shutdown::Write);
        let _ = raw.until_closed();
    }
    let mut raw = Raw::open(address)?;
    raw.send(&[0x7f, 0xff, 0xff, 0xff, 0, 3, 0, 0])?;
    raw.until_closed()?;
    answers_select_1(address)?;

    // After login: a length below the header, a message claiming 1 GiB, an unknown tag.
    for frame in [vec![b'Q', 0, 0, 0, 2], vec![b'Q', 0x40, 0, 0, 0], vec![b'!', 0, 0, 0, 4]] {
        let mut raw = Raw::engine(address)?;
        raw.send(&frame)?;
        let answers = raw.until_closed()?;
        assert_eq!(answers.last().and_then(|a| a.code.as_deref()), Some("08P01"), "{frame:?}: {answers:?}");
    }
    answers_select_1(address)?;

    // Random messages after login: each connection ends or answers, never the server.
    for _ in 0..60 {
        let mut raw = Raw::engine(address)?;
        for _ in 0..(noise.next() % 8 + 1) {
            let _ = raw.send(&noise.message());
        }
        let mut sync = Vec::new();
        build::sync(&mut sync);
        let _ = raw.send(&sync);
        let _ = raw.stream.shutdown(std::net::Shutdown::Write);
        let _ = raw.until_closed();
    }
    answers_select_1(address)?;

    // A failed-login flood: every attempt is refused with 28P01, then the right password works.
    let started = Instant::now();
    let refusals: Vec<_> = (0..8)
        .map(|thread| {
            std::thread::spawn(move || -> anyhow::Result<usize> {
                let mut refused = 0;
                for attempt in 0..10 {
                    let user =
                        if attempt % 2 == 0 { ENGINE_USER.to_string() } else { format!("stranger{thread}_{attempt}") };
                    match Raw::login(address, &user, ENGINE_DATABASE, Some("wrong password")) {
                        Err(error) if error.to_string().contains("28P01") => refused += 1,
                        other => anyhow::bail!("a wrong password logged in or failed oddly: {:?}", other.err()),
                    }
                }
                Ok(refused)
            })
        })
        .collect();
    let mut refused = 0;
    for thread in refusals {
        refused += thread.join().expect("login threads do not panic")?;
    }
    assert_eq!(refused, 80);
    answers_select_1(address)?;
    eprintln!("80 failed logins refused in {:?}", started.elapsed());

    // Deep nesting through the server: refused with 54001 or answered, the connection stays.
    let mut raw = Raw::engine(address)?;
    let deep = format!("select {}1{}", "(".repeat(100_000), ")".repeat(100_000));
    let answers = raw.query(deep.as_bytes())?;
    assert_eq!(answers.first().and_then(|a| a.code.as_deref()), Some("54001"), "{answers:?}");
    let tags: String = raw.query(b"select 1")?.iter().map(|a| a.tag).collect();
    assert_eq!(tags, "TDCZ");

    // Clients that leave mid-query (while rows stream and while a long join runs): their
    // statements stop and the next client is answered.
    for sql in [
        "select * from lineitem l1 join lineitem l2 on l1.l_shipmode = l2.l_shipmode".as_bytes(),
        b"select count(*) from lineitem l1 join lineitem l2 on l1.l_shipmode = l2.l_shipmode",
    ] {
        let mut raw = Raw::engine(address)?;
        raw.send(&query_message(sql))?;
        let waited = Instant::now();
        while server.statements_running() == 0 && waited.elapsed() < READ_TIMEOUT {
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(raw);
        let waited = Instant::now();
        while server.statements_running() > 0 && waited.elapsed() < READ_TIMEOUT {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(server.statements_running(), 0, "a statement kept running after its client left");
    }
    answers_select_1(address)
}

// Goal: the server-wide memory_budget bounds what running statements hold together, whatever
// each statement's memory_limit: N runaway statements cannot take N × memory_limit; the server
// goes on and the budget is given back when they end; method: a 64 MiB budget, and the runaway
// self-join (its pairs need gigabytes) from three clients at once under memory_limit = 1GB,
// each refused with 53200 naming memory_budget.
#[test]
fn a_server_memory_budget_bounds_concurrent_runaway_statements() -> anyhow::Result<()> {
    let settings = EngineSettings { memory_budget: 64 << 20, ..EngineSettings::default() };
    let engine = Arc::new(Engine::new(settings)?);
    tpch::load(&engine, 0.01)?;
    let server = start_server(Arc::clone(&engine))?;
    let address = server.address;
    let runaway = b"select l1.l_orderkey, l2.l_orderkey from lineitem l1 join lineitem l2 \
                    on l1.l_returnflag = l2.l_returnflag order by 1, 2";
    let answers: Vec<Vec<Answer>> = std::thread::scope(|scope| {
        let client = || {
            let mut raw = Raw::engine(address)?;
            // A bound that holds without the budget too (a failing run takes 3 GiB, not 3 × 80% of RAM).
            raw.query(b"set memory_limit = '1GB'")?;
            raw.query(runaway)
        };
        let clients: Vec<_> = (0..3).map(|_| scope.spawn(client)).collect();
        clients.into_iter().map(|c| c.join().expect("client thread")).collect::<anyhow::Result<_>>()
    })?;
    for answer in &answers {
        let error = answer.iter().find(|a| a.tag == 'E').expect("refused");
        assert_eq!(error.code.as_deref(), Some("53200"), "{answer:?}");
        assert!(error.message.as_deref().is_some_and(|m| m.contains("memory_budget")), "{answer:?}");
    }
    answers_select_1(address)?;
    let started = Instant::now();
    while engine.memory_budget().used() != 0 && started.elapsed() < READ_TIMEOUT {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(engine.memory_budget().used(), 0, "ended statements hold nothing of the budget");
    Ok(())
}

/// The first column of the first row `sql` answers with, or the SQLSTATE of its error.
fn first_value(raw: &mut Raw, sql: &str) -> anyhow::Result<Result<String, String>> {
    raw.send(&query_message(sql.as_bytes()))?;
    let mut outcome = Err("no row".to_string());
    while let Some((tag, body)) = raw.message()? {
        match BackendMessage::decode(tag, &body)? {
            BackendMessage::ErrorResponse(fields) => {
                outcome = Err(fields.code().map(|c| String::from_utf8_lossy(c).into_owned()).unwrap_or_default());
            }
            _ if tag == b'D' && outcome.is_err() => {
                let length = i32::from_be_bytes([body[2], body[3], body[4], body[5]]);
                let value = usize::try_from(length)
                    .map_or(String::new(), |l| String::from_utf8_lossy(&body[6..6 + l]).into_owned());
                outcome = Ok(value);
            }
            _ if tag == b'C' && outcome.is_err() => {
                outcome = Ok(String::from_utf8_lossy(&body).trim_end_matches('\0').into())
            }
            _ if tag == b'Z' => break,
            _ => {}
        }
    }
    Ok(outcome)
}

/// Waits until `count` transactions wait for a table lock (bounded by READ_TIMEOUT).
fn until_lock_waiters(engine: &Engine, count: usize) -> bool {
    let started = Instant::now();
    while engine.database().lock_waiters() != count {
        if started.elapsed() > READ_TIMEOUT {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    true
}

// Goal: DROP TABLE and TRUNCATE wait for open transactions that read the table, as in
// PostgreSQL, so a reader never sees the table vanish (42P01) or emptied mid-transaction (it
// did: readers took no locks); lock_timeout (55P03) and statement_timeout (57014) bound the
// wait, and two readers that both truncate deadlock (40P01); method: sessions on one server.
#[test]
fn drop_and_truncate_wait_for_transactions_that_read_the_table() -> anyhow::Result<()> {
    let engine = Arc::new(Engine::new(EngineSettings::default())?);
    engine.execute("create table t (x int); insert into t values (1), (2), (3)")?;
    let server = start_server(Arc::clone(&engine))?;
    let (mut reader, mut other) = (Raw::engine(server.address)?, Raw::engine(server.address)?);
    let count = "select count(*) from t";
    first_value(&mut reader, "begin")?.expect("begin");
    assert_eq!(first_value(&mut reader, count)?, Ok("3".into()));
    first_value(&mut other, "set lock_timeout = '50ms'")?.expect("set");
    assert_eq!(first_value(&mut other, "truncate t")?, Err("55P03".into()));
    first_value(&mut other, "set lock_timeout = 0")?.expect("set");
    first_value(&mut other, "set statement_timeout = '50ms'")?.expect("set");
    assert_eq!(first_value(&mut other, "drop table t")?, Err("57014".into()));
    first_value(&mut other, "set statement_timeout = 0")?.expect("set");
    other.send(&query_message(b"truncate t"))?;
    assert!(until_lock_waiters(&engine, 1), "the TRUNCATE waits for the reader");
    assert_eq!(first_value(&mut reader, count)?, Ok("3".into()), "the reader's table is whole");
    first_value(&mut reader, "commit")?.expect("commit");
    let truncated: String = other.answers()?.iter().map(|a| a.tag).collect();
    assert_eq!(truncated, "CZ", "the TRUNCATE ran once the reader ended");
    assert_eq!(first_value(&mut reader, count)?, Ok("0".into()));

    for raw in [&mut reader, &mut other] {
        first_value(raw, "begin")?.expect("begin");
        assert_eq!(first_value(raw, count)?, Ok("0".into()));
    }
    reader.send(&query_message(b"drop table t"))?;
    assert!(until_lock_waiters(&engine, 1), "the DROP waits for the other reader");
    assert_eq!(first_value(&mut other, "truncate t")?, Err("40P01".into()));
    first_value(&mut other, "rollback")?.expect("rollback");
    let dropped: String = reader.answers()?.iter().map(|a| a.tag).collect();
    assert_eq!(dropped, "CZ", "the DROP ran once the deadlocked reader rolled back");
    first_value(&mut reader, "commit")?.expect("commit");
    assert_eq!(first_value(&mut other, count)?, Err("42P01".into()));
    Ok(())
}

// Goal: a statement's syntax tree counts against memory_limit before it is built (issue 21: the
// parser's tree, up to ~400 MB for 1 MiB of SQL, was built before any control existed).
// Method: under `memory_limit = '64MB'`, an IN list of 400,000 ones (800 KB) sent as a Query and as a Parse is
// refused with 53200; the session goes on and the same text answers under a larger limit.
#[test]
fn huge_statements_are_refused_by_memory_limit_before_parsing() -> anyhow::Result<()> {
    let engine = Arc::new(Engine::new(EngineSettings::default())?);
    let server = start_server(Arc::clone(&engine))?;
    let mut raw = Raw::engine(server.address)?;
    let list = format!("select 1 in ({})", vec!["1"; 400_000].join(","));
    raw.query(b"set memory_limit = '64MB'")?;
    let simple = raw.query(list.as_bytes())?;
    let code = |answers: &[Answer]| answers.iter().find_map(|a| a.code.clone());
    assert_eq!(code(&simple).as_deref(), Some("53200"), "{simple:?}");
    let mut extended = parse_message(list.as_bytes());
    build::sync(&mut extended);
    let answers = {
        raw.send(&extended)?;
        raw.answers()?
    };
    assert_eq!(code(&answers).as_deref(), Some("53200"), "{answers:?}");
    raw.query(b"set memory_limit = '2GB'")?;
    assert_eq!(first_value(&mut raw, &list)?, Ok("t".to_string()));
    Ok(())
}
