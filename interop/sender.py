#!/usr/bin/env python3
"""A pure-serve sender (link protocol version 1), written from docs/protocol.md alone.

Single run:
    python3 interop/sender.py --key FILE --node PUBKEY --to HOST:PORT [--app main] [--start N] < lines

Load (many senders, few sockets):
    python3 interop/sender.py --load N --records M --senders-out SENDERS --keys-out KEYS      # make keys only
    python3 interop/sender.py --load N --records M --keys-in KEYS --node PUBKEY --to HOST:PORT  # deliver

Section numbers in comments ("§5.2") refer to docs/protocol.md.
"""

import argparse
import base64
import collections
import json
import os
import selectors
import socket
import sys
import time

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, hmac
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand
from cryptography.hazmat.primitives.serialization import Encoding, PrivateFormat, PublicFormat, NoEncryption

# ---------------------------------------------------------------- constants (§2, §3, §4, §5)

SALT = b"pure-serve link v1"
TYPE_S2N = 0x11  # version 1, type 1 (§4.1)
TYPE_N2S = 0x12  # version 1, type 2 (§4.2)
TYPE_COOKIE = 0x13  # version 1, type 3: COOKIE, node -> sender (§4.4)
TYPE_S2N_COOKIE = 0x14  # version 1, type 4: a cookie, then a whole type-1 packet (§4.4)
COOKIE_LEN = 16
COOKIE_PACKET = 1 + 4 + 8 + 8 + COOKIE_LEN  # 37 bytes exactly (§4.4)
COOKIE_PREFIX = 1 + COOKIE_LEN  # what a cookie adds in front of a packet
COOKIE_USE = 120.0  # §4.4: echoed until the first authenticated node packet, or 120 s
S2N_HEADER = 21
N2S_HEADER = 17
TAG = 16
MIN_DATAGRAM = 96
MAX_DATAGRAM = 1472
DEFAULT_DATAGRAM = 1200
PN_LIMIT = 1 << 62  # §3: packet numbers stop at 2^62

F_PADDING, F_DATA, F_ACK, F_ECHO, F_REFUSE, F_FORWARD = 0x00, 0x01, 0x02, 0x03, 0x04, 0x05
F_NOT_STORED, F_LISTEN, F_DOWN = 0x06, 0x07, 0x08  # NOT_STORED (§5.2); LISTEN and DOWN: version 1.1 (§12)
MAX_DOWN_RECORD = 1024  # §12.2: a downlink record's payload is at most 1024 bytes
REFUSE_REASONS = {1: "no such app on this node", 2: "this app does not accept this sender",
                  3: "this app takes no forwarded records (FORWARD frames) from this sender"}
APP_CHARS = set(b"abcdefghijklmnopqrstuvwxyz0123456789_-")

DEFAULT_WINDOW = 16384  # §7
RTO_INITIAL, RTO_MIN, RTO_MAX, RTO_G = 0.250, 0.050, 2.0, 0.002  # §7.4


class Malformed(Exception):
    pass


class ProtocolFailure(Exception):
    """The node said something that makes delivery impossible (REFUSE, a gap we cannot fill)."""


# ---------------------------------------------------------------- varint (conventions)

def varint(n):
    if n < 0 or n >= 1 << 64:
        raise ValueError("varint out of range")
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def read_varint(buf, i):
    """Returns (value, next index). At most 10 bytes, value at most 2^64-1."""
    value = 0
    for k in range(10):
        if i + k >= len(buf):
            raise Malformed("varint runs past the end")
        b = buf[i + k]
        value |= (b & 0x7F) << (7 * k)
        if not b & 0x80:
            if value >= 1 << 64:
                raise Malformed("varint overflows 64 bits")
            return value, i + k + 1
    raise Malformed("varint longer than 10 bytes")


# ---------------------------------------------------------------- keys (§1, §2)

def b64key(text):
    raw = base64.b64decode(text.strip(), validate=True)
    if len(raw) != 32:
        raise ValueError("a key is 32 bytes, this one is %d" % len(raw))
    return raw


def load_private_key(path):
    with open(path, "r", encoding="ascii") as f:
        return X25519PrivateKey.from_private_bytes(b64key(f.readline()))


def raw_public(priv):
    return priv.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def raw_private(priv):
    return priv.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def b64(raw):
    return base64.b64encode(raw).decode("ascii")


def hkdf_extract(salt, ikm):
    h = hmac.HMAC(salt, hashes.SHA256())
    h.update(ikm)
    return h.finalize()


def hkdf_expand(prk, info, length=16):
    return HKDFExpand(algorithm=hashes.SHA256(), length=length, info=info).derive(prk)


def shared_secret(priv, node_pub):
    try:
        ss = priv.exchange(X25519PublicKey.from_public_bytes(node_pub))
    except ValueError:  # cryptography refuses an all-zero result itself
        raise ValueError("X25519 result is all zeros: the node key is a low-order point (§2)")
    if ss == bytes(32):
        raise ValueError("X25519 result is all zeros: the node key is a low-order point (§2)")
    return ss


def check_app(app):
    raw = app.encode("ascii") if isinstance(app, str) else bytes(app)
    if not 1 <= len(raw) <= 32 or not set(raw) <= APP_CHARS:
        raise ValueError("an app name is 1-32 bytes of [a-z0-9_-] (§5): %r" % app)
    return raw


# ---------------------------------------------------------------- frames (§5)

def data_frame(app, first_seq, payloads):
    out = bytearray((F_DATA, len(app)))
    out += app
    out += varint(first_seq)
    out += varint(len(payloads))
    for p in payloads:
        out += varint(len(p))
        out += p
    return bytes(out)


def probe_frame(app):
    return data_frame(app, 0, [])  # §5.1: count 0, first_seq 0


def forward_frame(app, first_seq, records):
    """§5.4: a FORWARD frame, as DATA but each record (origin, origin_seq, payload) is a forwarded record:
    origin_len (1 byte), origin, origin_seq (varint), payload. A node forwarding records sends these; this sender
    is a device and uses it only to check that a node refuses it from one (REFUSE reason 3)."""
    out = bytearray((F_FORWARD, len(app)))
    out += app
    out += varint(first_seq)
    out += varint(len(records))
    for origin, origin_seq, payload in records:
        rec = bytes((len(origin),)) + origin + varint(origin_seq) + payload
        out += varint(len(rec))
        out += rec
    return bytes(out)


def listen_frame(app, heard):
    """§12.2: LISTEN, app, heard (varint)."""
    return bytes((F_LISTEN, len(app))) + app + varint(heard)


