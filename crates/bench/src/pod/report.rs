//! Results of `bypass bench pod`: medians per point, the issue's claims as ratios, and the
//! JSON, markdown and PNG files.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::{BenchArgs, Run, Secondary, Spec, Sweep};
use crate::report::machine::{git_revision, Machine};
use crate::report::stats::{median, median_run};
use bypass_pod::config::Protocol;
use bypass_pod::stats::{Counters, LatencyTable};

#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub hosts: usize,
    pub repetitions: usize,
    pub warmup_ms: u64,
    pub measure_ms: u64,
    pub keys_per_host: u64,
    pub small_warehouses: bool,
    pub quick: bool,
    pub secondary: Secondary,
    pub short_warmup_ms: u64,
    pub short_measure_ms: u64,
    pub main_hwcc_budget_bytes: u64,
}

/// Points of the full benchmark this run left out (`--secondary skip`): a panel and one of its
/// x values (every series there), or a whole sweep (x = "all").
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    pub panel: String,
    pub x: String,
}

impl Skipped {
    pub fn sweep(sweep: Sweep) -> Skipped {
        Skipped { panel: format!("{sweep:?}").to_lowercase(), x: "all".into() }
    }

    pub fn point(spec: &Spec) -> Skipped {
        Skipped { panel: spec.panel.into(), x: spec.x.clone() }
    }
}

/// Events per committed transaction in a point's median run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PerCommit {
    pub remote_accesses: f64,
    pub remote_index_hits: f64,
    pub remote_messages: f64,
    pub moves_in: f64,
    pub moves_out: f64,
    pub hwcc_lines_read: f64,
    pub hwcc_atomics: f64,
    pub owner_atomics: f64,
    pub invalidated_lines: f64,
    pub written_back_lines: f64,
    /// NoSWcc: lines hardware coherence fetched / carried where SWcc invalidates / writes back.
    pub coherent_fetched_lines: f64,
    pub coherent_written_lines: f64,
    /// Tuple-block lines invalidated or coherently fetched in the real (time-sliced) order, and
    /// the ones stale in logical time that the model prices instead ([`bypass_pod::staleness`]).
    pub block_fetched_lines: f64,
    pub model_stale_lines: f64,
    /// Block lines written by rows' first move-ins (not priced: they amortise in a long run).
    pub first_move_in_written_lines: f64,
    pub round_trips: f64,
    pub messages_sent: f64,
}

