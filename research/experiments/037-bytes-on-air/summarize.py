#!/usr/bin/env python3
"""Cuts capture.pcap (tcpdump on the host side of the veth pair) into wakes by wakes.jsonl's times, counts per
wake the IP bytes (IP total length: IP and UDP/TCP headers included, no link-layer framing) and packets each way,
TCP's SYN/FIN/pure ACKs and header bytes, TLS record types, and checks the link device's datagrams and acks
against its own prediction from docs/protocol.md. Writes results.jsonl (one line per counted wake) and prints the
table of medians (markdown). Usage: summarize.py WORKDIR OUTDIR"""
import json, statistics, struct, sys
from collections import defaultdict

work, out = sys.argv[1], sys.argv[2]
DEV = "10.237.0.2"
SUITES = {"1301": "TLS1.3 TLS_AES_128_GCM_SHA256", "1302": "TLS1.3 TLS_AES_256_GCM_SHA384",
          "1303": "TLS1.3 TLS_CHACHA20_POLY1305_SHA256", "c02b": "TLS1.2 ECDHE-ECDSA-AES128-GCM-SHA256",
          "c02f": "TLS1.2 ECDHE-RSA-AES128-GCM-SHA256"}

def packets(path):
    f = open(path, "rb"); gh = f.read(24)
    magic, = struct.unpack("<I", gh[:4]); assert magic in (0xA1B2C3D4, 0xA1B23C4D), hex(magic)
    nano = magic == 0xA1B23C4D
    linktype, = struct.unpack("<I", gh[20:24]); assert linktype == 1, linktype  # Ethernet (veth)
    while True:
        h = f.read(16)
        if len(h) < 16: return
        sec, frac, incl, orig = struct.unpack("<IIII", h)
        d = f.read(incl)
        ts = sec + frac / (1e9 if nano else 1e6)
        if d[12:14] != b"\x08\x00": continue  # IPv4 only (IPv6 is off on the pair)
        ip = d[14:]
        ihl = (ip[0] & 15) * 4; tot, = struct.unpack(">H", ip[2:4]); proto = ip[9]
        src = ".".join(map(str, ip[12:16])); dst = ".".join(map(str, ip[16:20]))
        l4 = ip[ihl:tot]
        sport, dport = struct.unpack(">HH", l4[:4])
        p = {"ts": ts, "len": tot, "proto": proto, "up": src == DEV, "sport": sport, "dport": dport, "iphdr": ihl}
        if proto == 6:
            doff = (l4[12] >> 4) * 4; fl = l4[13]
            p.update(tcphdr=doff, flags=fl, seq=struct.unpack(">I", l4[4:8])[0], payload=l4[doff:])
        elif proto == 17:
            p.update(payload=l4[8:])
        yield p

def tls_records(stream):
    i, recs = 0, []
    while i + 5 <= len(stream):
        t = stream[i]; n, = struct.unpack(">H", stream[i+3:i+5])
        recs.append((t, 5 + n, stream[i+5:i+5+n])); i += 5 + n
    return recs