def _read_app(pt, i):
    n = len(pt)
    if i >= n:
        raise Malformed("frame runs past the end")
    app_len = pt[i]
    i += 1
    if not 1 <= app_len <= 32 or i + app_len > n:
        raise Malformed("bad app length")
    app = bytes(pt[i:i + app_len])
    if not set(app) <= APP_CHARS:
        raise Malformed("bad app name")
    return app, i + app_len


def parse_node_frames(pt):
    """Frames of a node packet: a list of ("echo", pn), ("ack", app, stored_through), ("refuse", app, reason),
    ("not_stored", app, reason) and ("down", app, last, after, first_seq, [payload, ...]).

    §5: a frame running past the end, an unknown type, or one not allowed node -> sender makes it malformed; §12.2
    adds the DOWN frame's own rules."""
    frames = []
    i, n = 0, len(pt)
    while i < n:
        t = pt[i]
        i += 1
        if t == F_PADDING:
            continue
        if t == F_ECHO:
            pn, i = read_varint(pt, i)
            frames.append(("echo", pn))
        elif t in (F_ACK, F_REFUSE, F_NOT_STORED):
            app, i = _read_app(pt, i)
            if t == F_ACK:
                st, i = read_varint(pt, i)
                frames.append(("ack", app, st))
            else:
                if i >= n:
                    raise Malformed("frame runs past the end")
                frames.append(("refuse" if t == F_REFUSE else "not_stored", app, pt[i]))
                i += 1
        elif t == F_DOWN:
            app, i = _read_app(pt, i)
            last, i = read_varint(pt, i)
            after, i = read_varint(pt, i)
            first, i = read_varint(pt, i)
            count, i = read_varint(pt, i)
            if count == 0:
                if first != 0:
                    raise Malformed("DOWN with count 0 and first_seq %d" % first)
            else:
                if first == 0 or first <= after:
                    raise Malformed("DOWN first_seq %d with after %d" % (first, after))
                if first + count - 1 >= 1 << 64 or first + count - 1 > last:
                    raise Malformed("DOWN last sequence past `last` or 2^64-1")
            recs = []
            for _ in range(count):
                ln, i = read_varint(pt, i)
                if i + ln > n:
                    raise Malformed("DOWN record runs past the end")
                recs.append(bytes(pt[i:i + ln]))
                i += ln
            frames.append(("down", app, last, after, first, recs))
        elif t in (F_DATA, F_FORWARD, F_LISTEN):
            raise Malformed("sender frame 0x%02x from the node" % t)
        else:
            raise Malformed("unknown frame type 0x%02x" % t)
    return frames


# ---------------------------------------------------------------- the run (§2, §3, §4)

class Run:
    """One run of one sender towards one node: run id, keys, packet numbers."""

    def __init__(self, priv, node_pub, run_id=None):
        self.s_pub = raw_public(priv)
        self.n_pub = bytes(node_pub)
        self.key_id = self.s_pub[:4]
        self.run_id = run_id if run_id is not None else os.urandom(8)
        self.prk = hkdf_extract(SALT, shared_secret(priv, self.n_pub))
        self.k_s2n = AESGCM(hkdf_expand(self.prk, b"s2n" + self.run_id + self.s_pub + self.n_pub))
        self.n2s = collections.OrderedDict()  # epoch -> AESGCM, a few most recent
        self.epoch = None  # latest epoch that authenticated (§7 "Node epochs")
        self.epochs_seen = 0
        self.next_pn = 0
        self.cookie = None  # §4.4: (cookie bytes, time it arrived), echoed in front of every packet while held
        self.cookie_resend_from = 0  # only a COOKIE for a packet numbered at least this resends at once
        self.cookies_received = 0
        self.use_cookies = True  # False: behave as a sender written before §4.4 (ignore COOKIEs)
        self.malformed = 0  # authenticated node packets whose frames were malformed (ignored)

    def k_n2s(self, epoch):
        k = self.n2s.get(epoch)
        if k is None:
            k = AESGCM(hkdf_expand(self.prk, b"n2s" + self.run_id + epoch + self.s_pub + self.n_pub))
            self.n2s[epoch] = k
            while len(self.n2s) > 4:
                self.n2s.popitem(last=False)
        return k

    def cookie_room(self, now=None):
        """Bytes a cookie takes in front of the next packet (0 when none is held): fill 17 bytes less (§4.4)."""
        if self.cookie is not None:
            now = time.monotonic() if now is None else now
            if now - self.cookie[1] >= COOKIE_USE:
                self.cookie = None
        return COOKIE_PREFIX if self.cookie is not None else 0

    def take_cookie(self, dgram, now):
        """A COOKIE packet (§4.4). Returns None if it is not for this run, else whether to send again at once."""
        if not self.use_cookies or len(dgram) != COOKIE_PACKET or dgram[0] != TYPE_COOKIE:
            return None
        if bytes(dgram[1:5]) != self.key_id or bytes(dgram[5:13]) != self.run_id:
            return None
        pn = int.from_bytes(dgram[13:21], "big")
        if pn >= self.next_pn:
            return None  # not a packet number we sent: made up
        self.cookie = (bytes(dgram[21:37]), now)
        self.cookies_received += 1
        if pn >= self.cookie_resend_from:
            self.cookie_resend_from = self.next_pn
            return True
        return False

    def seal(self, frames, min_size=MIN_DATAGRAM):
        """One sender datagram: header || AES-128-GCM(frames padded so the datagram is >= 96 bytes); with a
        cookie held, 0x14 || cookie in front of it (§4.4: the inner packet is unchanged, its size rules apply)."""
        pn = self.next_pn
        if pn >= PN_LIMIT:
            raise OverflowError("packet numbers exhausted: start a new run (§3)")
        self.next_pn += 1
        pad = min_size - (S2N_HEADER + len(frames) + TAG)
        if pad > 0:
            frames += bytes(pad)  # PADDING frames are single 0x00 bytes
        header = bytes((TYPE_S2N,)) + self.key_id + self.run_id + pn.to_bytes(8, "big")
        nonce = bytes(4) + pn.to_bytes(8, "big")
        packet = header + self.k_s2n.encrypt(nonce, frames, header)
        if self.cookie_room():
            packet = bytes((TYPE_S2N_COOKIE,)) + self.cookie[0] + packet
        return pn, packet

    def open(self, dgram):
        """Opens a node datagram: (epoch, packet number, frames), or None if it is not for this run."""
        if len(dgram) < N2S_HEADER + TAG or dgram[0] != TYPE_N2S:
            return None
        header = bytes(dgram[:N2S_HEADER])
        epoch = header[1:9]
        nonce = bytes(4) + header[9:17]
        try:
            pt = self.k_n2s(epoch).decrypt(nonce, bytes(dgram[N2S_HEADER:]), header)
        except InvalidTag:
            if epoch != self.epoch:
                self.n2s.pop(epoch, None)  # don't let forged epochs push out the real one
            return None
        try:
            frames = parse_node_frames(pt)
        except Malformed:
            self.malformed += 1
            return None  # §5: malformed, though it authenticated: nothing in it is taken
        if epoch != self.epoch:
            self.epoch = epoch
            self.epochs_seen += 1
        self.cookie = None  # §4.4: the node has our session now; no more X25519 for this run
        return epoch, int.from_bytes(header[9:17], "big"), frames


