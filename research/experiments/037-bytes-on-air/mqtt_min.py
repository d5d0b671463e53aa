#!/usr/bin/env python3
"""A minimal MQTT 3.1.1 client on Python's ssl, for what mosquitto_pub cannot do: TLS session resumption.

One wake per call of wake(): TCP connect, TLS (optionally resuming the session kept from the last wake),
CONNECT (clean session, username and password, keepalive 60), every line of standard input as a PUBLISH QoS 1,
wait for every PUBACK, DISCONNECT, close. Run as a program it does --wakes wakes in one process (the session
is kept in memory between them, as a device keeps it in RAM), reading the payload lines once, and prints one JSON
line per wake with its start and end times (time.time()) so the capture can be cut by them.
"""
import argparse, json, socket, ssl, sys, time

def rl(n):
    out = bytearray()
    while True:
        b = n % 128; n //= 128
        out.append(b | (0x80 if n else 0))
        if not n: return bytes(out)

def s16(b): return len(b).to_bytes(2, "big") + b

def pkt(t, body): return bytes([t]) + rl(len(body)) + body

def read_pkt(sock, buf):
    while True:
        if len(buf) >= 2:
            n = mult = 0; i = 1
            while True:
                b = buf[i]; n += (b & 0x7F) << mult; mult += 7; i += 1
                if not b & 0x80: break
            if len(buf) >= i + n:
                return buf[0], bytes(buf[i:i + n]), buf[i + n:]
        d = sock.recv(65536)
        if not d: raise EOFError
        buf += d

def wake(args, lines, ctx, session):
    raw = socket.create_connection((args.host, args.port))
    s = ctx.wrap_socket(raw, server_hostname=args.host, session=session) if ctx else raw
    flags = 0x80 | 0x40 | 0x02
    s.sendall(pkt(0x10, s16(b"MQTT") + bytes([4, flags]) + (60).to_bytes(2, "big")
                  + s16(args.id.encode()) + s16(args.user.encode()) + s16(args.password.encode())))
    buf = bytearray()
    t, body, buf = read_pkt(s, buf)
    assert t == 0x20 and body[1] == 0, (t, body)
    topic = s16(args.topic.encode())
    out = bytearray()
    for i, l in enumerate(lines):
        out += pkt(0x32, topic + (i + 1).to_bytes(2, "big") + l)
    s.sendall(out)
    acked = 0
    while acked < len(lines):
        t, body, buf = read_pkt(s, buf)
        assert t == 0x40, t
        acked += 1
    s.sendall(pkt(0xE0, b""))
    info = {}
    if ctx:
        info = {"resumed": s.session_reused, "tls": s.version(), "cipher": s.cipher()[0]}
        session = s.session
    s.close()
    return session, info

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host"); ap.add_argument("--port", type=int)
    ap.add_argument("--cafile"); ap.add_argument("--tls-version", default="1.3")
    ap.add_argument("--resume", action="store_true"); ap.add_argument("--wakes", type=int, default=1)
    ap.add_argument("--id", default="dev1"); ap.add_argument("--user", default="dev1")
    ap.add_argument("--password"); ap.add_argument("--topic", default="t/dev1")
    ap.add_argument("--gap", type=float, default=0.4)
    ap.add_argument("--ciphers", help="TLS 1.2 cipher list (OpenSSL names)")
    a = ap.parse_args()
    lines = [l.rstrip(b"\n") for l in sys.stdin.buffer]
    ctx = None
    if a.cafile:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(a.cafile)
        v = ssl.TLSVersion.TLSv1_3 if a.tls_version == "1.3" else ssl.TLSVersion.TLSv1_2
        ctx.minimum_version = ctx.maximum_version = v
        if a.ciphers: ctx.set_ciphers(a.ciphers)
    session = None
    for w in range(a.wakes):
        t0 = time.time()
        new, info = wake(a, lines, ctx, session if a.resume else None)
        time.sleep(a.gap)
        t1 = time.time()
        if a.resume: session = new
        print(json.dumps({"wake": w, "t0": t0, "t1": t1, **info}), flush=True)

if __name__ == "__main__":
    main()