impl PerCommit {
    fn of(total: &Counters) -> PerCommit {
        let per = |value: u64| value as f64 / total.committed.max(1) as f64;
        PerCommit {
            remote_accesses: per(total.remote_accesses),
            remote_index_hits: per(total.remote_index_hits),
            remote_messages: per(total.remote_messages),
            moves_in: per(total.moves_in),
            moves_out: per(total.moves_out),
            hwcc_lines_read: per(total.hwcc_lines_read),
            hwcc_atomics: per(total.hwcc_atomics),
            owner_atomics: per(total.owner_atomics),
            invalidated_lines: per(total.swcc_invalidated_lines),
            written_back_lines: per(total.swcc_written_back_lines),
            coherent_fetched_lines: per(total.coherent_fetched_lines),
            coherent_written_lines: per(total.coherent_written_lines),
            block_fetched_lines: per(total.block_fetched_lines),
            model_stale_lines: per(total.model_stale_lines),
            first_move_in_written_lines: per(total.first_move_in_written_lines),
            round_trips: per(total.round_trips),
            messages_sent: per(total.messages_sent),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub sweep: Sweep,
    pub panel: &'static str,
    pub series: String,
    pub x: String,
    pub hwcc_budget_bytes: u64,
    /// Windows of this point's runs (a secondary point may run shorter than the headline ones).
    pub warmup_ms: u64,
    pub measure_ms: u64,
    /// Medians over the repetitions.
    pub measured_tps: f64,
    pub modelled_tps: f64,
    pub abort_rate: f64,
    pub commit_latency_p50_us: u64,
    pub commit_latency_p99_us: u64,
    pub hwcc_peak_bytes: u64,
    pub per_commit: PerCommit,
    pub runs: Vec<Run>,
}

/// One of Tigon's published ratios beside ours for the same point.
#[derive(Debug, Clone, Serialize)]
pub struct PublishedRow {
    pub what: String,
    pub tigon: f64,
    pub tigon_source: String,
    pub measured: Option<f64>,
    pub modelled: Option<f64>,
}

/// The model's independence of time-slicing, measured: the same point run normally and with
/// every host process pinned to one core.
#[derive(Debug, Clone, Serialize)]
pub struct PinnedCheck {
    pub normal_modelled_tps: f64,
    pub pinned_modelled_tps: f64,
    pub normal_measured_tps: f64,
    pub pinned_measured_tps: f64,
    /// |pinned − normal| ÷ normal, of the modelled medians.
    pub modelled_difference: f64,
}

/// One of the issue's "done when" targets, evaluated on measured and modelled medians.
#[derive(Debug, Clone, Serialize)]
pub struct Claim {
    pub claim: String,
    pub target: f64,
    /// True: the value must be at most the target (a loss); false: at least (a speed-up).
    pub at_most: bool,
    pub measured: Option<f64>,
    pub modelled: Option<f64>,
    /// Tigon's published figure for the same quantity.
    pub tigon: Option<f64>,
}

impl Claim {
    fn met(&self, value: Option<f64>) -> &'static str {
        match value {
            None => "—",
            Some(value) if (self.at_most && value <= self.target) || (!self.at_most && value >= self.target) => "met",
            Some(_) => "not met",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Results {
    pub command: String,
    pub started_unix_s: u64,
    pub git: String,
    pub machine: Machine,
    pub settings: Settings,
    pub latency_table: LatencyTable,
    /// HWcc bytes (whole pod) of the budget sweep's unconstrained runs.
    pub footprints: Vec<(String, u64)>,
    pub points: Vec<Point>,
    pub claims: Vec<Claim>,
    pub published: Vec<PublishedRow>,
    pub pinned: Option<PinnedCheck>,
    pub recovery: Vec<super::recovery::RecoveryRun>,
    pub skipped: Vec<Skipped>,
    /// Share of the machine's CPU time (all cores) that other work took during the run.
    pub other_work_share: Option<f64>,
    pub duration_s: f64,
}

/// What the model charges where Tigon's protocol and our implementation could disagree.
fn model_notes_markdown(md: &mut String) {
    let _ = writeln!(
        md,
        "What the counters charge, checked against what Tigon's protocol needs: \
         a latch is charged its compare-and-swaps, not the spins of a waiter (those measure time-slicing); \
         a pin (Tigon's `ref_cnt`) changes under the latch on the line the latch CAS already holds, so it is no second cross-host atomic; \
         a committed write to a CAT stores and writes back the TID line and the lines whose bytes changed, since a `clwb` of a clean line moves no data \
         (a TPC-C stock or customer update changes 1–2 of its 6–9 lines; a YCSB update rewrites the whole value, as YCSB's updates do); \
         a migration is charged what Tigon's code does for it (`TwoPLPashaExecutor` / `TwoPLPashaMessage.h` / `TwoPLPashaHelper.h`): \
         the requester's index search that misses, the request and reply, and a second search of the owner's index once the reply arrives (`get_migrated_row`) before it latches the tuple; \
         the owner's DRAM lookup and read of the row (as a baseline participant does), the HWcc index lines its link and the forced move-out's unlink touch, and the latches; \
         under WriteThrough the owner's retained block is reused (rewritten only if the DRAM row changed) and its move-in resets the host-valid bits, so readers re-fetch it; \
         under NoSWcc the block is freed at move-out and every move-in fills a fresh one (Tigon's `enable_scc=0` path: all CXL data is HWcc memory charged to the budget), \
         whose lines the owner writes and each reader fetches anew. \
         Every protocol batches a transaction's remote requests per phase as Tigon's executors do (`TwoPLTransaction::process_requests`: one flush, one wait): \
         a YCSB transaction has one phase, TPC-C NewOrder and Payment one each; a phase's migrations (Tigon-style) or reads and locks (baselines) go to each owner as one message. \
         DS2PL+ then pays, for a transaction that writes another host's tuple, a prepare round (with the participant's log records) and a decision round, and releases read-only participants one-way; \
         OCC+ (Silo-style) pays a lock round, a prepare-with-validation round and a decision round.\n"
    );
}

impl Results {
    pub fn new(args: &BenchArgs) -> Results {
        Results {
            command: std::env::args().collect::<Vec<_>>().join(" "),
            started_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_secs()),
            git: git_revision().unwrap_or_default(),
            machine: Machine::now(),
            settings: Settings {
                hosts: args.hosts,
                repetitions: args.repetitions,
                warmup_ms: args.warmup_ms,
                measure_ms: args.measure_ms,
                keys_per_host: args.keys_per_host,
                small_warehouses: args.small_warehouses,
                quick: args.quick,
                secondary: args.secondary,
                short_warmup_ms: args.short_warmup_ms,
                short_measure_ms: args.short_measure_ms,
                main_hwcc_budget_bytes: super::MAIN_BUDGET_BYTES,
            },
            latency_table: LatencyTable::default(),
            footprints: Vec::new(),
            points: Vec::new(),
            claims: Vec::new(),
            published: Vec::new(),
            pinned: None,
            recovery: Vec::new(),
            skipped: Vec::new(),
            other_work_share: None,
            duration_s: 0.0,
        }
    }

    /// Adds a sweep's points (medians of their runs).
    pub fn add(&mut self, specs: Vec<Spec>, runs: Vec<Vec<Run>>) {
        for (spec, runs) in specs.into_iter().zip(runs) {
            let succeeded: Vec<&Run> = runs.iter().filter(|run| run.error.is_none()).collect();
            let measured = median(&succeeded.iter().map(|run| run.measured_tps).collect::<Vec<_>>()).unwrap_or(0.0);
            let modelled = median(&succeeded.iter().map(|run| run.modelled_tps).collect::<Vec<_>>()).unwrap_or(0.0);
            // Counters and latencies come from one whole run: the median run by measured txn/s.
            let reported: Vec<_> = runs.iter().filter_map(|run| run.report.as_ref()).collect();
            let typical = median_run(&reported, |report| report.throughput_tps).map(|index| reported[index]);
            self.points.push(Point {
                sweep: spec.sweep,
                panel: spec.panel,
                series: spec.series,
                x: spec.x,
                hwcc_budget_bytes: spec.config.hwcc_budget_bytes,
                warmup_ms: spec.config.warmup_ms,
                measure_ms: spec.config.measure_ms,
                measured_tps: measured,
                modelled_tps: modelled,
                abort_rate: typical.map_or(0.0, |report| report.abort_rate),
                commit_latency_p50_us: typical.map_or(0, |report| report.commit_latency_p50_us),
                commit_latency_p99_us: typical.map_or(0, |report| report.commit_latency_p99_us),
                hwcc_peak_bytes: typical.map_or(0, |report| report.per_host.iter().map(|h| h.hwcc_peak_bytes).sum()),
                per_commit: typical.map(|report| PerCommit::of(&report.total)).unwrap_or_default(),
                runs,
            });
        }
        self.claims = self.evaluate_claims();
        self.published = super::published::all()
            .into_iter()
            .filter_map(|published| {
                let (measured, modelled) = self.ratio(published.numerator, published.denominator);
                (measured.is_some() || modelled.is_some()).then(|| PublishedRow {
                    what: published.what.into(),
                    tigon: published.tigon,
                    tigon_source: published.source.into(),
                    measured,
                    modelled,
                })
            })
            .collect();
        self.pinned = self.pinned_check();
    }

    fn pinned_check(&self) -> Option<PinnedCheck> {
        let tigon = Protocol::Tigon.label();
        let normal = self.point("ycsb", tigon, "100%")?;
        let pinned = self.point("pinned", tigon, "100%")?;
        (normal.modelled_tps > 0.0).then(|| PinnedCheck {
            normal_modelled_tps: normal.modelled_tps,
            pinned_modelled_tps: pinned.modelled_tps,
            normal_measured_tps: normal.measured_tps,
            pinned_measured_tps: pinned.measured_tps,
            modelled_difference: (pinned.modelled_tps - normal.modelled_tps).abs() / normal.modelled_tps,
        })
    }

    pub fn finish(&mut self, duration_s: f64) {
        self.duration_s = duration_s;
        self.machine.finish();
    }

    pub fn point(&self, panel: &str, series: &str, x: &str) -> Option<&Point> {
        self.points.iter().find(|point| point.panel == panel && point.series == series && point.x == x)
    }

    /// (measured, modelled) of `numerator ÷ denominator`, when both points exist.
    fn ratio(&self, a: (&str, &str, &str), b: (&str, &str, &str)) -> (Option<f64>, Option<f64>) {
        match (self.point(a.0, a.1, a.2), self.point(b.0, b.1, b.2)) {
            (Some(a), Some(b)) => {
                let divide = |x: f64, y: f64| (y > 0.0).then(|| x / y);
                (divide(a.measured_tps, b.measured_tps), divide(a.modelled_tps, b.modelled_tps))
            }
            _ => (None, None),
        }
    }

    fn evaluate_claims(&self) -> Vec<Claim> {
        let tigon = Protocol::Tigon.label();
        let mut claims = Vec::new();
        let mut speedup = |claim: &str, target: f64, a: (&str, &str, &str), b: (&str, &str, &str)| {
            let (measured, modelled) = self.ratio(a, b);
            let tigon = published_ratio(a, b);
            claims.push(Claim { claim: claim.into(), target, at_most: false, measured, modelled, tigon });
        };
        speedup(
            "TPC-C 60/90: Tigon-style ÷ OCC+",
            1.75,
            ("tpcc", tigon, "60/90"),
            ("tpcc", Protocol::Occ.label(), "60/90"),
        );
        speedup(
            "TPC-C 60/90: Tigon-style ÷ DS2PL+",
            2.4,
            ("tpcc", tigon, "60/90"),
            ("tpcc", Protocol::Ds2pl.label(), "60/90"),
        );
        speedup(
            "YCSB 95/5, 100% cross: Tigon-style ÷ OCC+",
            2.5,
            ("ycsb", tigon, "100%"),
            ("ycsb", Protocol::Occ.label(), "100%"),
        );
        speedup(
            "YCSB 95/5, 100% cross: Tigon-style ÷ DS2PL+",
            2.5,
            ("ycsb", tigon, "100%"),
            ("ycsb", Protocol::Ds2pl.label(), "100%"),
        );
        let swcc = "YCSB 95/5 100%";
        speedup(
            "YCSB 95/5, 100% cross: SWcc (WriteThrough) ÷ NoSWcc",
            3.0,
            ("swcc_ycsb", swcc, "WriteThrough"),
            ("swcc_ycsb", swcc, "NoSwcc"),
        );
        let (sharing, alone) = (("tpcc", tigon, "60/90"), ("tpcc", tigon, "0/0"));
        let (measured, modelled) = self.ratio(sharing, alone);
        let loss = |ratio: f64| 1.0 - ratio;
        claims.push(Claim {
            claim: "TPC-C: Tigon-style loss from 0/0 to 60/90".into(),
            target: 0.20,
            at_most: true,
            measured: measured.map(loss),
            modelled: modelled.map(loss),
            tigon: published_ratio(sharing, alone).map(loss),
        });
        claims
    }

    pub fn write(&self, out: &Path) -> anyhow::Result<()> {
        crate::report::write(out, "pod", self, &self.markdown(), |png| super::plot::render(self, png))
    }

    pub fn summary(&self) -> String {
        let mut out = String::new();
        for claim in &self.claims {
            let _ = writeln!(
                out,
                "{}: measured {} ({}), modelled {} ({}), target {}{}",
                claim.claim,
                format_claim(claim.measured, claim.at_most),
                claim.met(claim.measured),
                format_claim(claim.modelled, claim.at_most),
                claim.met(claim.modelled),
                if claim.at_most { "≤ " } else { "≥ " },
                format_claim(Some(claim.target), claim.at_most)
            );
        }
        let _ = writeln!(out, "\nFor the README: {}", self.readme_figures());
        out
    }
}

/// Tigon's published ratio of the same two points, if the paper has one.
fn published_ratio(numerator: (&str, &str, &str), denominator: (&str, &str, &str)) -> Option<f64> {
    super::published::all()
        .into_iter()
        .find(|published| published.numerator == numerator && published.denominator == denominator)
        .map(|published| published.tigon)
}

/// Other work's share of the cores' time from which a run counts as taken under load.
const OTHER_WORK_LIMIT: f64 = 0.10;

fn format_claim(value: Option<f64>, percent: bool) -> String {
    match value {
        None => "—".into(),
        Some(value) if percent => format!("{:.0}%", value * 100.0),
        Some(value) => format!("{value:.2}×"),
    }
}

fn thousands(value: f64) -> String {
    if value >= 10_000.0 {
        format!("{:.1}k", value / 1000.0)
    } else {
        format!("{value:.0}")
    }
}

impl Results {
    fn markdown(&self) -> String {
        let mut md = String::new();
        let _ = writeln!(md, "# Pod benchmark: Tigon-style vs DS2PL+ vs OCC+ (TPC-C, YCSB) and Tigon's ablations\n");
        let _ = writeln!(
            md,
            "`{}` — git {} — {}, {} host processes. Load average before {}, after {}. Took {:.0} s.\n",
            self.command,
            self.git,
            self.machine.headline(),
            self.settings.hosts,
            self.machine.load_average_before,
            self.machine.load_average_after,
            self.duration_s
        );
        let _ = writeln!(
            md,
            "Each cell: **measured** txn/s / *modelled* txn/s, the median of {} runs ({} ms warm-up, {} ms measured; repetitions interleaved across series). \
             Measured = committed transactions per second on this {}-core machine, where every host process (one worker + one logger) shares two cores with the others; \
             message round trips depend on the peer being scheduled, so baselines suffer more than they would with a core per host. \
             Modelled = the same runs' counted events (CXL lines read and written back, atomics, fences, messages, round trips, tuple operations — the same CPU cost for a tuple in DRAM, a shared one in CXL or one read by message) priced by the latency table at the end; \
             a request waits the transport plus the rest of the peer's current busy segment (length-biased: Σs²/2T over the peer's segments between inbox polls; zero while the peer itself waits and polls), \
             and NoSWcc pays the hardware-coherent line transfers (fetches of lines another host wrote, lines written for others) that WriteThrough makes by flushes. \
             Which reads of a shared tuple find the reader's copy stale is judged in logical time, not in the order the two cores happened to run the hosts: \
             every host traces its reads, writes and move-ins of CAT blocks stamped with its own transaction count, and after the run the traces are merged by that count, \
             as if the hosts ran truly in parallel at equal rates (a core per host); a read is stale if another host wrote the block (or, for remote copies, reset its valid bits) \
             since this host last read it — Tigon's WriteThrough rule, and under NoSWcc a coherence miss. The rate of stale lines per read in the logical span all hosts cover \
             is applied to each host's reads in its measured window. First touches (a host's first read of a block, under SWcc a row's first move-in into a fresh block) are compulsory, \
             not priced: they amortise in a long run like Tigon's 20 s ones, while how many fall in a short window depends on the machine's speed. \
             {} YCSB: {} keys per host, 1000-byte values, 10 operations, zipfian. TPC-C: one warehouse per host ({}). \
             Redo logging with 10 ms group commit for all protocols (same logger); Tigon pre-migrates the shareable tables (TPC-C CUSTOMER and STOCK, the YCSB table) while the budget lasts, except at 0% remote/cross; HWcc budget {} MiB for the pod unless swept.\n",
            self.settings.repetitions,
            self.settings.warmup_ms,
            self.settings.measure_ms,
            self.machine.nproc,
            self.pinned_sentence(),
            self.settings.keys_per_host,
            if self.settings.small_warehouses { "small: 60 customers per district, 1000 items" } else { "full size: 10 districts × 3000 customers, 100 000 items" },
            self.settings.main_hwcc_budget_bytes >> 20
        );
        if let Some(warning) = self.load_warning() {
            let _ = writeln!(md, "{warning}\n");
        }
        model_notes_markdown(&mut md);
        self.coverage_markdown(&mut md);
        self.readme_markdown(&mut md);
        self.claims_markdown(&mut md);
        self.published_markdown(&mut md);
        let protocols: Vec<&str> =
            [Protocol::Tigon, Protocol::Ds2pl, Protocol::Occ].iter().map(|p| p.label()).collect();
        self.table(&mut md, "tpcc", "TPC-C: throughput vs remote NewOrder/Payment %", "remote NO/P", &protocols, true);
        self.table(&mut md, "ycsb", "YCSB 95/5 θ=0.7: throughput vs cross-partition ratio", "cross", &protocols, true);
        self.table(&mut md, "ycsb_mix", "YCSB at 100% cross: read/write mixes", "R/W", &protocols, true);
        for (label, bytes) in &self.footprints {
            let _ = writeln!(md, "Unconstrained HWcc footprint of {label}: {} KiB (whole pod).\n", bytes / 1024);
        }
        self.table(
            &mut md,
            "budget",
            "Tigon-style vs HWcc budget (fraction of the unconstrained footprint)",
            "budget",
            &[],
            false,
        );
        self.table(
            &mut md,
            "swcc_ycsb",
            "SWcc variants and NoSWcc (Tigon-style, YCSB 95/5 100% cross)",
            "variant",
            &[],
            false,
        );
        self.table(&mut md, "swcc_tpcc", "SWcc variants and NoSWcc (Tigon-style, TPC-C 60/90)", "variant", &[], false);
        self.table(&mut md, "shortcut", "Shortcut pointer on/off (Tigon-style)", "shortcut", &[], false);
        self.epoch_markdown(&mut md);
        self.recovery_markdown(&mut md);
        self.events_markdown(&mut md);
        let _ = writeln!(md, "## Latency table of the model (ns)\n\n```\n{:#?}\n```", self.latency_table);
        md
    }

    /// A warning when other work shared the machine: it took 10% or more of the cores' time
    /// during the run (or, where that is unknown, the 1-minute load average before or after the
    /// run reached the core count).
    fn load_warning(&self) -> Option<String> {
        let loaded = match self.other_work_share {
            Some(share) => share >= OTHER_WORK_LIMIT,
            None => self.max_load() >= self.machine.nproc as f64,
        };
        loaded.then(|| {
            format!(
                "**Taken under load** ({}: other work shared the machine). \
                 The measured figures are not meaningful; the modelled ones depend on how the cores were shared only through the abort rates (see the pinned-to-one-core check below).",
                self.load_description()
            )
        })
    }

    /// How busy the machine was with other work, in words.
    fn load_description(&self) -> String {
        let load = format!("1-minute load average up to {:.1} on {} cores", self.max_load(), self.machine.nproc);
        match self.other_work_share {
            Some(share) => format!("other work took {:.0}% of the cores' time during the run; {load}", share * 100.0),
            None => load,
        }
    }

    /// The higher 1-minute load average of before and after the run.
    fn max_load(&self) -> f64 {
        let one_minute = |text: &str| text.split_whitespace().next().and_then(|value| value.parse::<f64>().ok());
        [&self.machine.load_average_before, &self.machine.load_average_after]
            .into_iter()
            .filter_map(|text| one_minute(text))
            .fold(0.0, f64::max)
    }

    /// The figures the README's pod paragraph quotes, as sentences to paste (from this run).
    fn readme_markdown(&self, md: &mut String) {
        let _ = writeln!(
            md,
            "## Figures the README quotes\n\n\
             The README's pod paragraph quotes these; after a new run, its sentences are replaced by these:\n\n> {}\n",
            self.readme_figures()
        );
    }

    /// The README's figure sentences: how the run was taken, round trips, modelled ratios beside
    /// Tigon's, the targets missed, the pinned check and the recovery point.
    pub fn readme_figures(&self) -> String {
        let tigon = Protocol::Tigon.label();
        let (ds2pl, occ) = (Protocol::Ds2pl.label(), Protocol::Occ.label());
        let modelled = |a: (&str, &str, &str), b: (&str, &str, &str)| format_claim(self.ratio(a, b).1, false);
        let mut text = self.run_sentence();
        if let Some(point) = self.point("ycsb", ds2pl, "100%") {
            let _ = write!(
                text,
                " DS2PL+ waits {:.2} times per YCSB 95/5 cross transaction (OCC+ {:.2}).",
                point.per_commit.round_trips,
                self.point("ycsb", occ, "100%").map_or(0.0, |point| point.per_commit.round_trips)
            );
        }
        let loss = self.ratio(("tpcc", tigon, "60/90"), ("tpcc", tigon, "0/0")).1.map(|ratio| 1.0 - ratio);
        let _ = write!(
            text,
            " Modelled, beside Tigon's published ratio for the same point: TPC-C 60/90 {} DS2PL+ (Tigon 2.41×) and {} OCC+ \
             (Tigon's Sundial+ 1.75×; ours is Silo-style and validates every remote read), YCSB 95/5 at 100% cross {} DS2PL+ (2.29×) \
             and {} OCC+ (2.49×), a {} loss from TPC-C 0/0 to 60/90 (19%).",
            modelled(("tpcc", tigon, "60/90"), ("tpcc", ds2pl, "60/90")),
            modelled(("tpcc", tigon, "60/90"), ("tpcc", occ, "60/90")),
            modelled(("ycsb", tigon, "100%"), ("ycsb", ds2pl, "100%")),
            modelled(("ycsb", tigon, "100%"), ("ycsb", occ, "100%")),
            format_claim(loss, true)
        );
        let missed: Vec<String> = self
            .claims
            .iter()
            .filter(|claim| claim.met(claim.modelled) == "not met")
            .map(|claim| {
                format!(
                    "{} is {} (target {}{}{})",
                    claim.claim,
                    format_claim(claim.modelled, claim.at_most),
                    if claim.at_most { "≤ " } else { "≥ " },
                    format_claim(Some(claim.target), claim.at_most),
                    claim
                        .tigon
                        .map_or(String::new(), |tigon| format!(", Tigon {}", format_claim(Some(tigon), claim.at_most)))
                )
            })
            .collect();
        if !missed.is_empty() {
            let _ = write!(text, " Missed (modelled): {}.", missed.join("; "));
        }
        if let Some(check) = &self.pinned {
            let _ = write!(
                text,
                " Pinned check: both hosts pinned to one core model {:.1}% apart from the unpinned run.",
                check.modelled_difference * 100.0
            );
        }
        if let Some(run) = self.recovery.iter().find(|run| run.checkpoint_log_bytes > 0 && run.error.is_none()) {
            let _ = write!(
                text,
                " Recovery after a whole-pod SIGKILL {:.0} s into a YCSB 95/5 run ({}): {} MiB of log on disk, recovered in {:.1} s, \
                 {} of {} acknowledged transactions lost.",
                run.ran_s,
                run.label,
                run.log_bytes_on_disk >> 20,
                run.recovery_ms as f64 / 1000.0,
                run.acked_lost,
                run.acked_recorded
            );
        }
        text
    }

    /// How the committed results were taken, for the README.
    fn run_sentence(&self) -> String {
        let settings = &self.settings;
        let windows = format!(
            "{} × {} s + {} s",
            settings.repetitions,
            settings.warmup_ms as f64 / 1000.0,
            settings.measure_ms as f64 / 1000.0
        );
        let covered = match settings.secondary {
            Secondary::Full => format!("every point {windows}"),
            Secondary::Short => format!(
                "headline points {windows}, the other points 1 × {} s + {} s",
                settings.short_warmup_ms as f64 / 1000.0,
                settings.short_measure_ms as f64 / 1000.0
            ),
            Secondary::Skip => format!("headline points {windows}; the secondary points were not run"),
        };
        match self.load_warning() {
            Some(_) => format!(
                "The committed results were taken under load ({covered}; {}), so their measured column means nothing.",
                self.load_description()
            ),
            None => format!(
                "The committed results are a run on the {}-core machine with little else running ({covered}; {}).",
                self.machine.nproc,
                self.load_description()
            ),
        }
    }

    /// A secondary point run shorter than the headline ones (`--secondary short`).
    fn is_short(&self, point: &Point) -> bool {
        (point.warmup_ms, point.measure_ms) != (self.settings.warmup_ms, self.settings.measure_ms)
    }

    /// Which points ran how, and which of the full benchmark's were left out.
    fn coverage_markdown(&self, md: &mut String) {
        let settings = &self.settings;
        let _ = writeln!(
            md,
            "## What this run covered\n\n\
             - **Headline points**, {} × ({} ms warm-up + {} ms measured): TPC-C at Tigon's four remote shares (0/0, 10/15, 30/45, 60/90) and YCSB 95/5 at 0% and 100% cross, each for all three protocols; \
             SWcc WriteThrough and NoSWcc on YCSB 95/5 at 100% cross; the pinned-to-one-core check; the crash-and-recovery point with checkpoints (one run).",
            settings.repetitions, settings.warmup_ms, settings.measure_ms
        );
        let secondary = match settings.secondary {
            Secondary::Full => "as the headline points".to_string(),
            Secondary::Short => format!(
                "one run each of {} ms warm-up + {} ms measured (marked † in the tables; their figures are less settled than the headline ones)",
                settings.short_warmup_ms, settings.short_measure_ms
            ),
            Secondary::Skip => "not run".to_string(),
        };
        let _ = writeln!(md, "- **Secondary points** (every other one): {secondary}.");
        if self.settings.quick {
            let _ = writeln!(md, "- `--quick`: only the ends and middle of each sweep.");
        }
        if !self.skipped.is_empty() {
            let mut panels: Vec<(&str, Vec<&str>)> = Vec::new();
            for skipped in &self.skipped {
                match panels.iter_mut().find(|(panel, _)| *panel == skipped.panel) {
                    Some((_, xs)) if !xs.contains(&skipped.x.as_str()) => xs.push(&skipped.x),
                    Some(_) => {}
                    None => panels.push((&skipped.panel, vec![&skipped.x])),
                }
            }
            let list: Vec<String> = panels
                .iter()
                .map(|(panel, xs)| {
                    if xs == &["all"] {
                        format!("{panel} (whole sweep)")
                    } else {
                        format!("{panel} at {}", xs.join(", "))
                    }
                })
                .collect();
            let _ = writeln!(md, "- **Not run** (points of the full benchmark left out): {}.", list.join("; "));
        }
        md.push('\n');
    }

    fn pinned_sentence(&self) -> String {
        match &self.pinned {
            Some(check) => format!(
                "Whether the model depends on how the cores time-slice the hosts is measured: YCSB 95/5 at 100% cross with both host processes pinned to one core models {} txn/s against {} txn/s unpinned ({:.1}% apart; measured {} vs {} txn/s), and the events table shows the block lines re-read in real order beside the modelled ones.",
                thousands(check.pinned_modelled_tps),
                thousands(check.normal_modelled_tps),
                check.modelled_difference * 100.0,
                thousands(check.pinned_measured_tps),
                thousands(check.normal_measured_tps)
            ),
            None => "The pinned-to-one-core check of the model was not part of this run (`--only pinned,ycsb`).".into(),
        }
    }

    fn published_markdown(&self, md: &mut String) {
        if self.published.is_empty() {
            return;
        }
        let _ = writeln!(
            md,
            "## Beside Tigon's published figures\n\n\
             Tigon's ratio for the same point (artifact CSVs, 8 hosts × 3 workers), ours measured and modelled, and ours modelled ÷ Tigon's.\n\n\
             | point | Tigon | (from) | ours measured | ours modelled | modelled ÷ Tigon |\n|---|---|---|---|---|---|"
        );
        for row in &self.published {
            let _ = writeln!(
                md,
                "| {} | {:.2}× | {} | {} | {} | {} |",
                row.what,
                row.tigon,
                row.tigon_source,
                format_claim(row.measured, false),
                format_claim(row.modelled, false),
                row.modelled.map_or("—".into(), |modelled| format!("{:.2}", modelled / row.tigon))
            );
        }
        md.push_str("\nWhy ours may differ from Tigon's even where both are right:\n\n");
        for note in super::published::DIFFERENCES {
            let _ = writeln!(md, "- {note}");
        }
        md.push('\n');
    }

    fn claims_markdown(&self, md: &mut String) {
        let _ = writeln!(md, "## The issue's targets\n\n| claim | target | measured | modelled |\n|---|---|---|---|");
        for claim in &self.claims {
            let _ = writeln!(
                md,
                "| {} | {}{} | {} ({}) | {} ({}) |",
                claim.claim,
                if claim.at_most { "≤ " } else { "≥ " },
                format_claim(Some(claim.target), claim.at_most),
                format_claim(claim.measured, claim.at_most),
                claim.met(claim.measured),
                format_claim(claim.modelled, claim.at_most),
                claim.met(claim.modelled)
            );
        }
        md.push('\n');
    }

    /// Series and x values of a panel, in the order they were run.
    fn axes(&self, panel: &str) -> (Vec<String>, Vec<String>) {
        let mut series: Vec<String> = Vec::new();
        let mut xs: Vec<String> = Vec::new();
        for point in self.points.iter().filter(|point| point.panel == panel) {
            if !series.contains(&point.series) {
                series.push(point.series.clone());
            }
            if !xs.contains(&point.x) {
                xs.push(point.x.clone());
            }
        }
        (series, xs)
    }

    fn table(&self, md: &mut String, panel: &str, title: &str, x_name: &str, protocols: &[&str], ratios: bool) {
        let (series, xs) = self.axes(panel);
        if xs.is_empty() {
            return;
        }
        let _ = writeln!(md, "## {title}\n");
        let mut header = format!("| {x_name} |");
        for name in &series {
            header.push_str(&format!(" {name} |"));
        }
        if ratios {
            for name in &protocols[1..] {
                header.push_str(&format!(" Tigon ÷ {name} |"));
            }
        }
        let _ = writeln!(md, "{header}\n|{}", "---|".repeat(header.matches('|').count() - 1));
        for x in &xs {
            let mut row = format!("| {x} |");
            for name in &series {
                row.push_str(&match self.point(panel, name, x) {
                    Some(point) => format!(
                        " **{}** / *{}*{}{} |",
                        thousands(point.measured_tps),
                        thousands(point.modelled_tps),
                        if self.is_short(point) { " †" } else { "" },
                        failure_note(point)
                    ),
                    None => " — |".into(),
                });
            }
            if ratios {
                for name in &protocols[1..] {
                    let (measured, modelled) = self.ratio((panel, protocols[0], x), (panel, name, x));
                    row.push_str(&format!(
                        " {} / *{}* |",
                        format_claim(measured, false),
                        format_claim(modelled, false)
                    ));
                }
            }
            let _ = writeln!(md, "{row}");
        }
        md.push('\n');
    }

    fn epoch_markdown(&self, md: &mut String) {
        let points: Vec<&Point> = self.points.iter().filter(|point| point.panel == "epoch").collect();
        if points.is_empty() {
            return;
        }
        let _ = writeln!(md, "## Group-commit epoch length (Tigon-style, TPC-C 60/90)\n\n| epoch | txn/s measured / *modelled* | commit → ack p50 / p99 (µs, median run) |\n|---|---|---|");
        for point in points {
            let _ = writeln!(
                md,
                "| {} | **{}** / *{}* | {} / {} |",
                point.x,
                thousands(point.measured_tps),
                thousands(point.modelled_tps),
                point.commit_latency_p50_us,
                point.commit_latency_p99_us
            );
        }
        md.push_str("\nLatencies are power-of-two bucket upper bounds; \"no log\" acknowledges at commit.\n\n");
    }

    fn recovery_markdown(&self, md: &mut String) {
        if self.recovery.is_empty() {
            return;
        }
        let _ = writeln!(
            md,
            "## Crash and recovery (Tigon-style, YCSB 95/5 at 100% cross)\n\n\
             Every host SIGKILLed after the warm-up and measured time; the pod restarts from its checkpoints and logs. \
             Each acknowledged transaction's id was recorded when it was acknowledged; after recovery each is found in a kept commit record or covered by every host's checkpoint, or counted lost.\n\n\
             | run | ran (s) | acknowledged before the kill | log on disk (MiB) | checkpoints on disk (MiB) | recovery (ms) | acknowledged: recorded / in logs / in checkpoints / **lost** |\n|---|---|---|---|---|---|---|"
        );
        for run in &self.recovery {
            let _ = writeln!(
                md,
                "| {}{} | {:.0} | {} | {} | {} | {} | {} / {} / {} / **{}** |",
                run.label,
                run.error.as_deref().map(|error| format!(" (failed: {error})")).unwrap_or_default(),
                run.ran_s,
                run.acked_before_kill,
                run.log_bytes_on_disk >> 20,
                run.checkpoint_bytes_on_disk >> 20,
                run.recovery_ms,
                run.acked_recorded,
                run.acked_in_logs,
                run.acked_in_checkpoints,
                run.acked_lost
            );
        }
        md.push('\n');
    }

    fn events_markdown(&self, md: &mut String) {
        let _ = writeln!(
            md,
            "## Events per committed transaction (median run of each point)\n\n\
             | panel | series | x | aborts | remote | via index | via message | moves in / out | HWcc lines | cross-host atomics | owner atomics | lines invalidated / coherent misses | lines written back / coherent writes | block lines re-read: real order / *modelled* | messages |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for point in &self.points {
            let c = &point.per_commit;
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.1}% | {:.2} | {:.2} | {:.2} | {:.3} / {:.3} | {:.1} | {:.1} | {:.1} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} / *{:.1}* | {:.2} |",
                point.panel,
                point.series,
                point.x,
                point.abort_rate * 100.0,
                c.remote_accesses,
                c.remote_index_hits,
                c.remote_messages,
                c.moves_in,
                c.moves_out,
                c.hwcc_lines_read,
                c.hwcc_atomics,
                c.owner_atomics,
                c.invalidated_lines,
                c.coherent_fetched_lines,
                c.written_back_lines,
                c.coherent_written_lines,
                c.block_fetched_lines,
                c.model_stale_lines,
                c.messages_sent
            );
        }
        md.push('\n');
    }
}

fn failure_note(point: &Point) -> String {
    let failed = point.runs.iter().filter(|run| run.error.is_some()).count();
    if failed == 0 {
        String::new()
    } else {
        format!(" ({failed} of {} runs failed)", point.runs.len())
    }
}
