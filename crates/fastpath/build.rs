//! Compiles the fast-path programs under bpf/ with clang (clang ≥ 14 and libbpf-dev: see
//! scripts/setup.sh). The object lands in OUT_DIR and is embedded with `include_bytes_aligned!`.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let source = "bpf/fastpath.bpf.c";
    println!("cargo:rerun-if-changed={source}");
    println!("cargo:rerun-if-changed=bpf/fastpath.h");
    // -mcpu=v3: atomic compare-and-swap and exchange on map values.
    let status = Command::new("clang")
        .args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf", "-mcpu=v3"])
        .args(["-I/usr/include/x86_64-linux-gnu", "-Ibpf", "-c", source, "-o"])
        .arg(out_dir.join("fastpath.bpf.o"))
        .status()
        .expect("clang must be installed to build the eBPF programs (apt-get install clang libbpf-dev)");
    assert!(status.success(), "clang failed to compile {source}");
}
