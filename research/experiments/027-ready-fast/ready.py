#!/usr/bin/env python3
"""research/027: time from start to "ready" of nodes whose 1M-line senders file changed since their last start,
for several builds side by side. Usage: ready.py ROUNDS LABEL=BINARY [LABEL=BINARY ...] [--senders N] [--nice N] [--wait-quiet SHARE [--max-load L]]

One senders file of N random keys (default 1M). Each round appends one line (so every build's index is stale),
reads the file once plainly (the machine's own floor: 1 MiB reads of the cached file, as the node does), then
starts each build in turn — the order rotates every round — each with a state directory of its own, and measures
the wall time from the start to "ready" on its stdout and the node's CPU time until then (all its threads, from
/proc/PID/stat). With a build that logs its phases at debug level (fields `NAME_ms=`), they are kept too.
Prints one JSON line per start, one per plain read, and at the end whether every build's index of the last
file is the same bytes. With --nice -20 (root) the nodes run at the highest priority, so that a machine shared with
other work comes as near a quiet one as it can without stopping that work (the load average is still noted).
With --wait-quiet 0.9 each round waits (up to 30 minutes) until the CPU was 90 % idle over 2 s, and notes it;
--max-load 1 waits for the 1-minute load average to be at most 1 too."""
import base64, json, os, re, shutil, subprocess, sys, tempfile, time

def cpu_idle(seconds):
    """The share of the machine's CPU time that was idle over the next `seconds` (/proc/stat)."""
    def read():
        v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
        return v[3] + v[4], sum(v)
    i0, t0 = read()
    time.sleep(seconds)
    i1, t1 = read()
    return (i1 - i0) / max(1, t1 - t0)

def wait_quiet(share, max_load=None, give_up=1800):
    """Waits until the CPU was at least `share` idle over 2 s (other work on the machine paused) and, with
    `max_load`, the 1-minute load average is at most that, at most `give_up` seconds; returns the idle share seen."""
    start = time.monotonic()
    while True:
        idle = cpu_idle(2)
        load = float(open("/proc/loadavg").read().split()[0])
        if (idle >= share and (max_load is None or load <= max_load)) or time.monotonic() - start > give_up:
            return round(idle, 3)

def main():
    args = sys.argv[1:]
    n = 1_000_000
    if "--senders" in args:
        i = args.index("--senders")
        n = int(args[i + 1])
        del args[i:i + 2]
    max_load = None
    if "--max-load" in args:
        i = args.index("--max-load")
        max_load = float(args[i + 1])
        del args[i:i + 2]
    quiet = None
    if "--wait-quiet" in args:
        i = args.index("--wait-quiet")
        quiet = float(args[i + 1])
        del args[i:i + 2]
    nice = 0
    if "--nice" in args:
        i = args.index("--nice")
        nice = int(args[i + 1])
        del args[i:i + 2]
    rounds = int(args[0])
    builds = [a.split("=", 1) for a in args[1:]]
    d = tempfile.mkdtemp(prefix="ready027-", dir="/tmp")
    senders = os.path.join(d, "senders")
    with open(senders, "w") as f:
        for i in range(n):
            # Random bytes are a valid X25519 public key for the list (low-order points aside: vanishingly rare).
            f.write(f"dev-{i} {base64.b64encode(os.urandom(32)).decode()}\n")
    tick = os.sysconf("SC_CLK_TCK")
    for r in range(1, rounds + 1):
        idle = wait_quiet(quiet, max_load) if quiet is not None else None
        with open(senders, "a") as f:
            f.write(f"extra-{r} {base64.b64encode(os.urandom(32)).decode()}\n")
        t = time.monotonic()
        c = time.process_time()
        with open(senders, "rb", buffering=0) as f:
            while f.read(1 << 20):
                pass
        print(json.dumps({"label": "plain-read", "round": r, "senders": n, "ready_s": time.monotonic() - t,
                          "cpu_s": time.process_time() - c,
                          "load_1m": float(open("/proc/loadavg").read().split()[0])}), flush=True)
        k = (r - 1) % len(builds)
        for label, binary in builds[k:] + builds[:k]:
            state = os.path.join(d, "state-" + label)
            err = os.path.join(d, "err-" + label)
            load = float(open("/proc/loadavg").read().split()[0])
            t = time.monotonic()
            with open(err, "w") as e:
                p = subprocess.Popen([binary, "--senders", senders, "--state", state, "--bind", "127.0.0.1",
                                      "--link-port", "0", "--http-port", "0"], stdout=subprocess.PIPE, stderr=e,
                                     text=True, env={**os.environ, "RUST_LOG": "warn,pure_serve::senders=debug"},
                                     preexec_fn=(lambda: os.nice(nice)) if nice else None)
                for line in p.stdout:
                    if line.strip() == "ready":
                        break
                secs = time.monotonic() - t
                fields = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
                cpu = (int(fields[11]) + int(fields[12])) / tick
                p.terminate()
                p.wait()
            phases = {}
            for line in open(err):
                for k2, v in re.findall(r"(\w+_ms)=([0-9.]+)", line):
                    phases[k2] = round(float(v), 1)
            print(json.dumps({"label": label, "round": r, "senders": n, "ready_s": secs, "cpu_s": cpu,
                              "load_1m": load, "nice": nice, "idle_before": idle, **phases}), flush=True)
    # Every build indexed the same last file: their indexes must be the same bytes.
    idx = {label: open(os.path.join(d, "state-" + label, "senders.idx"), "rb").read() for label, _ in builds}
    same = len(set(idx.values())) == 1
    print(json.dumps({"label": "check", "indexes_identical": same, "index_bytes": len(next(iter(idx.values())))}),
          flush=True)
    shutil.rmtree(d)

main()
