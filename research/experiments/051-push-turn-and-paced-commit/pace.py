#!/usr/bin/env python3
"""research/051: what one `fdatasync` costs back to back and at the pushes' pace (5 ms apart), for the same writes:
six WAL-like frames (24 + 4096 bytes each) over a file written whole first, as a reused SQLite -wal is.
Usage: pace.py DIR RUNS; prints one JSON line per run and pace."""
import json, os, statistics, sys, time
d, runs = sys.argv[1], int(sys.argv[2])
frame = b'\7' * 4096
for run in range(1, runs + 1):
    for pause_ms in (0, 5):
        p = os.path.join(d, 'pace.probe')
        fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.pwrite(fd, b'\0' * (4 << 20), 0)
        os.fdatasync(fd)
        took = []
        for i in range(300):
            t = time.perf_counter()
            for j in range(6):
                off = 32 + ((i * 6 + j) % 1000) * 4120
                os.pwrite(fd, frame[:24], off)
                os.pwrite(fd, frame, off + 24)
            os.fdatasync(fd)
            took.append((time.perf_counter() - t) * 1e3)
            if pause_ms:
                time.sleep(pause_ms / 1e3)
        os.close(fd)
        os.unlink(p)
        print(json.dumps({"run": run, "pause_ms": pause_ms, "dir": d, "p50_ms": round(statistics.median(took), 4),
                          "load": float(open('/proc/loadavg').read().split()[0])}), flush=True)
