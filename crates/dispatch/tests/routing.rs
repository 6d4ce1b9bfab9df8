//! Routing through the dispatcher with real agents and real PostgreSQL servers on loopback.
//! Relayed answers come straight from the servers, except in the lag test, which relays through
//! the agents (the path of a deployment that names no server addresses).

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bypass_dispatch::dispatcher::{self, DispatcherInfo};
use bypass_dispatch::runtime::Running;
use bypass_testkit::Postgres;
use common::{connect, dispatcher_config, start_agent, wait_until};

/// Three servers (b0 primary, b1 and b2 replicas), each knowing its own name, with agents and a
/// dispatcher in front. The servers are independent clusters: routing, not replication, is tested.
struct Setup {
    servers: Vec<Postgres>,
    _agents: Vec<Running<SocketAddr>>,
    dispatcher: Running<DispatcherInfo>,
}

impl Setup {
    fn start() -> anyhow::Result<Setup> {
        let mut servers = Vec::new();
        let mut agents = Vec::new();
        for i in 0..3 {
            let postgres = Postgres::start()?;
            postgres.psql(&format!(
                "create table whoami (name text); insert into whoami values ('b{i}'); create table log (n int)"
            ))?;
            agents.push(start_agent(postgres.port())?);
            servers.push(postgres);
        }
        let addresses: Vec<SocketAddr> = agents.iter().map(|a| a.ready).collect();
        let mut config = dispatcher_config(&addresses, 0, &[1, 2])?;
        // Relayed answers come straight from the servers, as in a deployment that names them.
        for (backend, server) in config.backends.iter_mut().zip(&servers) {
            backend.postgres = Some(SocketAddr::from(([127, 0, 0, 1], server.port())));
        }
        let dispatcher = dispatcher::start(config, None)?;
        Ok(Setup { servers, _agents: agents, dispatcher })
    }

    fn address(&self) -> SocketAddr {
        self.dispatcher.ready.local_addr
    }

    fn requests(&self, backend: usize) -> u64 {
        self.dispatcher.ready.shared.backends[backend].requests.load(Ordering::Relaxed)
    }
}

fn who_answers(
    connection: &mut bypass_lab::pgclient::PgConnection,
    sql: &str,
    count: usize,
) -> anyhow::Result<BTreeMap<String, usize>> {
    let mut seen = BTreeMap::new();
    for _ in 0..count {
        let result = connection.query(sql)?;
        let name = result.rows[0][0].clone().unwrap_or_default();
        *seen.entry(name).or_insert(0) += 1;
    }
    Ok(seen)
}

// Goal: writes reach the primary only; reads never do, and sessions spread over both replicas
// while each session's reads stay on one (least outstanding, ties to the session's last replica).
// Method: 20 inserts through one dispatcher connection, then 10 reads on each of 4 connections;
// count rows per server and which server answered each read.
#[test]
fn writes_reach_the_primary_and_reads_spread_over_replicas() -> anyhow::Result<()> {
    let setup = Setup::start()?;
    let mut connection = connect(setup.address())?;
    for n in 0..20 {
        connection.query(&format!("insert into log values ({n})"))?;
    }
    let counts: Vec<String> =
        setup.servers.iter().map(|s| s.psql("select count(*) from log")).collect::<Result<_, _>>()?;
    assert_eq!(counts, ["20", "0", "0"], "rows per server");
    let mut seen = BTreeMap::new();
    for _ in 0..4 {
        let mut reader = connect(setup.address())?;
        let answered = who_answers(&mut reader, "select name from whoami", 10)?;
        assert_eq!(answered.len(), 1, "one session's reads stay on one replica: {answered:?}");
        for (name, count) in answered {
            *seen.entry(name).or_insert(0) += count;
        }
    }
    assert_eq!(seen.get("b0"), None, "a read reached the primary: {seen:?}");
    assert_eq!((seen.get("b1"), seen.get("b2")), (Some(&20), Some(&20)), "{seen:?}");
    Ok(())
}

// Goal: transactions, locking reads, volatile functions and route hints go where they must.
// Method: ask "who answers" under each rule.
#[test]
fn transactions_hints_and_volatile_functions_route_to_the_primary() -> anyhow::Result<()> {
    let setup = Setup::start()?;
    setup.servers[0].psql("create function my_volatile() returns int language sql volatile as 'select 1'")?;
    for server in &setup.servers[1..] {
        server.psql("create function my_volatile() returns int language sql volatile as 'select 1'")?;
        server.psql("create function my_stable() returns int language sql stable as 'select 1'")?;
    }
    setup.servers[0].psql("create function my_stable() returns int language sql stable as 'select 1'")?;
    let mut connection = connect(setup.address())?;
    connection.query("begin")?;
    assert_eq!(who_answers(&mut connection, "select name from whoami", 3)?, BTreeMap::from([("b0".into(), 3)]));
    connection.query("commit")?;
    let primary_only = BTreeMap::from([("b0".to_string(), 2)]);
    assert_eq!(who_answers(&mut connection, "select name from whoami for share", 2)?, primary_only);
    assert_eq!(who_answers(&mut connection, "/* route=primary */ select name from whoami", 2)?, primary_only);
    assert_eq!(who_answers(&mut connection, "select name from whoami where my_volatile() = 1", 2)?, primary_only);
    let stable = who_answers(&mut connection, "select name from whoami where my_stable() = 1", 2)?;
    assert!(!stable.contains_key("b0"), "a stable function's read went to the primary: {stable:?}");
    connection.query("SET bypass.route = 'primary'")?;
    assert_eq!(who_answers(&mut connection, "select name from whoami", 2)?, primary_only);
    connection.query("RESET bypass.route")?;
    assert!(!who_answers(&mut connection, "select name from whoami", 2)?.contains_key("b0"));
    Ok(())
}

