//! The `bypass pod …` commands as the binary wires them (`cli::Command` parsed by clap, then
//! `cli::run`): a logged run, a recovery from its logs, and bad input refused with a clear error.

mod common;

use bypass_pod::cli::{self, Command};
use clap::Parser;
use common::exclusive;

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
    // `recover` from it; both must succeed and the recovery must leave a non-empty log behind.
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
    let run: Vec<&str> = ["run", "--warmup-ms", "50", "--measure-ms", "300"].iter().chain(&common).copied().collect();
    cli::run(parse(&run)).expect("pod run");
    let logged: u64 = std::fs::read_dir(dir.path())
        .expect("log dir")
        .map(|entry| entry.expect("entry").metadata().expect("metadata").len())
        .sum();
    assert!(logged > 0, "the run wrote no log");
    let recover: Vec<&str> = std::iter::once("recover").chain(common).collect();
    cli::run(parse(&recover)).expect("pod recover");
    cli::run(parse(&["layout", "--hosts", "4"])).expect("pod layout");
}

#[test]
fn bad_arguments_are_refused_with_a_clear_error() {
    // Goal: bad input is a readable error, not a panic. Method: too many hosts, an impossible
    // read percentage, and recover without a log directory; each error must name the problem.
    let error = cli::run(parse(&["run", "--hosts", "9", "--read-percent", "150"])).expect_err("9 hosts");
    let text = format!("{error:#}");
    assert!(text.contains("hosts must be 1..=8"), "{text}");
    assert!(text.contains("percentages must be 0..=100"), "both problems are listed: {text}");
    let error = cli::run(parse(&["recover"])).expect_err("no log dir");
    assert!(format!("{error:#}").contains("--log-dir"), "{error:#}");
    assert!(Bypass::try_parse_from(["pod", "run", "--protocol", "2pc"]).is_err(), "unknown protocol accepted");
}
