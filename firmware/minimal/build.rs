//! Puts the target's `memory.x` where the runtime's `link.x` finds it, and links with `link.x` (given here, not in
//! `.cargo/config.toml`, so that RUSTFLAGS set for a size variant do not drop it).

use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").expect("cargo sets the target arch");
    let memory: &[u8] = match arch.as_str() {
        "arm" => include_bytes!("memory-arm.x"),
        "riscv32" => include_bytes!("memory-riscv.x"),
        other => panic!("no memory.x for {other}"),
    };
    std::fs::write(out.join("memory.x"), memory).expect("write memory.x to OUT_DIR");
    println!("cargo:rustc-link-search={}", out.display());
    // cortex-m-rt's link.x includes memory.x; riscv-rt's (0.16) wants it given first, as its docs say.
    if arch == "riscv32" {
        println!("cargo:rustc-link-arg=-Tmemory.x");
    }
    println!("cargo:rustc-link-arg=-Tlink.x");
    println!("cargo:rerun-if-changed=memory-arm.x");
    println!("cargo:rerun-if-changed=memory-riscv.x");
    println!("cargo:rerun-if-changed=build.rs");
}
