#!/bin/bash
# research/037: bytes on the air per record, our link against MQTT (mosquitto) over TLS, 1/10/100 records a wake.
# Needs root, apt packages mosquitto mosquitto-clients tcpdump ethtool openssl, python3-cryptography.
# Makes a network namespace air37 joined by a veth pair (10.237.0.1 host side, 10.237.0.2 the device side,
# MTU 1500, offloads off, IPv6 off), runs the node and mosquitto on the host side, every wake in the namespace,
# tcpdump on the host side of the pair; removes the namespace at the end. Usage: run.sh  (REPS=5 by default)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export B=${B:-/work/bin-snapshot/pure-serve}
W=${W:-/tmp/air37-run}
export REPS=${REPS:-5}
rm -rf "$W"; mkdir -p "$W"/keys "$W"/ec "$W"/rsa; cd "$W"

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; sleep 0.3; ip netns del air37 2>/dev/null || true; }
trap cleanup EXIT

# --- the pair: a 1500-byte link on which every packet captured is one a link would carry
ip netns del air37 2>/dev/null || true
ip netns add air37
ip link add air37h type veth peer name air37n
ip link set air37n netns air37
sysctl -qw net.ipv6.conf.air37h.disable_ipv6=1
ip netns exec air37 sysctl -qw net.ipv6.conf.all.disable_ipv6=1
ip addr add 10.237.0.1/30 dev air37h; ip link set air37h mtu 1500 up
ip netns exec air37 ip addr add 10.237.0.2/30 dev air37n
ip netns exec air37 ip link set air37n mtu 1500 up
ip netns exec air37 ip link set lo up
ethtool -K air37h tso off gso off gro off tx off >/dev/null 2>&1
ip netns exec air37 ethtool -K air37n tso off gso off gro off tx off >/dev/null 2>&1

# --- certificates made now: ECDSA P-256 and RSA-2048, a CA and a server certificate each (the server sends its own)
for kind in ec rsa; do
  if [ $kind = ec ]; then KA=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1); else KA=(-newkey rsa:2048); fi
  openssl req -x509 "${KA[@]}" -nodes -keyout $kind/ca.key -out $kind/ca.pem -days 30 -sha256 -subj /CN=air37-ca-$kind 2>/dev/null
  openssl req "${KA[@]}" -nodes -keyout $kind/server.key -out $kind/server.csr -subj /CN=10.237.0.1 2>/dev/null
  openssl x509 -req -in $kind/server.csr -CA $kind/ca.pem -CAkey $kind/ca.key -CAcreateserial -days 30 -sha256 \
    -extfile <(printf 'subjectAltName=IP:10.237.0.1\n') -out $kind/server.pem 2>/dev/null
  echo "{\"cert\":\"$kind\",\"server_cert_der_bytes\":$(openssl x509 -in $kind/server.pem -outform der | wc -c),\"ca_der_bytes\":$(openssl x509 -in $kind/ca.pem -outform der | wc -c)}" >> certs.jsonl
done

# --- mosquitto: plain 18883, TLS with the ECDSA chain 18884, with the RSA chain 18885; username and password
head -c 12 /dev/urandom | base64 | tr -d '/+=' > mqtt.password
mosquitto_passwd -c -b passwd dev1 "$(cat mqtt.password)"
cat > mosquitto.conf <<CONF
user root
per_listener_settings false
allow_anonymous false
password_file $W/passwd
persistence false
log_dest file $W/mosquitto.log
listener 18883 10.237.0.1
listener 18884 10.237.0.1
certfile $W/ec/server.pem
keyfile $W/ec/server.key
listener 18885 10.237.0.1
certfile $W/rsa/server.pem
keyfile $W/rsa/server.key
CONF
mosquitto -c mosquitto.conf & PIDS+=($!)

# --- the node and one fresh device key per cell
for s in 16 64; do for n in 1 10 100; do for v in d s; do
  echo "$v-$s-$n $("$B" keygen --out keys/$v-$s-$n.key 2>/dev/null | tail -1)" >> senders
done; done; done
"$B" --state state --senders senders --bind 10.237.0.1 --link-port 17380 --http-port 17381 \
  --metrics-listen 127.0.0.1:17382 --push-socket none > node.out 2> node.err & PIDS+=($!)
for i in $(seq 50); do grep -q '^ready' node.out 2>/dev/null && break; sleep 0.1; done
export NODE_PUB=$(sed -n 's/^public key: //p' node.out)

# --- payloads: 100 lines of each size, letters and digits (the same lines for every setting)
for s in 16 64; do python3 -c "
import random; random.seed($s); a='abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789'
print('\n'.join(''.join(random.choice(a) for _ in range($s)) for _ in range(100)))" > payload-$s.txt; done

# --- capture, wakes, summary
tcpdump -i air37h -nn -U -w capture.pcap host 10.237.0.2 2> tcpdump.err & PIDS+=($!)
for i in $(seq 50); do grep -q 'listening' tcpdump.err && break; sleep 0.1; done; sleep 0.5
python3 "$HERE/wakes.py"
sleep 1; kill "${PIDS[2]}"; sleep 0.5
curl -s http://127.0.0.1:17382/metrics | grep -E '^pure_(records_stored|stored)' > node-metrics.txt || true
cp certs.jsonl "$HERE/certs.jsonl"
python3 "$HERE/summarize.py" "$W" "$HERE" | tee "$HERE/table.md"