# ---------------------------------------------------------------- one sender's delivery of one flow (§7)

class Delivery:
    """Delivers a list of payloads for one app over one run: probe or known start, go-back-N, RTO, give-up.

    Driven from outside: packets(now) gives datagrams to send, receive(dgram, now) takes node datagrams,
    tick(now) runs the timers. State: done / failed (with .error).

    §7.2: a record gets its sequence when it is queued. With a known start that is at once; with a probe, the
    payloads wait unnumbered until the probe's answer and are then all numbered, in order. From then on a
    record keeps its number unless the node provably went back (§7.3)."""

    def __init__(self, run, app, payloads, start=None, window=DEFAULT_WINDOW, datagram=DEFAULT_DATAGRAM,
                 timeout=60.0, log=None, now=None):
        now = time.monotonic() if now is None else now
        self.run = run
        self.app = check_app(app)
        self.pending = collections.deque(payloads)  # accepted, not numbered yet (only before a probe's answer)
        self.total = len(self.pending)
        self.records = collections.deque()  # [seq, payload]: numbered, not acknowledged; seq = acked + 1 + index
        self.cursor = 0  # index in records of the next record to (re)send (go-back-N)
        self.sent = 0  # records at the front of `records` sent at least once
        self.window = window
        self.datagram = datagram
        self.timeout = timeout
        self.log = log or (lambda msg: None)
        self.start = start
        self.first_seq = None  # sequence of the first record we numbered
        self.last_seq = None
        self.base_pn = None  # packet number of the first packet that carried record acked + 1 (§7.3)
        self.floor_echo = None  # ECHO of the node packet that made us renumber (§7.3)
        self.largest_echo = None  # §7.4: only a larger ECHO gives a round-trip sample
        if start is None:
            self.next_seq = None  # unknown until the probe is answered
            self.acked = None
            self.probe_pending = True  # a probe must be (re)sent
        else:
            if start < 1:
                raise ValueError("sequences start at 1 (§5.1)")
            self.next_seq = start
            self.acked = start - 1  # §7.2: a flow started at n has acknowledged sequence n - 1
            self.probe_pending = False
            self._number()
        self.probe_in_flight = False
        self.sent_at = {}  # packet number -> send time, for ECHO samples
        self.srtt = None
        self.rttvar = None
        self.rto = RTO_INITIAL
        self.deadline = None  # RTO timer
        self.last_progress = now
        self.started = now
        self.finished = None
        self.packets_sent = 0
        self.retransmits = 0  # go-back-N rounds
        self.acks_received = 0
        self.renumbered = 0  # times the node proved it went back (§7.3)
        self.error = None
        self.failed = False
        self.refused = None
        self.counter_behind = False  # the node held sequences we had numbered: those records were duplicates
        for p in list(self.pending) + [r[1] for r in self.records]:
            if 21 + TAG + 1 + 1 + len(self.app) + 10 + 3 + len(varint(len(p))) + len(p) > MAX_DATAGRAM:
                raise ValueError("a record of %d bytes does not fit in one datagram (§5)" % len(p))

    def _number(self):
        """Numbers every pending payload, in order, from next_seq (§7.2)."""
        while self.pending:
            seq = self.next_seq
            self.records.append([seq, self.pending.popleft()])
            if self.first_seq is None:
                self.first_seq = seq
            self.last_seq = seq
            self.next_seq += 1

    # -- state

    @property
    def done(self):
        return (not self.failed and self.next_seq is not None and not self.probe_pending
                and not self.probe_in_flight and not self.pending and not self.records)

    @property
    def active(self):
        return not self.done and not self.failed

    def in_flight(self):
        return self.probe_in_flight or self.sent > 0

    def has_sendable(self):
        """Whether packets(now) would send something now."""
        if self.failed or self.done:
            return False
        if self.probe_pending:
            return True
        return self.next_seq is not None and self.cursor < min(len(self.records), self.window)

    def fail(self, msg):
        if not self.failed:
            self.failed = True
            self.error = msg
            self.finished = time.monotonic()

    # -- sending

    def _seal(self, frames, now):
        pn, dgram = self.run.seal(frames)
        self.sent_at[pn] = now
        self.packets_sent += 1
        if self.deadline is None:
            self.deadline = now + self.rto
        return pn, dgram

    def _fill(self, budget):
        """A DATA frame of as many records as fit in budget plaintext bytes, from the cursor; (frame, count)."""
        recs = []
        first = None
        size = 1 + 1 + len(self.app)  # type, app_len, app
        limit = min(len(self.records), self.window)
        while self.cursor + len(recs) < limit:
            seq, payload = self.records[self.cursor + len(recs)]
            if first is None:
                first = seq
            add = len(varint(len(payload))) + len(payload)
            head = len(varint(first)) + len(varint(len(recs) + 1))
            if size + head + add > budget and recs:
                break
            # §5: a single record larger than the usual budget goes alone in a datagram of up to 1472 bytes.
            if size + head + add > MAX_DATAGRAM - S2N_HEADER - TAG:
                raise ValueError("record too large")
            recs.append(payload)
            size += add
        if not recs:
            return None, 0
        self.cursor += len(recs)
        self.sent = max(self.sent, self.cursor)
        return data_frame(self.app, first, recs), len(recs)

    def packets(self, now, limit=64):
        """Datagrams to send now (at most limit)."""
        out = []
        if self.failed or self.done:
            return out
        if self.probe_pending:
            self.probe_pending = False
            self.probe_in_flight = True
            out.append(self._seal(probe_frame(self.app), now)[1])
            return out
        if self.next_seq is None:
            return out
        budget = self.datagram - S2N_HEADER - TAG - self.run.cookie_room(now)
        while len(out) < limit:
            carries_first = self.cursor == 0
            frame, n = self._fill(budget)
            if frame is None:
                break
            pn, dgram = self._seal(frame, now)
            if carries_first and self.base_pn is None:
                self.base_pn = pn
            out.append(dgram)
        return out

    # -- timers

    def next_timer(self):
        if not self.active:
            return None
        t = self.last_progress + self.timeout if self.timeout else None
        if self.deadline is not None:
            t = self.deadline if t is None else min(t, self.deadline)
        return t

    def tick(self, now):
        if not self.active:
            return
        if self.timeout and now - self.last_progress > self.timeout:
            self.fail("gave up: nothing acknowledged for %.1f s; %d of %d records not acknowledged"
                      % (self.timeout, len(self.pending) + len(self.records), self.total))
            return
        if self.deadline is not None and now >= self.deadline:
            if self.in_flight():
                # §7.5 Retransmission: go back to the first unacknowledged record, double the RTO.
                self.retransmits += 1
                self.cursor = 0
                if self.probe_in_flight:
                    self.probe_in_flight = False
                    self.probe_pending = True
                self.rto = min(self.rto * 2, RTO_MAX)
                self.deadline = now + self.rto
            else:
                self.deadline = None

    # -- receiving

    def _rtt_sample(self, r):
        if self.srtt is None:
            self.srtt, self.rttvar = r, r / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - r)
            self.srtt = 0.875 * self.srtt + 0.125 * r
        self.rto = self._base_rto()

    def _base_rto(self):
        """§7.4's RTO before any doubling: from the estimator, or the initial one before a sample."""
        if self.srtt is None:
            return RTO_INITIAL
        return min(max(self.srtt + max(4 * self.rttvar, RTO_G), RTO_MIN), RTO_MAX)

    def _echo(self, echo, now):
        """§7.4: a sample only from an ECHO larger than any before, once per packet number."""
        if self.largest_echo is not None and echo <= self.largest_echo:
            return
        self.largest_echo = echo
        sent = self.sent_at.pop(echo, None)
        if sent is not None:
            self._rtt_sample(now - sent)
        for old in [k for k in self.sent_at if k < echo]:
            del self.sent_at[old]

    def cookie(self, dgram, now):
        """Takes a COOKIE; returns True if it was for this run. §4.4: the packet it answers was dropped, so what
        is unacknowledged is sent again now (go-back-N, no RTO doubling), once per round of COOKIEs."""
        resend = self.run.take_cookie(dgram, now)
        if resend is None:
            return False
        if resend and self.active:
            self.cursor = 0
            if self.probe_in_flight:
                self.probe_in_flight = False
                self.probe_pending = True
        return True

    def receive(self, dgram, now):
        """Takes one datagram; returns True if it authenticated for this run (or was a COOKIE for it)."""
        if dgram and dgram[0] == TYPE_COOKIE:
            return self.cookie(dgram, now)
        opened = self.run.open(dgram)
        if opened is None:
            return False
        self.handle(opened, now)
        return True

    def handle(self, opened, now):
        epoch, pn, frames = opened
        if not self.active:
            return
        echo = next((f[1] for f in frames if f[0] == "echo"), None)  # §5: ECHO comes first
        if echo is not None:
            self._echo(echo, now)
        for f in frames:
            if f[0] == "refuse":
                if f[1] == self.app:
                    self.refused = f[2]
                    self.fail("node refused app %s: reason %d (%s)" % (
                        self.app.decode(), f[2], REFUSE_REASONS.get(f[2], "unknown reason")))
            elif f[0] == "ack":
                if f[1] == self.app:
                    self.acks_received += 1
                    self._ack(f[2], echo, now)

    def _progress(self, now):
        self.last_progress = now
        # §7.5: any progress restores the undoubled RTO at once, before the next RTT sample.
        self.rto = self._base_rto()
        self.deadline = (now + self.rto) if self.in_flight() else None
        if self.done:
            self.finished = now

    def _ack(self, a, echo, now):
        if self.floor_echo is not None and (echo is None or echo < self.floor_echo):
            return  # §7.3: built before the node went back; it speaks of records the node no longer has
        if self.next_seq is None:
            # The probe's answer (§7.2): number everything queued from stored_through + 1.
            self.probe_in_flight = False
            self.next_seq = a + 1
            self.acked = a
            self.start = a + 1
            self._number()
            self.log("probe: node holds %s through %d; numbering from %d" % (self.app.decode(), a, a + 1))
            self.deadline = None
            self._progress(now)
            return
        self.probe_in_flight = False
        if a < self.acked:
            # §7.3: believed only if the ECHO shows the node had the packet that first carried acked + 1;
            # otherwise it is a late or replayed answer from before the ACK that raised `acked`.
            if self.base_pn is None or echo is None or echo < self.base_pn:
                return
            delta = self.acked - a
            self.log("node holds %s only through %d, below our acknowledged %d: renumbering our %d records "
                     "from %d" % (self.app.decode(), a, self.acked, len(self.records), a + 1))
            for i, r in enumerate(self.records):
                r[0] = a + 1 + i
            if self.first_seq is not None and self.first_seq > a:
                self.first_seq -= delta
            if self.last_seq is not None:
                self.last_seq -= delta
            self.acked = a
            self.next_seq = a + 1 + len(self.records)
            self.cursor = self.sent = 0
            self.base_pn = None
            self.floor_echo = echo
            self.renumbered += 1
            self._progress(now)
            return
        if a == self.acked:
            return
        released = 0
        while self.records and self.records[0][0] <= a:
            self.records.popleft()
            released += 1
        self.cursor = max(0, self.cursor - released)
        self.sent = max(0, self.sent - released)
        self.acked = a
        self.base_pn = None
        highest = self.next_seq - 1
        if a > highest:
            # §7.3: the node holds records the sender does not know; continue from a + 1.
            self.log("node holds %s through %d, above the highest sequence we numbered (%d): continuing from %d"
                     % (self.app.decode(), a, highest, a + 1))
            self.next_seq = a + 1
            self.counter_behind = True
        self._progress(now)


