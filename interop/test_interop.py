#!/usr/bin/env python3
"""Interop test: the real pure-serve node against interop/sender.py, a sender written from docs/protocol.md alone.

Run from the repository root after `cargo build --release`:
    python3 -m unittest interop/test_interop.py -v
PURE_SERVE_BIN overrides the binary (default target/release/pure-serve).
"""

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import sender as S  # noqa: E402

BIN = os.environ.get("PURE_SERVE_BIN", os.path.join(ROOT, "target", "release", "pure-serve"))
SENDER = os.path.join(HERE, "sender.py")
QUIET = 0.4  # how long "no answer" waits


class Node:
    """A real pure-serve node process."""

    def __init__(self, workdir, senders, extra=()):
        self.dir = workdir
        self.state = os.path.join(workdir, "state")
        self.senders = senders
        self.extra = list(extra)
        self.port = 0
        self.proc = None
        self.starts = 0

    def start(self):
        self.starts += 1
        out = os.path.join(self.dir, "node-%d.out" % self.starts)
        err = os.path.join(self.dir, "node-%d.err" % self.starts)
        with open(out, "wb") as o, open(err, "wb") as e:
            self.proc = subprocess.Popen(
                [BIN, "--state", self.state, "--senders", self.senders, "--bind", "127.0.0.1",
                 "--link-port", str(self.port), "--http-port", "0"] + self.extra,
                stdout=o, stderr=e, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        lines = []
        while time.monotonic() < deadline:
            with open(out) as f:
                lines = f.read().splitlines()
            if "ready" in lines:
                break
            if self.proc.poll() is not None:
                raise RuntimeError("node exited %s: %s %s" % (self.proc.returncode, lines, open(err).read()))
            time.sleep(0.02)
        else:
            raise RuntimeError("node not ready: %s" % lines)
        for line in lines:
            if line.startswith("public key:"):
                self.pubkey = line.split(":", 1)[1].strip()
            elif line.startswith("link:"):
                proto, addr = line.split(":", 1)[1].split()
                assert proto == "udp", line
                host, _, port = addr.rpartition(":")
                self.addr = (host, int(port))
                self.port = int(port)
            elif line.startswith("metrics:"):
                self.metrics_url = line.split()[1]
        self.pub_raw = S.b64key(self.pubkey)
        self.to = "%s:%d" % self.addr
        return self

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def records(self, source=None):
        cmd = [BIN, "records", "--json", "--state", self.state]
        if source:
            cmd += ["--source", source]
        out = subprocess.run(cmd, check=True, capture_output=True, timeout=30).stdout.decode()
        recs = []
        for line in out.splitlines():
            r = json.loads(line)
            if "payload_b64" in r:
                r["raw"] = base64.b64decode(r["payload_b64"])
            else:
                r["raw"] = r["payload"].encode("utf-8")
            recs.append(r)
        return recs

    def metric(self, name):
        """A counter from /metrics (not part of the wire contract; None if the node has no such line)."""
        try:
            text = urllib.request.urlopen(self.metrics_url, timeout=5).read().decode()
        except Exception:
            return None
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return None


def new_key(workdir, name):
    """A key pair made by Python, written the WireGuard way (base64 of 32 raw bytes, one line)."""
    priv = S.X25519PrivateKey.generate()
    path = os.path.join(workdir, name + ".key")
    with open(path, "w") as f:
        f.write(S.b64(S.raw_private(priv)) + "\n")
    return path, S.b64(S.raw_public(priv))


def run_sender(node, key, lines, *args, timeout=30):
    p = subprocess.run([sys.executable, SENDER, "--key", key, "--node", node.pubkey, "--to", node.to] + list(args),
                       input=b"".join(l + b"\n" for l in lines), capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


class Probe:
    """A raw client for one run, to look at single packets."""

    def __init__(self, node, key_path):
        self.run = S.Run(S.load_private_key(key_path), node.pub_raw)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.connect(node.addr)

    def close(self):
        self.sock.close()

    def packet(self, frames, **kw):
        return self.run.seal(frames, **kw)[1]

    def ask(self, dgram, wait=2.0):
        """Sends one datagram; returns (raw reply, opened reply) or None if nothing comes back in `wait`."""
        self.sock.settimeout(wait)
        self.sock.send(dgram)
        try:
            raw = self.sock.recv(4096)
        except (socket.timeout, ConnectionRefusedError):
            return None
        return raw, self.run.open(raw)

    def heard(self, app=b"main"):
        r = self.ask(self.packet(S.probe_frame(app)))
        assert r is not None and r[1] is not None, "no answer to a probe"
        acks = [f[2] for f in r[1][2] if f[0] == "ack" and f[1] == app]
        assert len(acks) == 1, r[1]
        return acks[0]


def expect(testcase, node, source, payloads, first=1):
    recs = node.records(source)
    seqs = [r["seq"] for r in recs]
    testcase.assertEqual(len(seqs), len(set(seqs)), "a sequence stored twice for %s" % source)
    testcase.assertEqual(sorted(seqs), list(range(first, first + len(payloads))), source)
    by_seq = {r["seq"]: r["raw"] for r in recs}
    for i, p in enumerate(payloads):
        testcase.assertEqual(by_seq[first + i], p, "payload of %s seq %d" % (source, first + i))
    for r in recs:
        testcase.assertEqual(r["app"], "main")


class SenderRules(unittest.TestCase):
    """The sender's rules of §7 against node packets made here (no node process): stale and replayed ACKs,
    renumbering, RTT samples, numbering on enqueue."""

    EPOCH = bytes(7) + b"\x01"

    def setUp(self):
        self.node_priv = S.X25519PrivateKey.generate()
        self.run = S.Run(S.X25519PrivateKey.generate(), S.raw_public(self.node_priv))
        self.node_pn = 0
        self.now = 100.0

    def node_packet(self, echo, *acks, epoch=None):
        """A node packet for this run (§4.2): ECHO first, then ACK frames (app, stored_through)."""
        epoch = epoch or self.EPOCH
        frames = bytes((S.F_ECHO,)) + S.varint(echo)
        for app, st in acks:
            frames += bytes((S.F_ACK, len(app))) + app + S.varint(st)
        pn = self.node_pn
        self.node_pn += 1
        header = bytes((S.TYPE_N2S,)) + epoch + pn.to_bytes(8, "big")
        return header + self.run.k_n2s(epoch).encrypt(bytes(4) + pn.to_bytes(8, "big"), frames, header)

    def deliver(self, d, packet):
        self.now += 0.001
        self.assertTrue(d.receive(packet, self.now))

    def sent_pns(self, d, n=64):
        before = self.run.next_pn
        d.packets(self.now, limit=n)
        return list(range(before, self.run.next_pn))

    def acked_through_40_then_41_to_45_lost(self):
        """A flow started at 1 with 45 records: acked through 40, then 41-45's first copy lost (not delivered)."""
        d = S.Delivery(self.run, "main", [b"r%d" % i for i in range(1, 46)], start=1)
        first = self.sent_pns(d)
        self.deliver(d, self.node_packet(first[-1], (b"main", 20)))
        old20 = self.node_packet(first[-1], (b"main", 20))  # a copy of that answer, to come back late
        self.deliver(d, self.node_packet(first[-1], (b"main", 40)))
        self.assertEqual((d.acked, [r[0] for r in d.records]), (40, [41, 42, 43, 44, 45]))
        self.now = d.deadline  # the RTO resends 41-45, in a packet that is lost
        d.tick(self.now)
        lost = self.sent_pns(d)
        self.assertEqual(d.base_pn, lost[0])
        return d, old20, lost

    def test_a_late_or_replayed_old_ack_does_not_renumber(self):
        d, old20, lost = self.acked_through_40_then_41_to_45_lost()
        for _ in range(3):
            self.deliver(d, old20)
        self.assertEqual(d.renumbered, 0)
        self.assertEqual((d.acked, [r[0] for r in d.records]), (40, [41, 42, 43, 44, 45]))
        self.deliver(d, self.node_packet(lost[-1], (b"main", 45)))
        self.assertTrue(d.done)
        self.assertFalse(d.counter_behind)

    def test_a_node_that_went_back_is_believed_and_older_acks_are_then_ignored(self):
        d, old20, lost = self.acked_through_40_then_41_to_45_lost()
        old40 = self.node_packet(lost[0] - 1, (b"main", 40))
        # The node lost its store: its answer to the packet that carried 41 says 0.
        self.deliver(d, self.node_packet(lost[-1], (b"main", 0), epoch=bytes(7) + b"\x02"))
        self.assertEqual(d.renumbered, 1)
        self.assertEqual((d.acked, [r[0] for r in d.records]), (0, [1, 2, 3, 4, 5]))
        self.assertEqual([r[1] for r in d.records], [b"r41", b"r42", b"r43", b"r44", b"r45"])
        # Answers from before it went back are ignored: they speak of records it no longer has.
        self.deliver(d, old40)
        self.deliver(d, old20)
        self.assertEqual((d.acked, len(d.records), d.counter_behind), (0, 5, False))
        again = self.sent_pns(d)
        self.deliver(d, self.node_packet(again[-1], (b"main", 5), epoch=bytes(7) + b"\x02"))
        self.assertTrue(d.done)

    def test_replayed_node_packets_give_no_rtt_samples(self):
        d = S.Delivery(self.run, "main", [b"x"] * 10, start=1)
        pns = self.sent_pns(d)
        answer = self.node_packet(pns[-1], (b"main", 5))
        self.deliver(d, answer)
        srtt = d.srtt
        self.assertIsNotNone(srtt)
        for _ in range(5):
            self.now += 1.0
            self.deliver(d, answer)
        self.assertEqual(d.srtt, srtt)
        # nor does an older ECHO, such as a node's answer to a replay of our old packet after a sweep
        self.now += 1.0
        self.deliver(d, self.node_packet(pns[0], (b"main", 5)))
        self.assertEqual(d.srtt, srtt)

    def test_progress_restores_the_undoubled_rto_before_the_next_sample(self):
        d = S.Delivery(self.run, "main", [b"x"] * 10, start=1)
        pns = self.sent_pns(d)
        self.deliver(d, self.node_packet(pns[-1], (b"main", 2)))
        base = d.rto
        for _ in range(2):  # two RTOs pass: the RTO doubles twice (§7.5)
            self.now = d.deadline
            d.tick(self.now)
            self.sent_pns(d)
        self.assertAlmostEqual(d.rto, min(base * 4, S.RTO_MAX))
        # Records released by an answer that gives no sample (its ECHO is not larger than one seen before).
        self.deliver(d, self.node_packet(pns[-1], (b"main", 5)))
        self.assertEqual(d.acked, 5)
        self.assertAlmostEqual(d.rto, base)
        self.assertAlmostEqual(d.deadline, self.now + base)

    def test_records_are_numbered_when_queued_not_when_first_sent(self):
        d = S.Delivery(self.run, "main", [b"p%d" % i for i in range(10)], window=2)
        probe = self.sent_pns(d)
        self.assertEqual(len(probe), 1)
        self.deliver(d, self.node_packet(probe[0], (b"main", 7)))
        self.assertEqual([r[0] for r in d.records], list(range(8, 18)))  # all ten, though two may be in flight
        self.sent_pns(d)
        self.assertEqual(d.cursor, 2)


class Delivery(unittest.TestCase):
    """One node; senders in both flow-start modes; tampering and strangers; protocol details."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="interop-")
        cls.keys = {}
        lines = ["# interop test"]
        # one key made by the real binary, the others by Python
        kpath = os.path.join(cls.tmp, "made-by-node.key")
        pub = subprocess.run([BIN, "keygen", "--out", kpath], check=True, capture_output=True).stdout.decode().split()[-1]
        cls.keys["made-by-node"] = kpath
        lines.append("made-by-node " + pub)
        for name in ("known", "raw", "behind"):
            path, pub = new_key(cls.tmp, name)
            cls.keys[name] = path
            lines.append("%s %s" % (name, pub))
        cls.stranger, _ = new_key(cls.tmp, "stranger")  # not in the senders file
        cls.senders = os.path.join(cls.tmp, "senders")
        with open(cls.senders, "w") as f:
            f.write("\n".join(lines) + "\n")
        cls.node = Node(cls.tmp, cls.senders).start()

    @classmethod
    def tearDownClass(cls):
        cls.node.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    # ---- flow starts

    def test_probe_start(self):
        first = [b"hello", b"", "gr\u00fc\u00dfe".encode(), b"x" * 1400, b"\xff\xfe not utf-8"]
        rc, out, err = run_sender(self.node, self.keys["made-by-node"], first)
        self.assertEqual(rc, 0, err)
        self.assertIn("stored 5 records", out)
        more = [b"line %d" % i for i in range(3000)]
        rc, out, err = run_sender(self.node, self.keys["made-by-node"], more)  # a new run: probes, continues at 6
        self.assertEqual(rc, 0, err)
        self.assertIn("numbering from 6", err)
        expect(self, self.node, "made-by-node", first + more)

    def test_known_start(self):
        a = [b"a%d" % i for i in range(100)]
        b = [b"b%d" % i for i in range(2000)]
        rc, _, err = run_sender(self.node, self.keys["known"], a, "--start", "1")
        self.assertEqual(rc, 0, err)
        rc, _, err = run_sender(self.node, self.keys["known"], b, "--start", "101")
        self.assertEqual(rc, 0, err)
        self.assertNotIn("probe", err)
        expect(self, self.node, "known", a + b)
        # a start beyond heard + 1 is a gap no one can fill: the node's answer to that packet proves (by its
        # ECHO) that it is behind, and the sender renumbers after the node's heard sequence (§7.3)
        rc, out, err = run_sender(self.node, self.keys["known"], [b"too far"], "--start", "5000", "--timeout", "5")
        self.assertEqual(rc, 0, err)
        self.assertIn("renumbering", err)
        self.assertIn("stored 1 records for app main (seq 2101-2101)", out)
        expect(self, self.node, "known", a + b + [b"too far"])

    def test_known_start_first_packet_carries_data(self):
        run = S.Run(S.load_private_key(self.keys["raw"]), self.node.pub_raw)
        d = S.Delivery(run, "main", [b"x"], start=1)
        pkts = d.packets(time.monotonic())
        self.assertEqual(len(pkts), 1)
        # open our own packet as the node would (§4.1) and look at the frame
        h = pkts[0][:21]
        pt = run.k_s2n.decrypt(bytes(4) + h[13:21], pkts[0][21:], h)
        self.assertEqual(pt[:8], b"\x01\x04main\x01\x01")

    def test_counter_behind_is_reported(self):
        rc, _, err = run_sender(self.node, self.keys["behind"], [b"one", b"two", b"three"], "--start", "1")
        self.assertEqual(rc, 0, err)
        rc, _, err = run_sender(self.node, self.keys["behind"], [b"ONE"], "--start", "1")
        self.assertEqual(rc, 4, err)  # the node dropped it as a duplicate of seq 1: not stored
        expect(self, self.node, "behind", [b"one", b"two", b"three"])

    # ---- strangers and tampering

    def test_tampered_packet_gets_no_answer(self):
        p = Probe(self.node, self.keys["raw"])
        try:
            self.assertIsNotNone(p.ask(p.packet(S.probe_frame(b"main"))))  # control
            auth0 = self.node.metric('pure_drops_total{stage="auth"}')
            for where in (10, 16, 30, -1):  # run id, packet number, ciphertext, tag
                d = bytearray(p.packet(S.probe_frame(b"main")))
                d[where] ^= 0x01
                self.assertIsNone(p.ask(bytes(d), wait=QUIET), "answer to a packet tampered at %d" % where)
            # tampered data stores nothing
            h = p.heard()
            d = bytearray(p.packet(S.data_frame(b"main", h + 1, [b"evil"])))
            d[25] ^= 0x40
            self.assertIsNone(p.ask(bytes(d), wait=QUIET))
            self.assertEqual(p.heard(), h)
            if auth0 is not None:
                self.assertEqual(self.node.metric('pure_drops_total{stage="auth"}') - auth0, 5)
        finally:
            p.close()

    def test_unknown_sender_gets_no_answer(self):
        p = Probe(self.node, self.stranger)
        try:
            self.assertIsNone(p.ask(p.packet(S.probe_frame(b"main")), wait=QUIET))
            self.assertIsNone(p.ask(p.packet(S.data_frame(b"main", 1, [b"intruder"])), wait=QUIET))
        finally:
            p.close()
        rc, _, err = run_sender(self.node, self.stranger, [b"intruder"], "--timeout", "1")
        self.assertEqual(rc, 1, err)
        self.assertIn("gave up", err)
        for r in self.node.records():
            self.assertNotEqual(r["raw"], b"intruder")

    # ---- details of the wire format, checked against the real node

    def test_wire_details(self):
        p = Probe(self.node, self.keys["raw"])
        try:
            # §4.2 / §5.3: 0x12, ECHO first naming our packet number, reply no larger than the request
            d = p.packet(S.probe_frame(b"main"))
            raw, opened = p.ask(d)
            self.assertEqual(raw[0], 0x12)
            self.assertLessEqual(len(raw), len(d))
            self.assertEqual(opened[2][0], ("echo", p.run.next_pn - 1))
            # §6, step 2: a replayed packet is dropped
            self.assertIsNone(p.ask(d, wait=QUIET))
            # §4 sizes: 95 bytes dropped, 96 and 1472 answered, 1473 dropped
            self.assertIsNone(p.ask(p.packet(S.probe_frame(b"main"), min_size=95), wait=QUIET))
            self.assertIsNotNone(p.ask(p.packet(S.probe_frame(b"main"), min_size=96)))
            self.assertIsNotNone(p.ask(p.packet(S.probe_frame(b"main"), min_size=1472)))
            self.assertIsNone(p.ask(p.packet(S.probe_frame(b"main"), min_size=1473), wait=QUIET))
            # §4.3: another version is dropped
            d = bytearray(p.packet(S.probe_frame(b"main")))
            d[0] = 0x21
            self.assertIsNone(p.ask(bytes(d), wait=QUIET))
            # §5: REFUSE reason 1 for an app the node does not host
            _, opened = p.ask(p.packet(S.probe_frame(b"nosuch")))
            self.assertIn(("refuse", b"nosuch", 1), opened[2])
            # §5.4: a sender the app does not let forward (this node has no apps file: it lets nobody) gets REFUSE
            # reason 3 for a FORWARD frame and nothing of it is stored, while its DATA frame beside it is; a
            # FORWARD probe gets the refusal and no ACK
            h = p.heard()
            frames = (S.forward_frame(b"main", h + 1, [(b"someone-else", 7, b"forged")])
                      + S.data_frame(b"main", h + 1, [b"own"]))
            _, opened = p.ask(p.packet(frames))
            # §5.3, one answer per packet: the REFUSE travels with the ACK, after the commit, in one node packet
            self.assertIn(("ack", b"main", h + 1), opened[2])
            self.assertIn(("refuse", b"main", 3), opened[2])
            p.sock.settimeout(QUIET)
            with self.assertRaises(socket.timeout, msg="a second answer to one packet"):
                p.sock.recv(4096)
            # the same for an app the node does not host beside main: ECHO, ACK and REFUSE reason 1 together
            h2 = p.heard()
            frames = S.data_frame(b"nosuch", 1, [b"lost"]) + S.data_frame(b"main", h2 + 1, [b"kept"])
            raw, opened = p.ask(p.packet(frames))
            self.assertEqual(opened[2][0], ("echo", p.run.next_pn - 1))
            self.assertIn(("ack", b"main", h2 + 1), opened[2])
            self.assertIn(("refuse", b"nosuch", 1), opened[2])
            with self.assertRaises(socket.timeout, msg="a second answer to one packet"):
                p.sock.recv(4096)
            _, opened = p.ask(p.packet(S.forward_frame(b"main", 0, [])))
            self.assertIn(("refuse", b"main", 3), opened[2])
            self.assertEqual([f for f in opened[2] if f[0] == "ack"], [])
            recs = {r["seq"]: r for r in self.node.records("raw")}
            self.assertEqual(recs[h + 1]["raw"], b"own")
            self.assertNotIn("origin", recs[h + 1])
            self.assertFalse([r for r in self.node.records() if r["raw"] == b"forged"])
            # §5: a malformed packet applies nothing, even its valid DATA frame
            h = p.heard()
            for bad in (b"\x7f", b"\x02\x04main\x00", b"\x01\x04main" + b"\x80" * 11):
                frames = S.data_frame(b"main", h + 1, [b"must not be stored"]) + bad
                self.assertIsNone(p.ask(p.packet(frames), wait=QUIET), bad)
            self.assertEqual(p.heard(), h)
            # §5.2: frames of one packet are sorted by first_seq; same flow twice is answered with one ACK
            frames = S.data_frame(b"main", h + 3, [b"r3"]) + S.data_frame(b"main", h + 1, [b"r1", b"r2"])
            _, opened = p.ask(p.packet(frames))
            self.assertEqual([f for f in opened[2] if f[0] == "ack"], [("ack", b"main", h + 3)])
            # §5.2: a gap stores nothing and the ACK stays
            _, opened = p.ask(p.packet(S.data_frame(b"main", h + 10, [b"gap"])))
            self.assertIn(("ack", b"main", h + 3), opened[2])
            recs = {r["seq"]: r["raw"] for r in self.node.records("raw")}
            self.assertEqual([recs.get(h + i) for i in (1, 2, 3)], [b"r1", b"r2", b"r3"])
            self.assertNotIn(h + 10, recs)
            # §3: node packet numbers never repeat within an epoch, across runs
            q = Probe(self.node, self.keys["raw"])
            pns = []
            for c in (p, q, p, q):
                raw, _ = c.ask(c.packet(S.probe_frame(b"main")))
                pns.append(int.from_bytes(raw[9:17], "big"))
            q.close()
            self.assertEqual(pns, sorted(set(pns)))
        finally:
            p.close()


class Restart(unittest.TestCase):
    """SIGKILL the node mid-delivery and restart it on the same port: every record stored exactly once."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="interop-restart-")
        self.keys = {}
        lines = []
        for name in ("restart-probe", "restart-known"):
            path, pub = new_key(self.tmp, name)
            self.keys[name] = path
            lines.append("%s %s" % (name, pub))
        self.senders = os.path.join(self.tmp, "senders")
        with open(self.senders, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.node = Node(self.tmp, self.senders).start()

    def tearDown(self):
        self.node.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def deliver_across_restart(self, name, extra, n=20000, kill_at=4000):
        payloads = [b"%s %06d" % (name.encode(), i) for i in range(n)]
        proc = subprocess.Popen([sys.executable, SENDER, "--key", self.keys[name], "--node", self.node.pubkey,
                                 "--to", self.node.to, "--progress", "--window", "64", "--timeout", "20"] + extra,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        err_lines = []
        reached = threading.Event()

        def read_err():
            for line in proc.stderr:
                line = line.decode().rstrip("\n")
                err_lines.append(line)
                if line.startswith("acked ") and int(line.split()[1]) >= kill_at:
                    reached.set()

        t = threading.Thread(target=read_err, daemon=True)
        t.start()
        feeder = threading.Thread(target=lambda: (proc.stdin.write(b"".join(p + b"\n" for p in payloads)),
                                                  proc.stdin.close()), daemon=True)
        feeder.start()
        self.assertTrue(reached.wait(20), err_lines[-5:])
        old_pub = self.node.pubkey
        self.node.kill()
        self.assertIsNone(proc.poll(), "the sender finished before the node was killed: nothing tested")
        time.sleep(0.3)  # the sender keeps retransmitting into a closed port
        self.node.start()  # same state dir, same port
        self.assertEqual(self.node.pubkey, old_pub)
        out = proc.stdout.read().decode()
        rc = proc.wait(40)
        t.join(5)
        proc.stdout.close()
        proc.stderr.close()
        self.assertEqual(rc, 0, "\n".join(err_lines[-10:]))
        self.assertIn("stored %d records" % n, out)
        self.assertTrue(any("epoch changed" in l for l in err_lines), err_lines[-5:])
        return payloads

    def test_restart_both_flow_starts(self):
        payloads = self.deliver_across_restart("restart-probe", [])
        expect(self, self.node, "restart-probe", payloads)
        payloads = self.deliver_across_restart("restart-known", ["--start", "1"])
        expect(self, self.node, "restart-known", payloads)


class Load(unittest.TestCase):
    """Many senders over one UDP socket (replies matched by trial decryption), then a session sweep."""

    def test_load_one_socket_and_sweep(self):
        tmp = tempfile.mkdtemp(prefix="interop-load-")
        try:
            senders = os.path.join(tmp, "senders")
            keys = os.path.join(tmp, "keys")
            n, m = 300, 7
            subprocess.run([sys.executable, SENDER, "--load", str(n), "--records", str(m), "--senders-out", senders,
                            "--keys-out", keys], check=True, capture_output=True, timeout=30)
            node = Node(tmp, senders, ["--link-idle-ms", "300"]).start()
            try:
                p = subprocess.run([sys.executable, SENDER, "--load", str(n), "--records", str(m), "--keys-in", keys,
                                    "--node", node.pubkey, "--to", node.to, "--sockets", "1", "--timeout", "20"],
                                   capture_output=True, timeout=60)
                self.assertEqual(p.returncode, 0, p.stderr.decode())
                summary = json.loads(p.stdout.decode().splitlines()[-1])
                self.assertEqual(summary["records_stored"], n * m)
                recs = node.records()
                self.assertEqual(len(recs), n * m)
                seen = {}
                for r in recs:
                    self.assertEqual(r["raw"], S.load_payload(r["source"], r["seq"]))
                    seen.setdefault(r["source"], []).append(r["seq"])
                self.assertEqual(len(seen), n)
                for src, seqs in seen.items():
                    self.assertEqual(sorted(seqs), list(range(1, m + 1)), src)

                # §6 sweep: after --link-idle-ms the session is gone; the same run is found again (step 3),
                # a replay of an already-seen packet is then answered (§9) but stores nothing, and the node's
                # packet numbers keep growing (§3).
                with open(keys) as f:
                    name, k = f.readline().split()
                kpath = os.path.join(tmp, "one.key")
                with open(kpath, "w") as f:
                    f.write(k + "\n")
                pr = Probe(node, kpath)
                try:
                    d = pr.packet(S.data_frame(b"main", m + 1, [b"after"]))
                    raw1, o1 = pr.ask(d)
                    self.assertIn(("ack", b"main", m + 1), o1[2])
                    self.assertIsNone(pr.ask(d, wait=QUIET))  # same session: replay window
                    time.sleep(1.2)
                    r = pr.ask(d)  # session swept: the replay makes a new session
                    self.assertIsNotNone(r, "no answer to a replay after the sweep")
                    raw2, o2 = r
                    self.assertIn(("ack", b"main", m + 1), o2[2])
                    self.assertGreater(int.from_bytes(raw2[9:17], "big"), int.from_bytes(raw1[9:17], "big"))
                finally:
                    pr.close()
                self.assertEqual(len([r for r in node.records(name)]), m + 1)
            finally:
                node.stop()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class Cookies(unittest.TestCase):
    """§4.4 and §6.1: a node under a flood of forged first packets answers first packets with COOKIEs; a sender that
    echoes its cookie is stored, the flood gets only COOKIEs (never larger than what it sent), and the X25519s spent
    on the flood stay within the budget."""

    def test_a_sender_gets_in_with_a_cookie_during_a_flood(self):
        tmp = tempfile.mkdtemp(prefix="interop-cookie-")
        stop = threading.Event()
        socks = []
        try:
            dev, dev_pub = new_key(tmp, "dev")
            # Listed senders that never send, whose key ids the flood forges (each costs an X25519 until the node
            # has its secret in the memo, so there are many).
            victims = [os.urandom(32) for _ in range(200)]
            senders = os.path.join(tmp, "senders")
            with open(senders, "w") as f:
                f.write("dev %s\n" % dev_pub)
                for i, k in enumerate(victims):
                    f.write("victim%d %s\n" % (i, S.b64(k)))
            # A budget of 1 X25519/s: 60 flooding /24s, each with an eighth of it, keep it drained.
            node = Node(tmp, senders, ["--x25519-budget", "1"]).start()
            try:
                for x in range(2, 62):
                    sk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    sk.bind(("127.0.%d.1" % x, 0))
                    sk.setblocking(False)
                    socks.append(sk)
                sizes = []

                def flood():
                    n = 0
                    while not stop.is_set():
                        k = victims[n % len(victims)]
                        size = 96 + n % 300
                        sizes.append(size)
                        header = bytes((S.TYPE_S2N,)) + k[:4] + os.urandom(8) + bytes(8)
                        try:
                            socks[n % len(socks)].sendto(header + os.urandom(size - len(header)), node.addr)
                        except OSError:
                            pass
                        n += 1
                        time.sleep(0.001)

                t = threading.Thread(target=flood, daemon=True)
                t.start()
                time.sleep(0.5)  # the budget is drained from here on
                payloads = [b"under load %d" % i for i in range(50)]
                code, out, err = run_sender(node, dev, payloads, "--start", "1", "--timeout", "20")
                self.assertEqual(code, 0, err)
                self.assertIn("asked for a cookie", err)
                stop.set()
                t.join(5)
                expect(self, node, "dev", payloads)
                answers = []
                for sk in socks:
                    while True:
                        try:
                            answers.append(sk.recv(4096))
                        except (BlockingIOError, InterruptedError):
                            break
                self.assertTrue(answers, "the flood got COOKIEs")
                for a in answers:
                    self.assertEqual(a[0], S.TYPE_COOKIE)
                    self.assertEqual(len(a), S.COOKIE_PACKET)
                    self.assertLessEqual(len(a), min(sizes))
                self.assertGreaterEqual(node.metric("pure_cookies_sent_total"), len(answers) + 1)
                wasted = node.metric("pure_x25519_total") - node.metric("pure_x25519_authentic_total")
                self.assertEqual(node.metric("pure_x25519_authentic_total"), 1)
                self.assertLess(wasted, len(victims), "the flood did not get an X25519 per forged key")
            finally:
                node.stop()
        finally:
            stop.set()
            for sk in socks:
                sk.close()
            shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- downlink (§12, version 1.1)

def read_text(path):
    with open(path) as f:
        return f.read()


def push(node, name, lines, app="main"):
    """Queues records with the node's own command while it runs (docs/downlink.md, "Queueing records")."""
    p = subprocess.run([BIN, "push", "--app", app, "--to", name, "--state", node.state],
                       input=b"".join(l + b"\n" for l in lines), capture_output=True, timeout=30)
    return p.returncode, p.stdout.decode() + p.stderr.decode()


def listen(node, key, *args, lines=(), timeout=30):
    """Runs sender.py --listen; returns (exit code, the records printed, stderr)."""
    p = subprocess.run([sys.executable, SENDER, "--key", key, "--node", node.pubkey, "--to", node.to] + list(args),
                       input=b"".join(l + b"\n" for l in lines), capture_output=True, timeout=timeout)
    out = p.stdout.split(b"\n")
    assert out[-1] == b"", p.stdout[-100:]
    return p.returncode, out[:-1], p.stderr.decode()


class ListenRules(unittest.TestCase):
    """The sender's rules of §12.4 and §12.6 against node packets made here (no node process)."""

    EPOCH = bytes(7) + b"\x01"

    def setUp(self):
        self.node_priv = S.X25519PrivateKey.generate()
        self.run = S.Run(S.X25519PrivateKey.generate(), S.raw_public(self.node_priv))
        self.node_pn = 0
        self.now = 100.0
        self.got = []
        self.lst = S.Listen(self.run, "main", 5, on_record=lambda seq, p: self.got.append((seq, p)))

    def down(self, echo, last, after, first, recs, app=b"main"):
        frames = bytes((S.F_ECHO,)) + S.varint(echo)
        frames += bytes((S.F_DOWN, len(app))) + app + S.varint(last) + S.varint(after) + S.varint(first)
        frames += S.varint(len(recs)) + b"".join(S.varint(len(r)) + r for r in recs)
        pn = self.node_pn
        self.node_pn += 1
        header = bytes((S.TYPE_N2S,)) + self.EPOCH + pn.to_bytes(8, "big")
        return header + self.run.k_n2s(self.EPOCH).encrypt(bytes(4) + pn.to_bytes(8, "big"), frames, header)

    def take(self, dgram):
        self.now += 0.001
        opened = self.run.open(dgram)
        self.assertIsNotNone(opened)
        self.lst.handle(opened, self.now)

    def test_first_listen_is_padded_alone_and_says_heard(self):
        [dgram] = self.lst.packets(self.now)
        self.assertEqual(len(dgram), S.DEFAULT_DATAGRAM)
        self.assertEqual(self.lst.packets(self.now), [])  # outstanding: nothing until its RTO
        self.assertEqual((self.lst.outstanding, self.lst.sent_heard), (0, 5))

    def test_handed_over_only_after_le_heard_and_above_heard(self):
        self.lst.packets(self.now)
        self.take(self.down(0, 9, 7, 8, [b"r8", b"r9"]))  # after 7 > heard 5: 6-7 were in a lost frame
        self.assertEqual(self.got, [])
        self.assertTrue(self.lst.confirmed)
        self.take(self.down(0, 9, 3, 4, [b"r4", b"r5", b"r6", b"r7"]))  # 4, 5 are duplicates
        self.assertEqual(self.got, [(6, b"r6"), (7, b"r7")])
        self.take(self.down(0, 9, 7, 8, [b"r8", b"r9"]))
        self.assertEqual([s for s, _ in self.got], [6, 7, 8, 9])
        self.assertEqual(self.lst.heard, 9)
        [ack] = self.lst.packets(self.now)  # heard grew: acknowledged at once
        self.assertEqual(self.lst.sent_heard, 9)
        self.take(self.down(1, 0, 9, 0, []))
        self.assertTrue(self.lst.done)
        self.take(self.down(1, 9, 3, 4, [b"r4", b"r5", b"r6", b"r7"]))  # a late copy hands nothing over
        self.assertEqual(len(self.got), 4)

    def test_an_answer_without_room_holds_one_rto(self):
        self.lst.packets(self.now)
        self.take(self.down(0, 8, 5, 0, []))  # records wait, no room for them
        self.assertEqual(self.lst.holds, 1)
        self.assertEqual(self.lst.packets(self.now), [])
        self.now = self.lst.hold_until
        self.assertEqual(len(self.lst.packets(self.now)), 1)

    def test_unanswered_listen_after_three_resends(self):
        self.lst.packets(self.now)
        for _ in range(3):
            self.lst.tick(self.now)
            self.assertFalse(self.lst.unanswered)
            self.now = self.lst.deadline
            self.assertEqual(len(self.lst.packets(self.now)), 1)  # an RTO resend, doubling
        self.assertEqual(self.lst.unanswered_resends, 3)
        self.lst.tick(self.now)
        self.assertFalse(self.lst.unanswered)
        self.now = self.lst.deadline
        self.lst.tick(self.now)
        self.assertTrue(self.lst.unanswered)
        self.assertEqual(self.lst.packets(self.now), [])  # stops asking

    def test_resends_before_the_data_is_acked_do_not_count(self):
        self.lst.data_acked = False
        self.lst.packets(self.now)
        for _ in range(5):
            self.now = self.lst.deadline
            self.lst.tick(self.now)
            self.lst.packets(self.now)
        self.assertFalse(self.lst.unanswered)
        self.assertEqual(self.lst.unanswered_resends, 0)

    def test_malformed_down_is_ignored(self):
        self.lst.packets(self.now)
        bad = self.down(0, 3, 5, 5, [b"x"])  # first_seq <= after, and past last: malformed (§12.2)
        self.assertIsNone(self.run.open(bad))
        self.assertEqual((self.got, self.lst.confirmed), ([], False))


class Downlink(unittest.TestCase):
    """Downlink records queued with `pure-serve push` while the node runs, received by sender.py --listen."""

    NAMES = ("dl-once", "dl-rerun", "dl-zero", "dl-stay", "dl-many", "dl-refused", "dl-dgram")

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="interop-downlink-")
        cls.keys = {}
        lines = []
        for name in cls.NAMES:
            path, pub = new_key(cls.tmp, name)
            cls.keys[name] = path
            lines.append("%s %s" % (name, pub))
        cls.senders = os.path.join(cls.tmp, "senders")
        with open(cls.senders, "w") as f:
            f.write("\n".join(lines) + "\n")
        cls.node = Node(cls.tmp, cls.senders).start()  # no apps file: `main` takes downlink with its defaults

    @classmethod
    def tearDownClass(cls):
        cls.node.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def heard_file(self, name):
        return os.path.join(self.tmp, name + ".heard")

    def pushed(self, name, lines):
        rc, out = push(self.node, name, lines)
        self.assertEqual(rc, 0, out)

    def test_records_handed_over_once_and_in_order(self):
        recs = [b"rate=10", b"", "gr\u00fc\u00dfe".encode(), b"\xff\xfe", b"x" * 1024]
        self.pushed("dl-once", recs)
        hf = self.heard_file("dl-once")
        # uplink in the same run: LISTEN goes alone until confirmed, the DATA beside it (§12.6)
        rc, got, err = listen(self.node, self.keys["dl-once"], "--listen", "main", "--heard-file", hf,
                              lines=[b"up 1", b"up 2"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(got, recs)
        self.assertEqual(read_text(hf), "5\n")
        expect(self, self.node, "dl-once", [b"up 1", b"up 2"])

    def test_pushed_through_the_datagram_socket_as_the_docs_show(self):
        # docs/downlink.md, "The push datagram socket": a push a datagram, answered "STATUS JSON\n" to a bound socket
        path = os.path.join(self.node.state, "push.dgram")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.settimeout(10)
        s.bind("")
        try:
            s.sendto(b"app=main&to=dl-dgram\nd1\nd2\n", path)
            status, answer = s.recv(4096).decode().split(" ", 1)
            self.assertEqual(status, "200", answer)
            self.assertTrue(answer.endswith("\n"))
            a = json.loads(answer)
            self.assertEqual((a["to"], a["first"], a["last"], a["count"]), ("dl-dgram", 1, 2, 2), a)
            s.sendto(b"to=dl-dgram\nd3\n", path)  # no app: refused, nothing queued
            status, answer = s.recv(4096).decode().split(" ", 1)
            self.assertEqual(status, "400", answer)
            unbound = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            unbound.sendto(b"app=main&to=dl-dgram\nd3\n", path)  # queued, but nowhere to answer
            unbound.close()
            s.sendto(b"app=main&to=dl-dgram\nd4\n", path)
            status, answer = s.recv(4096).decode().split(" ", 1)
            self.assertEqual((status, json.loads(answer)["first"]), ("200", 4), answer)
        finally:
            s.close()
        rc, got, err = listen(self.node, self.keys["dl-dgram"], "--listen", "main")
        self.assertEqual((rc, got), (0, [b"d1", b"d2", b"d3", b"d4"]), err)

    def test_rerun_with_kept_heard_repeats_and_skips_nothing(self):
        hf = self.heard_file("dl-rerun")
        self.pushed("dl-rerun", [b"a1", b"a2", b"a3"])
        rc, got, err = listen(self.node, self.keys["dl-rerun"], "--listen", "main", "--heard-file", hf)
        self.assertEqual((rc, got), (0, [b"a1", b"a2", b"a3"]), err)
        rc, got, err = listen(self.node, self.keys["dl-rerun"], "--listen", "main", "--heard-file", hf)
        self.assertEqual((rc, got), (0, []), err)
        self.pushed("dl-rerun", [b"b4", b"b5"])
        rc, got, err = listen(self.node, self.keys["dl-rerun"], "--listen", "main", "--heard-file", hf)
        self.assertEqual((rc, got), (0, [b"b4", b"b5"]), err)
        self.assertEqual(read_text(hf), "5\n")
        rc, got, err = listen(self.node, self.keys["dl-rerun"], "--listen", "main", "--heard-file", hf)
        self.assertEqual((rc, got), (0, []), err)

    def test_heard_zero_after_some_were_acknowledged_gets_only_what_waits(self):
        self.pushed("dl-zero", [b"z1", b"z2", b"z3"])
        rc, got, err = listen(self.node, self.keys["dl-zero"], "--listen", "main", "--heard", "0")
        self.assertEqual((rc, got), (0, [b"z1", b"z2", b"z3"]), err)  # and acknowledged: deleted on the node
        self.pushed("dl-zero", [b"z4", b"z5"])
        rc, got, err = listen(self.node, self.keys["dl-zero"], "--listen", "main", "--heard", "0")
        self.assertEqual((rc, got), (0, [b"z4", b"z5"]), err)
        self.assertIn("heard 5:", err)  # numbered 4 and 5: nothing given twice

    def test_pushed_while_staying_arrives_without_a_new_ask(self):
        name = "dl-stay"
        self.pushed(name, [b"s1"])
        proc = subprocess.Popen([sys.executable, SENDER, "--key", self.keys[name], "--node", self.node.pubkey,
                                 "--to", self.node.to, "--listen", "main", "--stay", "20", "--ask-every", "60",
                                 "--verbose"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        err = []
        seen = {"caught": threading.Event(), "s2": threading.Event()}

        def read_err():
            for line in proc.stderr:
                line = line.decode().rstrip("\n")
                err.append((time.monotonic(), line))
                if line.startswith("caught up"):
                    seen["caught"].set()
                if line == "record 2":
                    seen["s2"].set()

        t = threading.Thread(target=read_err, daemon=True)
        t.start()
        try:
            self.assertTrue(seen["caught"].wait(10), err)
            time.sleep(0.2)
            asked_before = [l for _, l in err if l.startswith("LISTEN")]
            t0 = time.monotonic()
            self.pushed(name, [b"s2"])
            self.assertTrue(seen["s2"].wait(5), err)
            arrived = time.monotonic() - t0
            i = next(k for k, (_, l) in enumerate(err) if l == "record 2")
            between = [l for _, l in err[:i] if l.startswith("LISTEN")]
            self.assertEqual(between, asked_before, "a LISTEN went out between the push and the record")
            self.assertLess(arrived, 3.0)
        finally:
            proc.terminate()
            out = proc.stdout.read()
            proc.wait(10)
            t.join(5)
            proc.stdout.close()
            proc.stderr.close()
        self.assertEqual(out, b"s1\ns2\n")

    def test_refused_app(self):
        rc, got, err = listen(self.node, self.keys["dl-refused"], "--listen", "nope", "--timeout", "5")
        self.assertEqual((rc, got), (3, []), err)
        self.assertIn("reason 1", err)
        self.assertNotIn("DownlinkUnanswered", err)

    def test_refused_by_accept_list(self):
        tmp = tempfile.mkdtemp(prefix="interop-downlink-apps-")
        try:
            apps = os.path.join(tmp, "apps.toml")
            with open(apps, "w") as f:
                f.write('[apps.main]\naccept = ["dl-once"]\n')
            node = Node(tmp, self.senders, ["--apps", apps]).start()
            try:
                rc, out = push(node, "dl-refused", [b"never"])
                self.assertEqual(rc, 67, out)  # not accepted by the app: nothing queued
                rc, got, err = listen(node, self.keys["dl-refused"], "--listen", "main", "--timeout", "5")
                self.assertEqual((rc, got), (3, []), err)
                self.assertIn("reason 2", err)
            finally:
                node.stop()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_many_records_more_than_one_answer_all_in_order(self):
        recs = [b"m%03d-" % i + b"y" * 35 for i in range(300)]  # 40 bytes each
        self.pushed("dl-many", recs)
        hf = self.heard_file("dl-many")
        rc, got, err = listen(self.node, self.keys["dl-many"], "--listen", "main", "--heard-file", hf)
        self.assertEqual(rc, 0, err)
        self.assertEqual(got, recs)
        self.assertEqual(read_text(hf), "300\n")
        listens = int(err.split(" LISTEN sent")[0].rsplit(" ", 1)[1])
        self.assertGreater(listens, 5, err)  # ~25 records per 1200-byte answer


class DownlinkRestart(unittest.TestCase):
    """SIGKILL the node while records are being handed over; restart it: nothing lost or doubled."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="interop-downlink-restart-")
        self.key, pub = new_key(self.tmp, "dl-restart")
        self.senders = os.path.join(self.tmp, "senders")
        with open(self.senders, "w") as f:
            f.write("dl-restart %s\n" % pub)
        self.node = Node(self.tmp, self.senders).start()

    def tearDown(self):
        self.node.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_node_killed_mid_delivery(self):
        recs = [b"k%03d-" % i + b"z" * 35 for i in range(300)]
        rc, out = push(self.node, "dl-restart", recs)
        self.assertEqual(rc, 0, out)
        hf = os.path.join(self.tmp, "heard")
        # a small room: about three records per answer, so the kill comes in the middle
        proc = subprocess.Popen([sys.executable, SENDER, "--key", self.key, "--node", self.node.pubkey, "--to",
                                 self.node.to, "--listen", "main", "--heard-file", hf, "--room", "200",
                                 "--timeout", "20", "--stay", "30", "--ask-every", "0.5"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        got = []
        err = []
        reached = threading.Event()
        caught = threading.Event()
        last_kept = threading.Event()

        def read_out():
            for line in proc.stdout:
                got.append(line.rstrip(b"\n"))
                if len(got) >= 60:
                    reached.set()

        def read_err():
            for line in proc.stderr:
                line = line.decode().rstrip("\n")
                err.append(line)
                if line.startswith("caught up"):
                    caught.set()
                if line == "record 310":
                    last_kept.set()

        threads = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True)]
        for t in threads:
            t.start()
        try:
            self.assertTrue(reached.wait(15), err[-5:])
            self.node.kill()
            self.assertLess(len(got), 300, "all handed over before the kill: nothing tested")
            time.sleep(0.3)
            self.node.start()
            self.assertTrue(caught.wait(20), err[-5:])
            # the new node's session is live and listening again: more pushed records come without waiting
            more = [b"after restart %d" % i for i in range(10)]
            rc, out = push(self.node, "dl-restart", more)
            self.assertEqual(rc, 0, out)
            self.assertIn("sequences 301-310", out)
            # "record 310" is logged once the heard file says 310 (it is written after the records are printed)
            self.assertTrue(last_kept.wait(15), err[-5:])
        finally:
            proc.terminate()
            proc.wait(10)
            for t in threads:
                t.join(5)
            proc.stdout.close()
            proc.stderr.close()
        self.assertEqual(got, recs + more, err[-5:])
        self.assertTrue(any("epoch changed" in l for l in err), err[-5:])
        self.assertEqual(read_text(hf), "310\n")
        rc, again, e = listen(self.node, self.key, "--listen", "main", "--heard-file", hf)
        self.assertEqual((rc, again), (0, []), e)


class LagBudget(unittest.TestCase):
    """§6.3: while an app has a lag budget, frames are taken while its records in the turn are below the room the
    budget leaves; the frame that reaches it is taken whole, so a burst passes the budget by less than a frame —
    within one packet as across packets, and from a node's very first packet."""

    def test_frames_in_one_packet_stop_at_the_budget_plus_less_than_a_frame(self):
        tmp = tempfile.mkdtemp(prefix="interop-lag-")
        try:
            key, pub = new_key(tmp, "burst")
            senders = os.path.join(tmp, "senders")
            with open(senders, "w") as f:
                f.write("burst %s\n" % pub)
            dead = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            dead.bind(("127.0.0.1", 0))
            dead_port = dead.getsockname()[1]
            dead.close()  # nobody answers there: the outlet's lag only grows
            far = S.b64(S.raw_public(S.X25519PrivateKey.generate()))
            apps = os.path.join(tmp, "apps.toml")
            with open(apps, "w") as f:
                f.write('[apps.main]\n[apps.main.outlets.away]\nkind = "link"\nto = "127.0.0.1:%d"\n'
                        'node_key = "%s"\napp = "far"\nmax_lag_records = 5\n' % (dead_port, far))
            node = Node(tmp, senders, ["--apps", apps]).start()
            try:
                p = Probe(node, key)
                try:
                    frames = b"".join(S.data_frame(b"main", first, [b"r%d" % i for i in range(first, first + 4)])
                                      for first in (1, 5, 9))
                    r = p.ask(p.packet(frames))
                    self.assertIsNotNone(r, "no answer to the packet of three frames")
                    acks = [f[2] for f in r[1][2] if f[0] == "ack" and f[1] == b"main"]
                    # 4 records < 5: the second frame is taken whole (8); 8 >= 5: the third is held back.
                    self.assertEqual(acks, [8], r[1])
                finally:
                    p.close()
                self.assertEqual(sorted(rec["seq"] for rec in node.records("burst")), list(range(1, 9)))
            finally:
                node.stop()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
