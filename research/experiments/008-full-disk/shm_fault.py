#!/usr/bin/env python3
"""research/008: does opening a WAL store on a full filesystem fault on the mapped -shm, per setup?

Run as root: makes a loop-mounted ext4 image (1 KiB blocks by default), and for each round writes a store whose WAL
keeps frames (the writer is SIGKILLed), fills the filesystem, and opens the store again in a child process under
the setup being measured. Prints one JSON line per round: how the child ended (exit code or signal) and what it said.

Setups:
  baseline   SQLite's defaults (WAL, shared -shm), as the node was before issue 8
  exclusive  the writer sets PRAGMA locking_mode=EXCLUSIVE before its first access (wal-index in heap, no -shm)
  room       opens only when statvfs shows room for the wal-index its WAL needs plus a margin (else: a clear error)
  room+alloc room, and after the open the -shm is allocated whole with posix_fallocate (the node's setup)
"""
import json, os, signal, sqlite3, subprocess, sys, tempfile, time

REGION = 32 * 1024


def sh(*args):
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def fill(root):
    with open(os.path.join(root, "filler"), "ab", buffering=0) as f:
        for chunk in (65536, 4096, 512, 1):
            buf = b"\xa5" * chunk
            while True:
                try:
                    f.write(buf)
                    f.flush()
                except OSError:
                    break


def writer(path, records):
    """Child: writes `records` rows in small transactions, then waits to be killed (so the WAL keeps its frames)."""
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA synchronous=FULL")
    c.execute("PRAGMA wal_autocheckpoint=0")  # keep every frame: the open must index them all
    c.execute("CREATE TABLE IF NOT EXISTS r (k INTEGER PRIMARY KEY, v BLOB)")
    for i in range(records):
        c.execute("INSERT INTO r (v) VALUES (?)", (os.urandom(200),))
    print("written", flush=True)
    time.sleep(3600)


def opener(path, setup):
    """Child: opens the store as the node would, then (the disk filled again) commits; exits 0, or 3 with the error."""
    d = os.path.dirname(path)
    if setup in ("room", "room+alloc"):
        st = os.statvfs(d)
        free = st.f_bavail * st.f_frsize
        wal = os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0
        need = (max(1, -(-((wal - 32) // 536 + 1) // 4096))) * REGION + 256 * 1024
        if free < need:
            print(json.dumps({"error": f"{free} bytes free, {need} wanted"}))
            sys.exit(3)
    try:
        c = sqlite3.connect(path, isolation_level=None)
        if setup == "exclusive":
            c.execute("PRAGMA locking_mode=EXCLUSIVE")
        c.execute("PRAGMA journal_mode=WAL")
        n = c.execute("SELECT count(*) FROM r").fetchone()[0]
        if setup == "room+alloc":
            fd = os.open(path + "-shm", os.O_RDWR)  # kept open: closing it would drop SQLite's locks
            size = max(os.fstat(fd).st_size, 4 * REGION)
            os.posix_fallocate(fd, 0, -(-size // REGION) * REGION)
        # What else the process and the machine write meanwhile (the memo, the senders index, other programs)
        # takes the blocks the open's truncation of the -shm freed; then the commits index their frames.
        # A checkpoint resets the WAL, so the next commits reuse its blocks and succeed on the full disk: their
        # frames are indexed at new hash slots of the wal-index, which is where holes are.
        c.execute("PRAGMA wal_checkpoint(RESTART)")
        fill(d)
        for _ in range(400):
            c.execute("INSERT INTO r (v) VALUES (?)", (os.urandom(1500),))
        print(json.dumps({"rows": n}))
    except (sqlite3.Error, OSError) as e:
        print(json.dumps({"error": str(e)}))
        sys.exit(3)


def reader_while_writer(path, setup):
    """Can another process read while a writer of this setup has the store open?"""
    w = subprocess.Popen([sys.executable, __file__, "hold", path, setup], stdout=subprocess.PIPE, text=True)
    w.stdout.readline()
    try:
        r = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.5)
        r.execute("SELECT count(*) FROM r").fetchone()
        ok, why = True, ""
    except sqlite3.Error as e:
        ok, why = False, str(e)
    w.kill()
    w.wait()
    return ok, why


def hold(path, setup):
    c = sqlite3.connect(path, isolation_level=None)
    if setup == "exclusive":
        c.execute("PRAGMA locking_mode=EXCLUSIVE")
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("INSERT INTO r (v) VALUES (x'01')")  # exclusive mode takes its lock at the first write
    print("holding", flush=True)
    time.sleep(3600)


def main():
    if sys.argv[1] == "writer":
        return writer(sys.argv[2], int(sys.argv[3]))
    if sys.argv[1] == "open":
        return opener(sys.argv[2], sys.argv[3])
    if sys.argv[1] == "hold":
        return hold(sys.argv[2], sys.argv[3])
    setup, rounds = sys.argv[1], int(sys.argv[2])
    block = sys.argv[3] if len(sys.argv) > 3 else "1024"
    # full-at-open: the disk is full when the store is opened (a restart on a full disk); full-after-open: it
    # fills after the open, while the store serves.
    phase = sys.argv[4] if len(sys.argv) > 4 else "full-at-open"
    for rnd in range(rounds):
        mnt = tempfile.mkdtemp()
        img = mnt + ".img"
        with open(img, "wb") as f:
            f.truncate(16 << 20)
        sh("mkfs.ext4", "-q", "-F", "-b", block, img)
        sh("mount", "-o", "loop", img, mnt)
        try:
            path = os.path.join(mnt, "main.sqlite")
            w = subprocess.Popen([sys.executable, __file__, "writer", path, str(200 + 300 * (rnd % 8))],
                                 stdout=subprocess.PIPE, text=True)
            w.stdout.readline()
            w.kill()
            w.wait()
            if rnd == 0:
                ok, why = reader_while_writer(path, setup)
                print(json.dumps({"setup": setup, "reader_while_writer_runs": ok, "why": why}), flush=True)
            if phase == "full-at-open":
                fill(mnt)
            p = subprocess.run([sys.executable, __file__, "open", path, setup], capture_output=True, text=True)
            end = f"signal {-p.returncode} ({signal.Signals(-p.returncode).name})" if p.returncode < 0 \
                else f"exit {p.returncode}"
            print(json.dumps({"setup": setup, "phase": phase, "round": rnd, "block": int(block), "wal_bytes":
                              os.path.getsize(path + "-wal"), "end": end, "said": p.stdout.strip()}), flush=True)
        finally:
            subprocess.run(["umount", "-l", mnt])
            os.remove(img)
            os.rmdir(mnt)


if __name__ == "__main__":
    main()
