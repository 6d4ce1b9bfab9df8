//! Tigon's published figures for the points this benchmark measures, as ratios, so every modelled
//! ratio of ours stands beside the one the paper's artifact reports for the same point.
//!
//! Source: the authors' result CSVs in `ut-datasys/tigon` at `86a494f^` (`results/spr/…`), as
//! tabulated in the design brief (pod.md §1.3–1.4): 8 hosts × 3 workers on an emulated CXL pod.
//! Tigon's second baseline is Sundial+ (distributed OCC with leases and caching); ours is a
//! Silo-style OCC+, so those rows compare different OCC designs.

use bypass_pod::config::Protocol;

/// One published ratio and the two points of ours that form the same ratio.
#[derive(Debug, Clone, Copy)]
pub struct Published {
    pub what: &'static str,
    /// (panel, series, x) of the numerator and denominator points.
    pub numerator: (&'static str, &'static str, &'static str),
    pub denominator: (&'static str, &'static str, &'static str),
    pub tigon: f64,
    /// Tigon's raw figures the ratio comes from.
    pub source: &'static str,
}

const TIGON: &str = "Tigon-style";
const SWCC_YCSB: &str = "YCSB 95/5 100%";
const SWCC_TPCC: &str = "TPC-C 60/90";
const BUDGET_TPCC: &str = "TPC-C 60/90";
const BUDGET_YCSB: &str = "YCSB 95/5 θ=0.7 cross 100%";

fn versus(
    what: &'static str,
    panel: &'static str,
    x: &'static str,
    baseline: Protocol,
    tigon: f64,
    source: &'static str,
) -> Published {
    Published { what, numerator: (panel, TIGON, x), denominator: (panel, baseline.label(), x), tigon, source }
}

fn within(
    what: &'static str,
    panel: &'static str,
    series: &'static str,
    (numerator, denominator): (&'static str, &'static str),
    tigon: f64,
    source: &'static str,
) -> Published {
    Published { what, numerator: (panel, series, numerator), denominator: (panel, series, denominator), tigon, source }
}

/// Every published ratio with a matching point here.
pub fn all() -> Vec<Published> {
    let (d, o) = (Protocol::Ds2pl, Protocol::Occ);
    vec![
        versus("TPC-C 0/0: Tigon ÷ DS2PL+", "tpcc", "0/0", d, 0.94, "411.8k / 438.8k"),
        versus("TPC-C 0/0: Tigon ÷ OCC+ (Tigon: Sundial+)", "tpcc", "0/0", o, 0.71, "411.8k / 581.0k"),
        versus("TPC-C 10/15: Tigon ÷ DS2PL+", "tpcc", "10/15", d, 1.27, "348.4k / 274.9k"),
        versus("TPC-C 10/15: Tigon ÷ OCC+ (Tigon: Sundial+)", "tpcc", "10/15", o, 0.93, "348.4k / 374.2k"),
        versus("TPC-C 30/45: Tigon ÷ DS2PL+", "tpcc", "30/45", d, 1.84, "340.7k / 184.7k"),
        versus("TPC-C 30/45: Tigon ÷ OCC+ (Tigon: Sundial+)", "tpcc", "30/45", o, 1.32, "340.7k / 258.5k"),
        versus("TPC-C 60/90: Tigon ÷ DS2PL+", "tpcc", "60/90", d, 2.41, "334.9k / 139.1k"),
        versus("TPC-C 60/90: Tigon ÷ OCC+ (Tigon: Sundial+)", "tpcc", "60/90", o, 1.75, "334.9k / 191.5k"),
        within("TPC-C: Tigon 60/90 ÷ 0/0 (1 − loss)", "tpcc", TIGON, ("60/90", "0/0"), 0.81, "334.9k / 411.8k"),
        versus("YCSB 95/5 0%: Tigon ÷ DS2PL+", "ycsb", "0%", d, 0.98, "1.68M / 1.71M"),
        versus("YCSB 95/5 0%: Tigon ÷ OCC+ (Tigon: Sundial+)", "ycsb", "0%", o, 0.94, "1.68M / 1.79M"),
        versus("YCSB 95/5 100%: Tigon ÷ DS2PL+", "ycsb", "100%", d, 2.29, "627.0k / 274.0k"),
        versus("YCSB 95/5 100%: Tigon ÷ OCC+ (Tigon: Sundial+)", "ycsb", "100%", o, 2.49, "627.0k / 251.6k"),
        versus("YCSB 100/0 100%: Tigon ÷ DS2PL+", "ycsb_mix", "100/0", d, 2.87, "1.075M / 374.1k"),
        versus("YCSB 100/0 100%: Tigon ÷ OCC+ (Tigon: Sundial+)", "ycsb_mix", "100/0", o, 2.77, "1.075M / 387.5k"),
        versus("YCSB 50/50 100%: Tigon ÷ DS2PL+", "ycsb_mix", "50/50", d, 2.09, "249.7k / 119.6k"),
        versus("YCSB 50/50 100%: Tigon ÷ OCC+ (Tigon: Sundial+)", "ycsb_mix", "50/50", o, 2.02, "249.7k / 123.4k"),
        versus("YCSB 0/100 100%: Tigon ÷ DS2PL+", "ycsb_mix", "0/100", d, 2.08, "171.7k / 82.4k"),
        versus("YCSB 0/100 100%: Tigon ÷ OCC+ (Tigon: Sundial+)", "ycsb_mix", "0/100", o, 2.06, "171.7k / 83.4k"),
        versus("YCSB 50/50 θ0.99 100%: Tigon ÷ DS2PL+", "ycsb_mix", "50/50 θ0.99", d, 3.47, "126.7k / 36.6k"),
        versus(
            "YCSB 50/50 θ0.99 100%: Tigon ÷ OCC+ (Tigon: Sundial+)",
            "ycsb_mix",
            "50/50 θ0.99",
            o,
            2.53,
            "126.7k / 50.1k",
        ),
        within(
            "YCSB 95/5 100%: WriteThrough ÷ NoSWcc",
            "swcc_ycsb",
            SWCC_YCSB,
            ("WriteThrough", "NoSwcc"),
            3.80,
            "627.0k / 165.2k",
        ),
        within(
            "YCSB 95/5 100%: NoSharedReader ÷ WriteThrough",
            "swcc_ycsb",
            SWCC_YCSB,
            ("NoSharedReader", "WriteThrough"),
            0.60,
            "373.4k / 627.0k",
        ),
        within(
            "YCSB 95/5 100%: NonTemporal ÷ WriteThrough",
            "swcc_ycsb",
            SWCC_YCSB,
            ("NonTemporal", "WriteThrough"),
            0.51,
            "320.1k / 627.0k",
        ),
        within(
            "TPC-C 60/90: NoSWcc ÷ WriteThrough",
            "swcc_tpcc",
            SWCC_TPCC,
            ("NoSwcc", "WriteThrough"),
            0.81,
            "270.3k / 334.9k",
        ),
        within(
            "TPC-C 60/90: NonTemporal ÷ WriteThrough",
            "swcc_tpcc",
            SWCC_TPCC,
            ("NonTemporal", "WriteThrough"),
            0.71,
            "237.8k / 334.9k",
        ),
        within(
            "TPC-C 60/90: NoSharedReader ÷ WriteThrough",
            "swcc_tpcc",
            SWCC_TPCC,
            ("NoSharedReader", "WriteThrough"),
            1.00,
            "equal",
        ),
        within(
            "TPC-C 60/90: budget 75% ÷ 100% (Tigon 150 ÷ 200 MB)",
            "budget",
            BUDGET_TPCC,
            ("75%", "100%"),
            0.95,
            "317.1k / 334.9k",
        ),
        within(
            "TPC-C 60/90: budget 50% ÷ 100% (Tigon 100 ÷ 200 MB)",
            "budget",
            BUDGET_TPCC,
            ("50%", "100%"),
            0.95,
            "318.0k / 334.9k",
        ),
        within(
            "TPC-C 60/90: budget 25% ÷ 100% (Tigon 50 ÷ 200 MB)",
            "budget",
            BUDGET_TPCC,
            ("25%", "100%"),
            0.92,
            "307.8k / 334.9k",
        ),
        within(
            "TPC-C 60/90: budget 5% ÷ 100% (Tigon 10 ÷ 200 MB)",
            "budget",
            BUDGET_TPCC,
            ("5%", "100%"),
            0.74,
            "247.4k / 334.9k",
        ),
        within(
            "YCSB 95/5 100%: budget 50% ÷ 100% (Tigon 100 ÷ 200 MB)",
            "budget",
            BUDGET_YCSB,
            ("50%", "100%"),
            0.97,
            "607.9k / 627.0k",
        ),
        within(
            "YCSB 95/5 100%: budget 25% ÷ 100% (Tigon 50 ÷ 200 MB)",
            "budget",
            BUDGET_YCSB,
            ("25%", "100%"),
            0.39,
            "247.5k / 627.0k",
        ),
        within(
            "YCSB 95/5 100%: budget 5% ÷ 100% (Tigon 10 ÷ 200 MB)",
            "budget",
            BUDGET_YCSB,
            ("5%", "100%"),
            0.26,
            "161.7k / 627.0k",
        ),
        within("TPC-C 60/90: shortcut off ÷ on", "shortcut", "TPC-C 60/90", ("off", "on"), 0.78, "259.8k / 334.9k"),
        within("YCSB 95/5 100%: shortcut off ÷ on", "shortcut", BUDGET_YCSB, ("off", "on"), 0.91, "−9%"),
        within("TPC-C 60/90: epoch 1 ms ÷ no log", "epoch", "TPC-C 60/90", ("1 ms", "no log"), 0.85, "302.7k / 357.9k"),
        within(
            "TPC-C 60/90: epoch 10 ms ÷ no log",
            "epoch",
            "TPC-C 60/90",
            ("10 ms", "no log"),
            0.91,
            "325.0k / 357.9k",
        ),
        within(
            "TPC-C 60/90: epoch 20 ms ÷ no log",
            "epoch",
            "TPC-C 60/90",
            ("20 ms", "no log"),
            0.94,
            "334.9k / 357.9k",
        ),
        within(
            "TPC-C 60/90: epoch 50 ms ÷ no log",
            "epoch",
            "TPC-C 60/90",
            ("50 ms", "no log"),
            0.95,
            "341.5k / 357.9k",
        ),
    ]
}

/// Why our figures differ from Tigon's even where both are right, one note per family of rows.
pub const DIFFERENCES: &[&str] = &[
    "Scale: 2 host processes with one worker each on a 2-core machine, priced by a latency model, against Tigon's 8 hosts × 3 workers on emulated CXL hardware. With 2 hosts every cross-partition transaction has exactly one remote owner (Tigon's cross transactions also alternate between home and one other partition), and the baselines' 2PC involves one participant.",
    "OCC+ rows: Tigon's second baseline is Sundial+ (logical leases and cached remote reads: a read whose lease still covers the commit timestamp needs no validation message); ours is Silo-style OCC, which validates every remote read in its prepare round. Where Sundial+ beats Tigon (0/0, 10/15) our OCC+ is not expected to.",
    "0% remote / cross: all three run the same local code here (no tuple is shared), so the ratios are ≈ 1 by construction. Tigon's 0.71 and 0.94 at 0% show costs its implementation has at zero sharing that ours does not model; where they come from is not established here.",
    "Budget rows: ours sweep fractions of the measured unconstrained HWcc footprint; Tigon's runs used 184 of 200 MB, so its 150/100/50/10 MB are about 82/54/27/5% of its footprint. Its index is an OLC B+tree (159 of the 184 MB); ours is a hash table (fewer lines per search), so the CAT working set, not the index, is what a small budget squeezes.",
    "SWcc ÷ NoSWcc: ours batches a phase's migrations into one round trip, as Tigon's executor does (TwoPLPashaTransaction::process_requests), so NoSWcc's ~3.5 migrations per YCSB transaction cost one wait here. What a migration costs beyond that is where the two can part: our CXL index is a hash table (a bucket line and a node per insert or remove at move-in and move-out), Tigon's an OLC B+tree in CXL whose inserts and removes touch many more HWcc lines, and Tigon's move-out also retires nodes through cross-host EBR. That this explains the gap from Tigon's 3.80× is likely, not measured here.",
    "Shortcut rows: the model prices every HWcc line an owner's index traversal reads at the CXL line price; hardware-coherent memory is cacheable, so part of Tigon's traversals hit the owner's cache, which the model does not credit — one likely reason ours loses more without the shortcut.",
    "Epoch rows: our logger is one thread per host writing with fdatasync on this machine's disk, shared by the two host processes; Tigon's loggers wrote to their own devices.",
];
