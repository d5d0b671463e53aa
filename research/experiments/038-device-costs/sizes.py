#!/usr/bin/env python3
"""Builds firmware/minimal/ for each target and size variant and prints one JSON line per build (research/038).

Flash = every allocated section that is loaded from flash (vector table, .text, .rodata, .data's load image,
RISC-V's .init.rust and .eh_frame); RAM = .data + .bss (the stub flash array, 4,096 B, is counted in .bss and
given apart as stub_bytes). Builds run under `nice -n 10`, each variant in a target dir of its own.

usage: sizes.py [VARIANT...]    (default: all)   — from anywhere; writes to stdout.
"""
import json, os, subprocess, sys, re, datetime

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
CRATE = os.path.join(ROOT, "firmware", "minimal")
SYSROOT = subprocess.check_output(["rustc", "--print", "sysroot"], text=True).strip()
TOOLS = os.path.join(SYSROOT, "lib/rustlib/x86_64-unknown-linux-gnu/bin")
STUB_BYTES = 4096

ARM7 = "thumbv7em-none-eabihf"
ARM6 = "thumbv6m-none-eabi"
RV = "riscv32imc-unknown-none-elf"
ALL = [ARM7, ARM6, RV]

SMALL = ["--cfg", "aes_compact", "--cfg", 'sha2_backend_soft="compact"']
# name: (targets, cargo features, opt-level, extra rustflags)
VARIANTS = {
    "base": (ALL, [], "s", []),
    "receive": (ALL, ["receive"], "s", []),
    "opt-z": ([ARM7], [], "z", []),
    "no-frame-pointers": ([ARM7], [], "s", ["-C", "force-frame-pointers=no"]),
    "no-unwind-tables": ([ARM7, RV], [], "s", ["-C", "force-unwind-tables=no"]),
    "aes_compact": ([ARM7], [], "s", ["--cfg", "aes_compact"]),
    "sha2_compact": ([ARM7], [], "s", ["--cfg", 'sha2_backend_soft="compact"']),
    "small": ([ARM7, RV], [], "s", SMALL + ["-C", "force-unwind-tables=no"]),
    "small-z": (ALL, [], "z", SMALL + ["-C", "force-unwind-tables=no"]),
    "receive-small": (ALL, ["receive"], "s", SMALL + ["-C", "force-unwind-tables=no"]),
    "receive-small-z": (ALL, ["receive"], "z", SMALL + ["-C", "force-unwind-tables=no"]),
}

FLASH_SECTIONS = {".vector_table", ".text", ".rodata", ".data", ".init.rust", ".eh_frame", ".trap",
                  ".text.dummy", ".init", ".gnu.sgstubs"}


def sections(elf):
    out = subprocess.check_output([os.path.join(TOOLS, "llvm-size"), "-A", elf], text=True)
    s = {}
    for line in out.splitlines():
        m = re.match(r"^(\.\S+)\s+(\d+)\s+(\d+)", line)
        if m:
            s[m.group(1)] = int(m.group(2))
    return s


def fmt_symbols(elf):
    out = subprocess.check_output([os.path.join(TOOLS, "llvm-nm"), "-S", "--demangle", elf], text=True)
    n, size = 0, 0
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4 and "core::fmt" in parts[3] and parts[2].lower() == "t":
            n += 1
            size += int(parts[1], 16)
    return n, size


def build(name, target):
    targets, features, opt, flags = VARIANTS[name]
    tdir = os.path.join(CRATE, "target", "v-" + name)
    env = dict(os.environ)
    env["CARGO_PROFILE_RELEASE_OPT_LEVEL"] = opt
    env["CARGO_ENCODED_RUSTFLAGS"] = "\x1f".join(flags)
    env.pop("RUSTFLAGS", None)
    cmd = ["nice", "-n", "10", "cargo", "build", "--release", "--target", target, "--target-dir", tdir]
    if features:
        cmd += ["--features", ",".join(features)]
    subprocess.run(cmd, cwd=CRATE, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elf = os.path.join(tdir, target, "release", "pure-minimal")
    s = sections(elf)
    flash = sum(v for k, v in s.items() if k in FLASH_SECTIONS)
    n_fmt, fmt_bytes = fmt_symbols(elf)
    return {
        "when": datetime.datetime.now().isoformat(timespec="seconds"),
        "target": target, "variant": name, "features": features, "opt_level": opt, "rustflags": flags,
        "vector_table": s.get(".vector_table", 0), "text": s.get(".text", 0), "rodata": s.get(".rodata", 0),
        "data": s.get(".data", 0), "bss": s.get(".bss", 0), "eh_frame": s.get(".eh_frame", 0),
        "init_rust": s.get(".init.rust", 0), "flash": flash, "ram_static": s.get(".data", 0) + s.get(".bss", 0),
        "stub_bytes": STUB_BYTES, "core_fmt_text_symbols": n_fmt, "core_fmt_text_bytes": fmt_bytes,
    }


def main():
    names = sys.argv[1:] or list(VARIANTS)
    for name in names:
        for target in VARIANTS[name][0]:
            print(json.dumps(build(name, target)), flush=True)


if __name__ == "__main__":
    main()