# ---------------------------------------------------------------- downlink: one listened flow (§12.4, §12.6)

class Listen:
    """The device side of one downlink flow (app, this sender) over one run (§12.4).

    State, as §12.4 names it: `heard` (given when the flow is opened, only growing), `node_last` (the `last` of
    the latest DOWN frame of the flow), the outstanding LISTEN (the packet number that carried it, None if none)
    and `confirmed` (a DOWN frame of the flow came in this run).

    Driven from outside like Delivery: packets(now), handle(opened, now), tick(now), next_timer(). Each record
    handed over goes to on_record(seq, payload), in order, once. The driver sets data_acked (True when this run
    has no DATA unacknowledged) for §12.6.

    LISTEN goes in packets of its own (no DATA beside it), padded to `room`, before and after the flow is
    confirmed: §12.6 asks that only until confirmed; alone is always allowed and keeps this sender simple. The
    RTO is §7.4's estimator and §7.5's doubling, kept for LISTEN packets (samples from ECHOs of LISTEN packets)."""

    UNANSWERED_RESENDS = 3  # §12.6

    def __init__(self, run, app, heard=0, room=DEFAULT_DATAGRAM, log=None, on_record=None):
        if heard < 0 or heard >= 1 << 64:
            raise ValueError("heard must be 0 .. 2^64-1")
        self.run = run
        self.app = check_app(app)
        self.heard = heard
        self.room = max(MIN_DATAGRAM, min(room, MAX_DATAGRAM))
        self.log = log or (lambda msg: None)
        self.on_record = on_record or (lambda seq, payload: None)
        self.node_last = None
        self.outstanding = None  # packet number of the LISTEN not answered yet
        self.confirmed = False
        self.sent_heard = None  # `heard` of the last LISTEN sent
        self.asked = True  # the flow was opened: the run's first LISTEN (§12.4)
        self.hold_until = None  # §12.4 step 4: an answer without room; wait one RTO
        self.resend_now = False  # a COOKIE dropped the LISTEN: send it again at once, without doubling (§4.4)
        self.deadline = None  # the outstanding LISTEN's RTO
        self.rto = RTO_INITIAL
        self.srtt = None
        self.rttvar = None
        self.sent_at = {}
        self.largest_echo = None
        self.data_acked = True
        self.unanswered_resends = 0  # RTO resends since the data was acknowledged, while not confirmed
        self.unanswered = False  # §12.6: DownlinkUnanswered
        self.refused = None
        self.listens_sent = 0
        self.resends = 0
        self.handed = 0
        self.last_answer = None  # time of the last authenticated node packet
        self.holds = 0

    # -- state

    @property
    def stopped(self):
        return self.refused is not None or self.unanswered

    @property
    def done(self):
        """Everything waiting was handed over and acknowledged, and the node says nothing more waits."""
        return (not self.stopped and self.confirmed and self.outstanding is None and not self.asked
                and self.sent_heard == self.heard and (self.node_last is None or self.node_last <= self.heard))

    def ask_now(self):
        """The program asks (a device awake that polls, §12.4)."""
        self.asked = True

    def _why(self, now):
        """Why a LISTEN should go now, or None."""
        if self.stopped:
            return None
        if self.asked:
            return "ask"
        if self.sent_heard is not None and self.heard > self.sent_heard:
            return "ack"  # §12.4: heard grew, acknowledge at once
        if self.outstanding is not None:
            if self.resend_now:
                return "cookie"
            if self.deadline is not None and now >= self.deadline:
                return "rto"
            return None
        if self.node_last is not None and self.node_last > self.heard:
            if self.hold_until is not None and now < self.hold_until:
                return None
            return "more"
        return None

    def has_sendable(self, now):
        return self._why(now) is not None

    # -- sending

    def packets(self, now):
        why = self._why(now)
        if why is None:
            return []
        if why == "rto":
            self.rto = min(self.rto * 2, RTO_MAX)  # §7.5: doubling
            self.resends += 1
            if self.data_acked and not self.confirmed:
                self.unanswered_resends += 1
        # §12.4 Room: padded to the room wanted for the answer, the whole datagram within it (a cookie's 17
        # bytes included, §4.4).
        size = max(MIN_DATAGRAM, self.room - self.run.cookie_room(now))
        pn, dgram = self.run.seal(listen_frame(self.app, self.heard), min_size=size)
        self.sent_at[pn] = now
        self.outstanding = pn
        self.deadline = now + self.rto
        self.sent_heard = self.heard
        self.asked = False
        self.resend_now = False
        self.hold_until = None
        self.listens_sent += 1
        self.log("LISTEN %s heard=%d pn=%d (%s)" % (self.app.decode(), self.heard, pn, why))
        return [dgram]

    # -- timers

    def next_timer(self):
        ts = [t for t in (self.deadline if self.outstanding is not None else None, self.hold_until) if t is not None]
        return min(ts) if ts else None

    def tick(self, now):
        """§12.6: an unconfirmed LISTEN still unanswered after the data was acknowledged and three RTO resends
        (the third resend's RTO passed too) means the node has no downlink for the app."""
        if self.stopped or self.confirmed or self.outstanding is None:
            return
        if (self.data_acked and self.unanswered_resends >= self.UNANSWERED_RESENDS and self.deadline is not None
                and now >= self.deadline):
            self.unanswered = True
            self.log("DownlinkUnanswered %s: the node has no downlink for this app (no answer to LISTEN after "
                     "%d resends)" % (self.app.decode(), self.unanswered_resends))

    # -- receiving

    def _echo(self, echo, now):
        """§7.4, as Delivery: a sample only from an ECHO larger than any before, once per packet number."""
        if self.largest_echo is not None and echo <= self.largest_echo:
            return
        self.largest_echo = echo
        sent = self.sent_at.pop(echo, None)
        if sent is not None:
            r = now - sent
            if self.srtt is None:
                self.srtt, self.rttvar = r, r / 2
            else:
                self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - r)
                self.srtt = 0.875 * self.srtt + 0.125 * r
        for old in [k for k in self.sent_at if k < echo]:
            del self.sent_at[old]

    def _base_rto(self):
        if self.srtt is None:
            return RTO_INITIAL
        return min(max(self.srtt + max(4 * self.rttvar, RTO_G), RTO_MIN), RTO_MAX)

    def cookie(self, resend):
        """A COOKIE for this run arrived (the run took it); resend says whether it asks for a resend (§4.4)."""
        if resend and self.outstanding is not None:
            self.resend_now = True

    def handle(self, opened, now):
        """One authenticated node packet (any epoch, §12.4)."""
        epoch, pn, frames = opened
        self.last_answer = now
        if self.stopped:
            return
        echo = next((f[1] for f in frames if f[0] == "echo"), None)
        if echo is not None:
            self._echo(echo, now)
        answered = False
        handed = 0
        for f in frames:
            if f[0] == "refuse" and f[1] == self.app:
                # A REFUSE for the app is final for the flow in this run (as for DATA, §7.3).
                self.refused = f[2]
                self.log("node refused app %s: reason %d (%s)" % (
                    self.app.decode(), f[2], REFUSE_REASONS.get(f[2], "unknown reason")))
                return
            if f[0] != "down" or f[1] != self.app:
                continue  # §12.4: a DOWN frame of an app we do not listen on is ignored
            _, _, last, after, first, recs = f
            # step 1
            self.node_last = last
            self.confirmed = True
            if self.outstanding is not None and echo is not None and echo >= self.outstanding:
                answered = True
                self.outstanding = None
                self.deadline = None
                self.rto = self._base_rto()
            # step 2
            if after > self.heard:
                continue  # a frame before it was lost or comes later: its records come again
            # step 3
            for k, payload in enumerate(recs):
                seq = first + k
                if seq <= self.heard:
                    continue  # a duplicate
                self.heard = seq
                self.handed += 1
                handed += 1
                self.on_record(seq, payload)
        # step 4, per packet: an answer with no room for what waits
        if answered and not handed and self.node_last is not None and self.node_last > self.heard:
            self.hold_until = now + self._base_rto()
            self.holds += 1