wakes = [json.loads(l) for l in open(f"{work}/wakes.jsonl")]
pk = list(packets(f"{work}/capture.pcap"))
results = []
unassigned = 0
for w in wakes:
    ps = [p for p in pk if w["t0"] <= p["ts"] <= w["t1"]]
    w["_n"] = len(ps)
    if not w["counted"]: continue
    up = [p for p in ps if p["up"]]; down = [p for p in ps if not p["up"]]
    r = {k: w[k] for k in ("setting", "payload", "per_wake", "rep", "rc")}
    r.update(bytes_up=sum(p["len"] for p in up), bytes_down=sum(p["len"] for p in down),
             packets_up=len(up), packets_down=len(down),
             client_ports=sorted({p["sport"] if p["up"] else p["dport"] for p in ps}))
    r["bytes"] = r["bytes_up"] + r["bytes_down"]; r["packets"] = r["packets_up"] + r["packets_down"]
    r["bytes_per_record"] = round(r["bytes"] / w["per_wake"], 1)
    r["sizes_up"] = [p["len"] for p in up]; r["sizes_down"] = [p["len"] for p in down]
    if ps and ps[0]["proto"] == 6:
        r["tcp"] = {
            "syn": sum(1 for p in ps if p["flags"] & 2), "fin": sum(1 for p in ps if p["flags"] & 1),
            "rst": sum(1 for p in ps if p["flags"] & 4),
            "pure_acks": sum(1 for p in ps if not p["payload"] and not p["flags"] & 7),
            "ip_tcp_header_bytes": sum(p["iphdr"] + p["tcphdr"] for p in ps),
            "payload_bytes_up": sum(len(p["payload"]) for p in up),
            "payload_bytes_down": sum(len(p["payload"]) for p in down)}
        if w["setting"] != "mqtt-plain":
            tls = {}
            for dirname, side in (("up", up), ("down", down)):
                seen, stream = set(), b""
                for p in sorted(side, key=lambda p: p["ts"]):
                    if p["payload"] and p["seq"] not in seen:
                        seen.add(p["seq"]); stream += p["payload"]
                recs = tls_records(stream)
                names = {20: "ccs", 21: "alert", 22: "handshake", 23: "app"}
                agg = defaultdict(lambda: [0, 0])
                for t, n, body in recs:
                    agg[names.get(t, str(t))][0] += 1; agg[names.get(t, str(t))][1] += n
                tls[dirname] = {k: {"records": v[0], "bytes": v[1]} for k, v in agg.items()}
                if dirname == "down" and recs and recs[0][0] == 22 and recs[0][2][0] == 2:
                    sh = recs[0][2]; sidl = sh[38]; cs = sh[39 + sidl:41 + sidl]
                    tls["server_hello_cipher"] = SUITES.get(cs.hex(), cs.hex())
            r["tls"] = tls
    if w["setting"].startswith("mqtt-py"):
        r.update(tls_version=w.get("tls"), cipher=w.get("cipher"), resumed=w.get("resumed"))
    if w["setting"] == "link-device" and "device" in w:
        d = w["device"]
        pred_up = [x["bytes"] for x in d["datagrams"]]
        pred_down = [a["predicted"] for a in d["acks"]]
        r["predicted_sizes_up_udp_payload"] = pred_up; r["predicted_sizes_down_udp_payload"] = pred_down
        r["agrees_with_protocol_md"] = ([s - 28 for s in r["sizes_up"]] == pred_up and
                                        [s - 28 for s in r["sizes_down"]] == pred_down and
                                        all(a["bytes"] == a["predicted"] for a in d["acks"]))
        r["padding_bytes"] = sum(x["bytes"] - x["unpadded"] for x in d["datagrams"])
    results.append(r)

assigned = sum(w["_n"] for w in wakes)
print(f"packets in capture: {len(pk)}, in wake windows: {assigned}", file=sys.stderr)
with open(f"{out}/results.jsonl", "w") as f:
    for r in results: f.write(json.dumps(r) + "\n")

cells = defaultdict(list)
for r in results: cells[(r["setting"], r["payload"], r["per_wake"])].append(r)
print("| setting | payload | records/wake | bytes/wake up+down (median) | spread | packets up/down (median) | packets spread | bytes/record | suite | wakes |")
print("|---|---:|---:|---:|---|---:|---|---:|---|---:|")
for (s, size, n), rs in cells.items():
    b = [r["bytes"] for r in rs]
    pu = statistics.median(r["packets_up"] for r in rs); pd = statistics.median(r["packets_down"] for r in rs)
    bu = statistics.median(r["bytes_up"] for r in rs); bd = statistics.median(r["bytes_down"] for r in rs)
    spread = "identical" if len(set(b)) == 1 else f"{min(b)}–{max(b)}"
    pk_ = [r["packets"] for r in rs]
    pspread = "identical" if len(set(pk_)) == 1 else f"{min(pk_)}–{max(pk_)}"
    suites = sorted({r.get("tls", {}).get("server_hello_cipher", "-") for r in rs})
    res = [r.get("resumed") for r in rs if r.get("resumed") is not None]
    suite = "/".join(suites) + (" resumed " + str(sum(res)) + "/" + str(len(res)) if "resumed" in s else "")
    print(f"| {s} | {size} | {n} | {statistics.median(b):.0f} ({bu:.0f}+{bd:.0f}) | {spread} | {pu:.0f}/{pd:.0f} | "
          f"{pspread} | {statistics.median(b)/n:.1f} | {suite} | {len(rs)} |")
