//! Puts `memory.x` where the linker finds it (cortex-m-rt's `link.x` includes it), and rebuilds when it changes.

use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("memory.x"), include_bytes!("memory.x"))
        .expect("write memory.x to OUT_DIR");
    println!("cargo:rustc-link-search={}", out.display());
    println!("cargo:rerun-if-changed=memory.x");
    println!("cargo:rerun-if-changed=build.rs");
}