# ---------------------------------------------------------------- I/O

def resolve(to):
    host, _, port = to.rpartition(":")
    host = host.strip("[]")
    infos = socket.getaddrinfo(host, int(port), 0, socket.SOCK_DGRAM)
    return infos[0][0], infos[0][4]


def make_socket(family, addr):
    s = socket.socket(family, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    except OSError:
        pass
    s.connect(addr)  # only the node's address is heard (§4.2: a sender knows its run by the address it sends to)
    s.setblocking(False)
    return s


def send_all(sock, dgrams):
    for d in dgrams:
        try:
            sock.send(d)
        except (BlockingIOError, InterruptedError):
            return False  # like a loss: go-back-N resends
        except ConnectionRefusedError:
            pass  # ICMP port unreachable from an earlier datagram (node down): keep trying
    return True


def recv_all(sock):
    out = []
    while True:
        try:
            out.append(sock.recv(2048))
        except (BlockingIOError, InterruptedError):
            return out
        except ConnectionRefusedError:
            continue


def deliver_one(args):
    priv = load_private_key(args.key)
    node_pub = b64key(args.node)
    family, addr = resolve(args.to)
    payloads = sys.stdin.buffer.read().split(b"\n")
    if payloads and payloads[-1] == b"":
        payloads.pop()  # the text after the last newline, when empty, is not a line
    progress = args.progress

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    run = Run(priv, node_pub)
    run.use_cookies = not args.no_cookies
    d = Delivery(run, args.app, payloads, start=args.start, window=args.window, datagram=args.datagram_size,
                 timeout=args.timeout, log=log)
    sock = make_socket(family, addr)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    last_reported = None
    epochs = 0
    while d.active:
        now = time.monotonic()
        d.tick(now)
        if not d.active:
            break
        send_all(sock, d.packets(now))
        t = d.next_timer()
        wait = 0.05 if t is None else max(0.0, min(t - now, 0.05))
        if d.has_sendable():
            wait = 0
        if sel.select(wait):
            now = time.monotonic()
            for dgram in recv_all(sock):
                d.receive(dgram, now)
        if run.epochs_seen != epochs:
            if epochs:
                log("node epoch changed to %s (node restarted)" % run.epoch.hex())
            epochs = run.epochs_seen
        if progress and d.acked is not None and d.acked != last_reported:
            last_reported = d.acked
            log("acked %d" % d.acked)
    sock.close()
    if run.cookies_received:
        log("the node was under load: it asked for a cookie %d time(s) (§4.4)" % run.cookies_received)
    elapsed = time.monotonic() - d.started
    if d.failed:
        print(d.error, file=sys.stderr)
        return 3 if d.refused is not None else 1
    app = d.app.decode()
    if d.counter_behind:
        # §7 says to continue from a + 1; it does not say what became of the records we had numbered <= a.
        # The node dropped them as duplicates of records it already held, so they are NOT stored.
        print("not all stored: we numbered from %d but the node already held %s through %d; our records numbered "
              "at or below %d were dropped as duplicates (our counter was behind the node)"
              % (d.first_seq, app, d.acked, d.acked), file=sys.stderr)
        return 4
    if d.renumbered:
        # §7.3: the node's heard sequence was below our start (e.g. it lost its store, or --start was too far):
        # our records were renumbered to follow it, and are stored under those numbers.
        print("warning: the node held %s below our start; our records were renumbered and stored as %d-%d"
              % (app, d.first_seq, d.last_seq), file=sys.stderr)
    if d.total:
        print("stored %d records for app %s (seq %d-%d) in %.2f s" % (d.total, app, d.first_seq, d.last_seq, elapsed))
    else:
        print("stored 0 records for app %s (node holds through %d) in %.2f s" % (app, d.acked, elapsed))
    return 0


def read_heard_file(path, default):
    """One decimal number and a newline; a missing file is `default`."""
    try:
        with open(path, "r", encoding="ascii") as f:
            text = f.read()
    except FileNotFoundError:
        return default
    try:
        value = int(text.strip())
        if value < 0 or value >= 1 << 64:
            raise ValueError
    except ValueError:
        raise ValueError("%s does not hold a downlink heard sequence (one decimal number)" % path)
    return value


def write_heard_file(path, heard):
    """Replaced whole: a temporary file, synced, renamed over it, and the directory synced."""
    tmp = "%s.tmp%d" % (path, os.getpid())
    with open(tmp, "w", encoding="ascii") as f:
        f.write("%d\n" % heard)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def listen_one(args, payloads):
    """--listen APP: ask for APP's downlink records, print each on stdout (its bytes and a newline), once and in
    order; keep `heard` in --heard-file. Lines of stdin, if any, are delivered as records in the same run. Status
    goes to stderr. Exit: 0 all handed over and acknowledged (and the data stored); 1 gave up or the node has no
    downlink (§12.6); 3 refused."""
    priv = load_private_key(args.key)
    node_pub = b64key(args.node)
    family, addr = resolve(args.to)
    out = sys.stdout.buffer

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    heard = args.heard
    if args.heard_file:
        heard = read_heard_file(args.heard_file, args.heard)
    run = Run(priv, node_pub)
    run.use_cookies = not args.no_cookies
    printed = []

    def on_record(seq, payload):
        out.write(payload + b"\n")
        printed.append(seq)

    verbose = log if args.verbose else None
    lst = Listen(run, args.listen, heard, room=args.room, log=log if args.verbose else None, on_record=on_record)
    d = None
    if payloads:
        d = Delivery(run, args.app, payloads, start=args.start, window=args.window, datagram=args.datagram_size,
                     timeout=args.timeout, log=verbose)
    sock = make_socket(family, addr)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    started = time.monotonic()
    last_heard = started  # last authenticated node packet
    stay_until = None
    next_ask = None
    epochs = 0
    rc = 0
    log("listening on %s from heard %d" % (lst.app.decode(), heard))
    while True:
        now = time.monotonic()
        if d is not None:
            d.tick(now)
            if d.failed:
                log(d.error)
                rc = 3 if d.refused is not None else 1
                break
        lst.data_acked = d is None or d.done
        lst.tick(now)
        if lst.refused is not None:
            log("node refused app %s: reason %d (%s)" % (lst.app.decode(), lst.refused,
                                                       REFUSE_REASONS.get(lst.refused, "unknown reason")))
            rc = 3
            break
        if lst.unanswered:
            log("DownlinkUnanswered: the node has no downlink for app %s (LISTEN unanswered)" % lst.app.decode())
            rc = 1
            break
        caught_up = lst.done and (d is None or d.done)
        if caught_up and stay_until is None:
            if not args.stay:
                break
            stay_until = now + args.stay
            next_ask = now + args.ask_every
            log("caught up at heard %d; staying %.1f s" % (lst.heard, args.stay))
        if stay_until is not None:
            if now >= stay_until and caught_up:
                break
            if now >= next_ask:
                lst.ask_now()
                next_ask = now + args.ask_every
        elif args.timeout and now - last_heard > args.timeout:
            log("gave up: the node was silent for %.1f s" % args.timeout)
            rc = 1
            break
        dgrams = []
        if d is not None and d.active:
            dgrams += d.packets(now)
        dgrams += lst.packets(now)
        send_all(sock, dgrams)
        timers = [t for t in (lst.next_timer(), d.next_timer() if d is not None else None, stay_until, next_ask)
                  if t is not None]
        wait = max(0.0, min(min(timers) - now, 0.05)) if timers else 0.05
        if lst.has_sendable(now) or (d is not None and d.has_sendable()):
            wait = 0
        if sel.select(wait):
            now = time.monotonic()
            for dgram in recv_all(sock):
                if dgram and dgram[0] == TYPE_COOKIE:
                    resend = run.take_cookie(dgram, now)
                    if resend and d is not None and d.active:
                        d.cursor = 0
                        if d.probe_in_flight:
                            d.probe_in_flight = False
                            d.probe_pending = True
                    lst.cookie(bool(resend))
                    continue
                opened = run.open(dgram)
                if opened is None:
                    continue
                last_heard = now
                if d is not None:
                    d.handle(opened, now)
                lst.handle(opened, now)
        if printed:
            try:
                out.flush()
            except BrokenPipeError:
                log("standard output was closed")
                rc = 1
                break
            if args.heard_file:
                write_heard_file(args.heard_file, lst.heard)  # after the records are printed and flushed
            for seq in printed:
                log("record %d" % seq)
            del printed[:]
        if run.epochs_seen != epochs:
            if epochs:
                log("node epoch changed to %s (node restarted)" % run.epoch.hex())
            epochs = run.epochs_seen
    sock.close()
    if d is not None and d.done and d.total:
        log("stored %d records for app %s (seq %d-%d)" % (d.total, d.app.decode(), d.first_seq, d.last_seq))
    log("heard %d: %d records handed over, %d LISTEN sent (%d RTO resends, %d holds)"
        % (lst.heard, lst.handed, lst.listens_sent, lst.resends, lst.holds))
    return rc


# ---------------------------------------------------------------- load mode

def make_load_keys(n, senders_out, keys_out, prefix):
    keys = []
    with open(senders_out, "w") as sf, open(os.open(keys_out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                                           "w") as kf:
        for i in range(n):
            priv = X25519PrivateKey.generate()
            name = "%s%07d" % (prefix, i)
            sf.write("%s %s\n" % (name, b64(raw_public(priv))))
            kf.write("%s %s\n" % (name, b64(raw_private(priv))))
            keys.append((name, priv))
    return keys


def read_load_keys(path):
    keys = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                name, k = line.split()
                keys.append((name, X25519PrivateKey.from_private_bytes(b64key(k))))
    return keys


def load_payload(name, i):
    return ("%s record %d" % (name, i)).encode()


class SocketGroup:
    """One UDP socket carrying many runs. A node packet names no run (§4.2), so a reply is matched by trying
    the runs' k_n2s: first those that sent most long ago and are still waiting, then the rest."""

    def __init__(self, sock):
        self.sock = sock
        self.waiting = collections.OrderedDict()  # delivery -> None, oldest sender first
        self.members = []
        self.trials = 0
        self.unmatched = 0

    def sent(self, d):
        self.waiting.pop(d, None)
        self.waiting[d] = None

    def dispatch(self, dgram, now):
        if dgram and dgram[0] == TYPE_COOKIE:
            # §4.4: a COOKIE names its run (key id, run id) in clear: no trial decryption.
            for d in self.members:
                if d.cookie(dgram, now):
                    return d
            self.unmatched += 1
            return None
        for d in list(self.waiting):
            self.trials += 1
            opened = d.run.open(dgram)
            if opened is not None:
                d.handle(opened, now)
                self.waiting.pop(d, None)
                if d.in_flight():
                    self.waiting[d] = None
                return d
        for d in self.members:
            if d in self.waiting:
                continue
            self.trials += 1
            opened = d.run.open(dgram)
            if opened is not None:
                d.handle(opened, now)
                return d
        self.unmatched += 1
        return None


def node_metrics(url):
    """A few gauges of the node's /metrics (not part of the wire protocol), or None."""
    if not url:
        return None
    import urllib.request
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError as e:
        return {"error": str(e)}
    want = ("process_resident_memory_bytes", "pure_sessions_active", "pure_senders", "pure_x25519_total")
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in want:
            out[parts[0]] = float(parts[1])
    return out


def run_load(args):
    if args.keys_in:
        keys = read_load_keys(args.keys_in)[:args.load]
        if len(keys) < args.load:
            raise SystemExit("%s holds %d keys, fewer than --load %d" % (args.keys_in, len(keys), args.load))
    else:
        if not args.senders_out:
            raise SystemExit("--load needs --senders-out FILE (to make keys) or --keys-in FILE (to use them)")
        keys_out = args.keys_out or args.senders_out + ".keys"
        t0 = time.monotonic()
        keys = make_load_keys(args.load, args.senders_out, keys_out, args.name_prefix)
        print("wrote %d senders to %s and their private keys to %s in %.1f s"
              % (len(keys), args.senders_out, keys_out, time.monotonic() - t0), file=sys.stderr)
        if not args.to:
            return 0
    if not (args.to and args.node):
        raise SystemExit("delivering needs --node and --to")
    node_pub = b64key(args.node)
    family, addr = resolve(args.to)
    before = node_metrics(args.metrics_url)
    nsock = max(1, min(args.sockets, len(keys)))
    groups = [SocketGroup(make_socket(family, addr)) for _ in range(nsock)]
    sel = selectors.DefaultSelector()
    for g in groups:
        sel.register(g.sock, selectors.EVENT_READ, g)
    t0 = time.monotonic()
    pending = collections.deque()
    for i, (name, priv) in enumerate(keys):
        pending.append((i, name, priv))
    active = []
    finished = []
    latencies = []
    while pending or active:
        now = time.monotonic()
        while pending and len(active) < args.concurrency:
            i, name, priv = pending.popleft()
            payloads = [load_payload(name, k) for k in range(1, args.records + 1)]
            run = Run(priv, node_pub)
            run.use_cookies = not args.no_cookies
            d = Delivery(run, args.app, payloads, start=args.start, window=args.window,
                         datagram=args.datagram_size, timeout=args.timeout, now=now)
            d.name = name
            g = groups[i % nsock]
            g.members.append(d)
            d.group = g
            active.append(d)
        for d in active:
            d.tick(now)
            if d.active:
                dg = d.packets(now, limit=8)
                if dg:
                    send_all(d.group.sock, dg)
                    d.group.sent(d)
        still = []
        for d in active:
            if d.active:
                still.append(d)
            else:
                finished.append(d)
                d.group.members.remove(d)
                d.group.waiting.pop(d, None)
                if d.done:
                    latencies.append((d.finished or now) - d.started)
        active = still
        if not active and not pending:
            break
        timers = [t for t in (d.next_timer() for d in active) if t is not None]
        wait = max(0.0, min(min(timers) - now, 0.05)) if timers else 0.05
        for key, _ in sel.select(wait):
            g = key.data
            now = time.monotonic()
            for dgram in recv_all(g.sock):
                g.dispatch(dgram, now)
    elapsed = time.monotonic() - t0
    ok = [d for d in finished if d.done]
    bad = [d for d in finished if not d.done]
    latencies.sort()
    summary = {
        "senders": len(keys), "records_per_sender": args.records, "sockets": nsock,
        "delivered_senders": len(ok), "failed_senders": len(bad),
        "records_stored": sum(d.total for d in ok), "seconds": round(elapsed, 3),
        "records_per_second": round(sum(d.total for d in ok) / elapsed, 1) if elapsed else None,
        "packets_sent": sum(d.packets_sent for d in finished),
        "go_back_rounds": sum(d.retransmits for d in finished),
        "decrypt_trials": sum(g.trials for g in groups), "unmatched_replies": sum(g.unmatched for g in groups),
        "cookies_received": sum(d.run.cookies_received for d in finished),
        "delivery_seconds_p50": round(latencies[len(latencies) // 2], 4) if latencies else None,
        "delivery_seconds_p99": round(latencies[int(len(latencies) * 0.99)], 4) if latencies else None,
    }
    if args.metrics_url:
        after = node_metrics(args.metrics_url)
        summary["node_before"], summary["node_after"] = before, after
    print(json.dumps(summary))
    for d in bad[:10]:
        print("%s: %s" % (d.name, d.error), file=sys.stderr)
    return 0 if not bad else 1


# ---------------------------------------------------------------- CLI

def main(argv=None):
    p = argparse.ArgumentParser(description="A pure-serve sender (link protocol v1) written from docs/protocol.md. "
                                "Each line of standard input is one record; exits 0 only when the node has "
                                "stored every record.")
    p.add_argument("--key", help="this sender's private key file (base64 of 32 bytes, one line)")
    p.add_argument("--node", help="the node's public key (base64)")
    p.add_argument("--to", help="the node's link address HOST:PORT")
    p.add_argument("--app", default="main", help="the app to deliver to (default main)")
    p.add_argument("--start", type=int, default=None,
                   help="known start sequence: data in the first packet, no probe (default: probe first)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="give up after this many seconds without progress (0 = never; default 60)")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="records in flight at most (default 16384)")
    p.add_argument("--datagram-size", type=int, default=DEFAULT_DATAGRAM,
                   help="datagram size to fill to (96-1472, default 1200)")
    p.add_argument("--progress", action="store_true", help="print 'acked N' on stderr whenever the ack moves")
    p.add_argument("--no-cookies", action="store_true",
                   help="ignore COOKIE packets, as a sender written before §4.4 would (for tests)")
    g = p.add_argument_group("downlink (§12, version 1.1)")
    g.add_argument("--listen", metavar="APP", help="ask for APP's downlink records and print each on stdout, its "
                   "bytes and a newline, once and in order (status goes to stderr)")
    g.add_argument("--heard", type=int, default=0, metavar="N",
                   help="the downlink heard sequence to start from (default 0; a --heard-file overrides it)")
    g.add_argument("--heard-file", metavar="FILE", help="keep the downlink heard sequence in FILE between runs")
    g.add_argument("--stay", type=float, default=0.0, metavar="SECONDS",
                   help="once caught up, stay awake this long, printing records pushed meanwhile")
    g.add_argument("--ask-every", type=float, default=10.0, metavar="SECONDS",
                   help="while staying, send LISTEN again this often (default 10)")
    g.add_argument("--room", type=int, default=DEFAULT_DATAGRAM, metavar="BYTES",
                   help="pad LISTEN packets to this size: the room for the answer (96-1472, default 1200)")
    g.add_argument("--verbose", action="store_true", help="log every LISTEN sent on stderr")
    g = p.add_argument_group("load mode")
    g.add_argument("--load", type=int, metavar="N_SENDERS", help="use N senders with fresh (or --keys-in) keys")
    g.add_argument("--records", type=int, default=10, metavar="M", help="records per sender in load mode")
    g.add_argument("--senders-out", help="write the senders-file lines of the new keys here")
    g.add_argument("--keys-out", help="write the new private keys here (NAME KEY per line; default SENDERS_OUT.keys)")
    g.add_argument("--keys-in", help="use the keys of this file (written by --keys-out) instead of new ones")
    g.add_argument("--name-prefix", default="load-", help="sender names are PREFIX + a 7-digit number")
    g.add_argument("--sockets", type=int, default=1, help="UDP sockets to spread the senders over (default 1)")
    g.add_argument("--concurrency", type=int, default=64,
                   help="senders delivering at once (default 64); a reply costs about concurrency/sockets/2 "
                        "trial decryptions, since a node packet names no run")
    g.add_argument("--metrics-url", help="the node's /metrics URL: report its resident memory and active sessions "
                   "before and after")
    args = p.parse_args(argv)
    if not MIN_DATAGRAM <= args.datagram_size <= MAX_DATAGRAM:
        p.error("--datagram-size must be 96-1472 (§4)")
    try:
        if args.load is not None:
            return run_load(args)
        if not (args.key and args.node and args.to):
            p.error("--key, --node and --to are needed (or --load)")
        if args.listen:
            if not MIN_DATAGRAM <= args.room <= MAX_DATAGRAM:
                p.error("--room must be 96-1472")
            payloads = [] if sys.stdin.isatty() else sys.stdin.buffer.read().split(b"\n")
            if payloads and payloads[-1] == b"":
                payloads.pop()
            return listen_one(args, payloads)
        return deliver_one(args)
    except (ValueError, OSError) as e:
        print("error: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