// Goal: session settings follow the client to every backend; method: SET application_name
// (it runs on the primary), then read it back with reads that a replica answers.
#[test]
fn session_settings_are_replayed_on_replicas() -> anyhow::Result<()> {
    let setup = Setup::start()?;
    let mut connection = connect(setup.address())?;
    connection.query("set application_name = 'routed'")?;
    for _ in 0..6 {
        let result = connection.query("select current_setting('application_name')")?;
        assert_eq!(result.rows[0][0].as_deref(), Some("routed"));
    }
    assert_eq!(setup.requests(1) + setup.requests(2), 6, "the reads ran on a replica, not where SET ran");
    connection.query("reset all")?;
    let result = connection.query("select current_setting('application_name')")?;
    assert_eq!(result.rows[0][0].as_deref(), Some(""));
    Ok(())
}

// Goal: a dead replica is skipped without client errors, and readmitted when it returns.
// Method: kill b1's server, run 20 reads (all must succeed, none from b1), restart it, wait
// until it is readmitted; new sessions then reach it again (one of two: their first picks
// alternate).
#[test]
fn a_dead_replica_is_skipped_and_readmitted() -> anyhow::Result<()> {
    let mut setup = Setup::start()?;
    let mut connection = connect(setup.address())?;
    who_answers(&mut connection, "select name from whoami", 4)?;
    setup.servers[1].kill();
    let seen = who_answers(&mut connection, "select name from whoami", 20)?;
    assert_eq!(seen, BTreeMap::from([("b2".to_string(), 20)]), "reads after the kill");
    setup.servers[1].start_again()?;
    let shared = setup.dispatcher.ready.shared.clone();
    wait_until(Duration::from_secs(10), "b1 readmitted", || shared.backends[1].is_healthy())?;
    let mut seen = BTreeMap::new();
    for _ in 0..2 {
        let answered = who_answers(&mut connect(setup.address())?, "select name from whoami", 1)?;
        seen.extend(answered);
    }
    assert!(seen.contains_key("b1"), "b1 never answered after readmission: {seen:?}");
    Ok(())
}

// Goal: a read sent to a replica that turns out to be shutting down is answered elsewhere, the
// session intact. This is the race a kill leaves open: a link sits idle, its server shuts down,
// and the server's farewell (PostgreSQL sends "57P01 terminating connection due to immediate
// shutdown command" as a WARNING, then closes) is still on its way when the next read goes out
// on it (the kill test hits it only under load, when the agent or the loopback is slow to pass
// it on). Method: replica b1 is a scripted server that logs in, answers health checks, and meets
// every other query with exactly that farewell; the reads must all come from the primary.
#[test]
fn a_read_meeting_a_server_farewell_is_retried_elsewhere() -> anyhow::Result<()> {
    let primary = Postgres::start()?;
    primary.psql("create table whoami (name text); insert into whoami values ('b0')")?;
    let agent = start_agent(primary.port())?;
    let dying = DyingServer::start()?;
    let mut config = dispatcher_config(&[agent.ready, dying.address], 0, &[1])?;
    config.backends[0].postgres = Some(SocketAddr::from(([127, 0, 0, 1], primary.port())));
    config.backends[1].postgres = Some(dying.address);
    let dispatcher = dispatcher::start(config, None)?;
    let mut connection = connect(dispatcher.ready.local_addr)?;
    for read in 0..5 {
        let shared = &dispatcher.ready.shared;
        wait_until(Duration::from_secs(10), "b1 readmitted", || shared.backends[1].is_healthy())?;
        let seen = who_answers(&mut connection, "select name from whoami", 1)?;
        assert_eq!(seen, BTreeMap::from([("b0".to_string(), 1)]), "read {read}");
    }
    assert_eq!(dying.farewells.load(Ordering::Relaxed), 5, "every read met b1's farewell first");
    Ok(())
}

