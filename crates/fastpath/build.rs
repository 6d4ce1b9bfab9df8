//! Compiles the programs under bpf/ with clang (clang ≥ 14 and libbpf-dev: see scripts/setup.sh):
//! the fast path (fastpath.bpf.c) and workload mirroring (mirror.bpf.c), one object each, so the
//! mirroring programs load only when a configuration asks for them. The objects land in OUT_DIR
//! and are embedded with `include_bytes_aligned!`.

use std::path::PathBuf;
use std::process::Command;

const PROGRAMS: [&str; 2] = ["fastpath", "mirror"];

fn main() {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=bpf/fastpath.h");
    for name in PROGRAMS {
        let source = format!("bpf/{name}.bpf.c");
        println!("cargo:rerun-if-changed={source}");
        // -mcpu=v3: atomic compare-and-swap and exchange on map values.
        let status = Command::new("clang")
            .args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf", "-mcpu=v3"])
            .args(["-I/usr/include/x86_64-linux-gnu", "-Ibpf", "-c", &source, "-o"])
            .arg(out_dir.join(format!("{name}.bpf.o")))
            .status()
            .expect("clang must be installed to build the eBPF programs (apt-get install clang libbpf-dev)");
        assert!(status.success(), "clang failed to compile {source}");
    }
}
