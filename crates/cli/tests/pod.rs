//! The `bypass pod …` commands as the binary wires them (`bypass_cli::pod::Command` parsed by
//! clap, then `bypass_cli::pod::run`): a logged run, a recovery from its logs, and bad input
//! refused with a clear error.

use std::sync::{Mutex, MutexGuard};

use bypass_cli::pod::{self, Command};
use clap::Parser;

static ONE_POD_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Serialises pods across the tests of this binary (each forks its hosts and uses both cores).
fn exclusive() -> MutexGuard<'static, ()> {
    ONE_POD_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What `bypass pod` does with its arguments: `#[command(subcommand)]` over [`Command`].
#[derive(Parser)]
struct Bypass {
    #[command(subcommand)]
    command: Command,
}

fn parse(args: &[&str]) -> Command {
    Bypass::try_parse_from(std::iter::once("pod").chain(args.iter().copied()))
        .unwrap_or_else(|error| panic!("arguments {args:?} rejected: {error}"))
        .command
}

#[test]
fn run_then_recover_from_the_command_line() {
    // Goal: the command-line path starts hosts, logs, and recovers with the workload's checks.
    // Method: `run` a cross-host bank on simulated incoherent caches with a log directory, then
    // `recover` from it; both must succeed and the recovery must leave a non-empty log behind;
    // with --record-acked the run records acknowledged ids and recover checks each one survived.
    let _pod = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let log_dir = dir.path().to_str().expect("utf-8 temp path");
    let common = [
        "--workload",
        "bank",
        "--keys-per-host",
        "50",
        "--cross-percent",
        "50",
        "--coherence",
        "incoherent",
        "--hwcc-budget-kib",
        "1024",
        "--swcc-mib",
        "4",
        "--log-dir",
        log_dir,
        "--epoch-ms",
        "4",
    ];
    let run: Vec<&str> =
        ["run", "--warmup-ms", "50", "--measure-ms", "300", "--record-acked"].iter().chain(&common).copied().collect();
    pod::run(parse(&run)).expect("pod run");
    let logged: u64 = std::fs::read_dir(dir.path())
        .expect("log dir")
        .map(|entry| entry.expect("entry").metadata().expect("metadata").len())
        .sum();
    assert!(logged > 0, "the run wrote no log");
    let recorded = dir.path().join("acked-0.ids").metadata().map(|m| m.len()).unwrap_or(0);
    assert!(recorded > 0, "--record-acked wrote no acknowledged ids");
    let recover: Vec<&str> = std::iter::once("recover").chain(common).collect();
    pod::run(parse(&recover)).expect("pod recover");
    pod::run(parse(&["layout", "--hosts", "4"])).expect("pod layout");
}

#[test]
fn bad_arguments_are_refused_with_a_clear_error() {
    // Goal: bad input is a readable error, not a panic. Method: too many hosts, an impossible
    // read percentage, and recover without a log directory; each error must name the problem.
    let error = pod::run(parse(&["run", "--hosts", "9", "--read-percent", "150"])).expect_err("9 hosts");
    let text = format!("{error:#}");
    assert!(text.contains("hosts must be 1..=8"), "{text}");
    assert!(text.contains("percentages must be 0..=100"), "both problems are listed: {text}");
    let error = pod::run(parse(&["recover"])).expect_err("no log dir");
    assert!(format!("{error:#}").contains("--log-dir"), "{error:#}");
    assert!(Bypass::try_parse_from(["pod", "run", "--protocol", "2pc"]).is_err(), "unknown protocol accepted");
}
