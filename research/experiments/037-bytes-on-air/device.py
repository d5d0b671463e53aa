#!/usr/bin/env python3
"""A device with a known start, written from docs/protocol.md alone (sections 2-5, 7.5).

One wake: a fresh run (new run id, packet numbers from 0), the records of standard input (one line each, without
its newline) sent from the flow's kept next sequence in as few datagrams as the datagram size allows, then wait
for the stored ack that covers them all; the next sequence is kept in --seq-file (as a device keeps it in flash).
Padding as the Rust sender does it (7.5): at least 96 B, and a datagram within 1/16 of the datagram size padded
to exactly that size. Prints one JSON line: what it sent and what it predicts for each datagram and ack.
Resends are not implemented: a loss makes it exit 1 (the capture would show it anyway).
"""
import argparse, base64, json, os, socket, sys, time
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand
from cryptography.hazmat.primitives import hashes, hmac, serialization
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F; n >>= 7
        if n: out.append(b | 0x80)
        else: out.append(b); return bytes(out)

def read_varint(buf, i):
    n = shift = 0
    while True:
        b = buf[i]; i += 1
        n |= (b & 0x7F) << shift; shift += 7
        if not b & 0x80: return n, i

def hkdf_extract(salt, ikm):
    h = hmac.HMAC(salt, hashes.SHA256()); h.update(ikm); return h.finalize()

def expand(prk, info):
    return HKDFExpand(hashes.SHA256(), 16, info).derive(prk)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--key", required=True); ap.add_argument("--node", required=True)
    ap.add_argument("--to", required=True); ap.add_argument("--app", default="main")
    ap.add_argument("--seq-file", required=True); ap.add_argument("--datagram", type=int, default=1200)
    a = ap.parse_args()
    raw = base64.b64decode(open(a.key).read().strip())
    sk = X25519PrivateKey.from_private_bytes(raw)
    s_pub = sk.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    n_pub = base64.b64decode(a.node)
    shared = sk.exchange(X25519PublicKey.from_public_bytes(n_pub))
    prk = hkdf_extract(b"pure-serve link v1", shared)
    run_id = os.urandom(8)
    k_s2n = AESGCM(expand(prk, b"s2n" + run_id + s_pub + n_pub))
    app = a.app.encode()
    records = [l.rstrip(b"\n") for l in sys.stdin.buffer]
    seq = int(open(a.seq_file).read()) if os.path.exists(a.seq_file) else 1
    D = a.datagram
    datagrams, pn, i = [], 0, 0
    while i < len(records):
        first = seq + i
        # fill: header 21 + tag 16 + frame header + records
        body = bytearray()
        count = 0
        while i + count < len(records):
            r = records[i + count]
            rec = varint(len(r)) + r
            fh = 1 + 1 + len(app) + len(varint(first)) + len(varint(count + 1))
            if 21 + 16 + fh + len(body) + len(rec) > D:
                break
            body += rec; count += 1
        assert count > 0, "record too large"
        frames = bytes([1, len(app)]) + app + varint(first) + varint(count) + bytes(body)
        size = 21 + len(frames) + 16
        target = max(96, size)
        if size >= D - D // 16:
            target = D
        frames += b"\x00" * (target - size)
        header = bytes([0x11]) + s_pub[:4] + run_id + pn.to_bytes(8, "big")
        nonce = b"\x00" * 4 + pn.to_bytes(8, "big")
        pkt = header + k_s2n.encrypt(nonce, frames, header)
        assert len(pkt) == target
        datagrams.append((pkt, first, count, size))
        pn += 1; i += count
    last = seq + len(records) - 1
    host, port = a.to.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((host, int(port)))
    t0 = time.monotonic()
    for pkt, *_ in datagrams:
        s.send(pkt)
    s.settimeout(5)
    acks = []
    stored = 0
    k_cache = {}
    while stored < last:
        d = s.recv(2048)
        assert d[0] == 0x12, d[:1]
        epoch = d[1:9]
        if epoch not in k_cache:
            k_cache[epoch] = AESGCM(expand(prk, b"n2s" + run_id + epoch + s_pub + n_pub))
        pt = k_cache[epoch].decrypt(b"\x00" * 4 + d[9:17], d[17:], d[:17])
        j = 0; echo = None
        while j < len(pt):
            t = pt[j]; j += 1
            if t == 0: continue
            if t == 3: echo, j = read_varint(pt, j)
            elif t in (2, 4, 6):
                l = pt[j]; name = pt[j+1:j+1+l]; j += 1 + l
                if t == 2:
                    st, j = read_varint(pt, j)
                    if name == app: stored = max(stored, st)
                else:
                    raise SystemExit(f"node refused/not stored: frame {t} reason {pt[j]}")
            else:
                raise SystemExit(f"unexpected frame {t}")
        acks.append({"bytes": len(d), "echo": echo, "stored_through": stored,
                     "predicted": 17 + 1 + len(varint(echo)) + 2 + len(app) + len(varint(stored)) + 16})
    rtt = time.monotonic() - t0
    open(a.seq_file, "w").write(str(last + 1))
    print(json.dumps({"first_seq": seq, "last_seq": last, "records": len(records),
                      "datagrams": [{"bytes": len(p), "first_seq": f, "count": c, "unpadded": u}
                                    for p, f, c, u in datagrams],
                      "acks": acks, "wake_ms": round(rtt * 1000, 3)}))

if __name__ == "__main__":
    main()