/// A scripted PostgreSQL server that is always shutting down: trust login, health checks
/// answered (lag 0), any other query met with PostgreSQL's immediate-shutdown farewell.
struct DyingServer {
    address: SocketAddr,
    farewells: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl DyingServer {
    fn start() -> anyhow::Result<DyingServer> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let farewells = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = farewells.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let counter = counter.clone();
                std::thread::spawn(move || DyingServer::serve(stream, &counter));
            }
        });
        Ok(DyingServer { address, farewells })
    }

    fn serve(mut stream: std::net::TcpStream, farewells: &std::sync::atomic::AtomicUsize) -> std::io::Result<()> {
        use bypass_wire::backend::build;
        use bypass_wire::{Authentication, Severity, SqlState, TransactionStatus};
        use std::io::{Read, Write};
        let mut length = [0u8; 4];
        stream.read_exact(&mut length)?;
        let mut startup = vec![0u8; (u32::from_be_bytes(length) as usize).saturating_sub(4)];
        stream.read_exact(&mut startup)?;
        let mut out = Vec::new();
        build::authentication(&mut out, &Authentication::Ok);
        build::ready_for_query(&mut out, TransactionStatus::Idle);
        stream.write_all(&out)?;
        loop {
            let mut header = [0u8; 5];
            stream.read_exact(&mut header)?;
            let mut body = vec![0u8; (u32::from_be_bytes(header[1..].try_into().expect("4 bytes")) as usize) - 4];
            stream.read_exact(&mut body)?;
            out.clear();
            if header[0] != b'Q' {
                return Ok(());
            }
            if String::from_utf8_lossy(&body).contains("pg_is_in_recovery") {
                build::text_row_description(&mut out, &["lag"]);
                build::data_row(&mut out, &[Some(b"0")]);
                build::command_complete(&mut out, "SELECT 1");
                build::ready_for_query(&mut out, TransactionStatus::Idle);
                stream.write_all(&out)?;
                continue;
            }
            let text = "terminating connection due to immediate shutdown command";
            build::notice_with_severity(&mut out, Severity::Warning, SqlState::ADMIN_SHUTDOWN, text);
            farewells.fetch_add(1, Ordering::Relaxed);
            return stream.write_all(&out);
        }
    }
}

// Goal: a streaming replica whose replay lags more than replica_lag_max_ms gets no reads, and
// gets them back once it catches up. Method: a real primary and pg_basebackup standby; pause
// replay on the standby, write on the primary, watch where reads go.
#[test]
fn a_lagging_replica_gets_no_reads() -> anyhow::Result<()> {
    use bypass_testkit::process::{chown_to_server_user, run, server_command};
    use bypass_testkit::PostgresOptions;
    let primary = Postgres::start()?;
    let hba = primary.data_dir().join("pg_hba.conf");
    let text = std::fs::read_to_string(&hba)?;
    std::fs::write(&hba, format!("host replication all 127.0.0.1/32 trust\n{text}"))?;
    primary.psql("select pg_reload_conf()")?;
    primary.psql("create table seen (n int); insert into seen values (1)")?;
    let standby_dir = tempfile::Builder::new().prefix("bypass-standby-").tempdir()?;
    chown_to_server_user(standby_dir.path())?;
    let data = standby_dir.path().join("data");
    let mut basebackup = server_command(bypass_testkit::pg_bin("pg_basebackup"))?;
    basebackup.args([
        "-h",
        "127.0.0.1",
        "-p",
        &primary.port().to_string(),
        "-U",
        "postgres",
        "-R",
        "-X",
        "stream",
        "-D",
    ]);
    basebackup.arg(&data);
    run(&mut basebackup)?;
    let standby = Postgres::start_with(PostgresOptions { data_dir: Some(data), ..PostgresOptions::default() })?;
    assert_eq!(standby.psql("select pg_is_in_recovery()")?, "t");
    primary.psql("insert into seen values (2)")?;
    wait_until(Duration::from_secs(10), "the standby to replay", || {
        standby.psql("select count(*) from seen").ok().as_deref() == Some("2")
    })?;

    let agents = [start_agent(primary.port())?, start_agent(standby.port())?];
    let mut config = dispatcher_config(&[agents[0].ready, agents[1].ready], 0, &[1])?;
    config.settings.replica_lag_max_ms = 300;
    let dispatcher = dispatcher::start(config, None)?;
    let shared = dispatcher.ready.shared.clone();
    let mut connection = connect(dispatcher.ready.local_addr)?;
    let in_recovery = |connection: &mut bypass_lab::pgclient::PgConnection| -> anyhow::Result<String> {
        Ok(connection.query("select pg_is_in_recovery()")?.rows[0][0].clone().unwrap_or_default())
    };
    assert_eq!(in_recovery(&mut connection)?, "t", "a fresh replica serves reads");

    standby.psql("select pg_wal_replay_pause()")?;
    primary.psql("insert into seen values (3)")?;
    wait_until(Duration::from_secs(10), "lag to pass the limit", || {
        shared.backends[1].lag_ms.load(Ordering::Relaxed) > 300
    })?;
    assert_eq!(in_recovery(&mut connection)?, "f", "a lagging replica must not serve reads");

    standby.psql("select pg_wal_replay_resume()")?;
    wait_until(Duration::from_secs(10), "lag to recover", || shared.backends[1].lag_ms.load(Ordering::Relaxed) <= 300)?;
    assert_eq!(in_recovery(&mut connection)?, "t", "the caught-up replica serves reads again");
    drop(standby);
    Ok(())
}
