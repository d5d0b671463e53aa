#!/usr/bin/env python3
"""Runs firmware/qemu-m4's `cost` (instructions per operation) and `minimal` (stack peak) under qemu-system-arm
(research/038) and prints JSON lines: one per sample of `cost`, one per run of `minimal`.

cost: `-icount shift=0` (virtual time = 1 ns per guest instruction); the firmware prints timer-2 ticks (25 MHz:
40 ns = 40 instructions each), `instructions` = (ticks - median empty ticks) * 40. RUNS runs, each on a fresh
flash file. minimal: no -icount (stack only), RUNS runs on one flash file (the first formats it).

usage: run_cost.py [RUNS]   (after `cargo build --release --bin cost --bin minimal` in firmware/qemu-m4)
"""
import json, os, statistics, subprocess, sys, tempfile, datetime

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN = os.path.join(ROOT, "firmware/qemu-m4/target/thumbv7em-none-eabihf/release")
NS_PER_TICK = 40
QEMU = ["qemu-system-arm", "-M", "mps2-an386", "-nographic", "-monitor", "none", "-serial", "null"]


def qemu(firmware, flash, icount):
    cmd = list(QEMU)
    if icount:
        cmd += ["-icount", "shift=0"]
    cmd += ["-semihosting-config", f"enable=on,target=native,arg={firmware},arg={flash}",
            "-kernel", os.path.join(BIN, firmware)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    when = datetime.datetime.now().isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(runs):
            rc, out = qemu("cost", os.path.join(tmp, f"cost-{run}.bin"), True)
            samples = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
            empty = statistics.median(s["ticks"] for s in samples if s["op"] == "empty")
            for s in samples:
                s.update(kind="cost", run=run, exit=rc, when=when, setting="qemu-system-arm 7.2 mps2-an386 "
                         "-icount shift=0, opt-level s, fat LTO, thumbv7em-none-eabihf")
                if "ticks" in s:
                    s["instructions"] = (s["ticks"] - empty) * NS_PER_TICK
                print(json.dumps(s))
        flash = os.path.join(tmp, "minimal.bin")
        for run in range(runs):
            rc, out = qemu("minimal", flash, False)
            rec = {"kind": "stack", "run": run, "exit": rc, "when": when,
                   "setting": "qemu-system-arm 7.2 mps2-an386, firmware/qemu-m4 bin minimal, board flash"}
            for line in out.splitlines():
                k, _, v = line.partition(": ")
                rec[k.replace(" ", "_")] = v
            print(json.dumps(rec))


if __name__ == "__main__":
    main()
