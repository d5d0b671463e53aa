#!/usr/bin/env python3
"""Where the flash goes (research/038): text and rodata symbols of a firmware/minimal build by crate, and the
largest symbols, from `llvm-nm -S --size-sort --demangle`. Prints JSON lines (kind "crate" and kind "symbol").

usage: symbols.py VARIANT TARGET [TOP]   (after sizes.py built it)
"""
import collections, json, os, re, subprocess, sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SYSROOT = subprocess.check_output(["rustc", "--print", "sysroot"], text=True).strip()
NM = os.path.join(SYSROOT, "lib/rustlib/x86_64-unknown-linux-gnu/bin/llvm-nm")
GROUPS = [("curve25519 (x25519-dalek, curve25519-dalek)", r"curve25519|x25519"),
          ("SHA-256 / HMAC / HKDF", r"sha2::|hmac::|hkdf::|digest::|SHA256"),
          ("AES (aes fixslice)", r"\baes::|BlockCipherEncrypt|cipher::"),
          ("GCM (aes-gcm, ghash, polyval, ctr)", r"aes_gcm|ghash|polyval|\bctr::"),
          ("CRC-32 (crc)", r"\bcrc::"),
          ("pure-link", r"pure_link"),
          ("compiler_builtins (memcpy, u64 division, ...)", r"compiler_builtins|__aeabi|memcpy|memset|memmove|__udivdi3|__umoddi3"),
          ("core::fmt / panics", r"core::fmt|core::panicking|core::result::unwrap_failed|core::option"),
          ("core (other)", r"\bcore::"),
          ("firmware main (sender/outbox inlined)", r"__cortex_m_rt_main|pure_minimal|_ZN12pure_minimal|\bmain\b"),
          ("runtime, vectors", r"cortex_m_rt|riscv_rt|__INTERRUPTS|__RESET_VECTOR|Reset|_start|DefaultHandler|HardFault|__EXCEPTIONS|_setup_interrupts|_start_trap|_default_abort|trap")]


def main():
    variant, target = sys.argv[1], sys.argv[2]
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 25
    elf = os.path.join(ROOT, "firmware/minimal/target", "v-" + variant, target, "release/pure-minimal")
    out = subprocess.check_output([NM, "-S", "--size-sort", "-r", "--demangle", elf], text=True)
    groups = collections.Counter()
    syms = []
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) != 4 or parts[2].lower() not in ("t", "r", "d"):
            continue
        size, kind, name = int(parts[1], 16), parts[2], parts[3]
        g = next((g for g, rx in GROUPS if re.search(rx, name)), "other")
        groups[g] += size
        syms.append((size, kind, name, g))
    for g, n in groups.most_common():
        print(json.dumps({"kind": "crate", "variant": variant, "target": target, "group": g, "bytes": n}))
    for size, kind, name, g in syms[:top]:
        print(json.dumps({"kind": "symbol", "variant": variant, "target": target, "bytes": size,
                          "section": kind, "group": g, "name": re.sub(r"::h[0-9a-f]{16}$", "", name)}))


if __name__ == "__main__":
    main()
