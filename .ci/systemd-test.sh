#!/usr/bin/env bash
# The unit and the package under a real systemd (issue 18, item 13): boot a minimal Debian 12 (systemd 252 as
# PID 1) in systemd-nspawn, install the .deb built for this host as an operator would (`apt-get install ./….deb`),
# and check what docs/operations.md promises: readiness (Type=notify), reload (good and bad senders files),
# the watchdog (a hung node is killed and restarted), a bad senders or apps file (exit 78, no restart loop,
# `failed`, the error at journal priority warning or above), the start limit for failures a restart may cure,
# stop (clean, nothing lost), `systemd-analyze security` within the documented exposure, and purge (state kept).
#
# Usage: .ci/systemd-test.sh [PACKAGE.deb]
#   Without a package it builds one (`cargo build --release`, `cargo deb --no-build`).
#   PURE_SYSTEMD_ROOTFS=DIR  keep the bootstrapped Debian there and reuse it on later runs (else a temp dir,
#                            removed at exit). Each run boots a fresh copy of it, so runs never see each other.
#   PURE_SYSTEMD_SUITE=NAME  the Debian suite to boot (default bookworm: systemd 252, as on Raspberry Pi OS 12).
#   PURE_SYSTEMD_BOOTSTRAP=mmdebstrap|debootstrap  which tool makes it (default: mmdebstrap if installed).
# Needs root, systemd-nspawn (package systemd-container) and mmdebstrap or debootstrap; without them it says
# "skipped" and why.
# Exit status: 0 when every check passed (or skipped), 1 when any failed.
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE="${PURE_SYSTEMD_SUITE:-bookworm}"
# docs/operations.md, "Hardening": the unit's exposure target.
EXPOSURE_MAX=2.0
T0=$(date +%s.%N)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
say() { echo "systemd: $*"; }

if [ "$(id -u)" != 0 ]; then
    say "skipped — needs root (to bootstrap a Debian and boot it with systemd-nspawn); run it with sudo"
    exit 0
fi
for tool in systemd-nspawn nsenter; do
    if ! command -v "$tool" >/dev/null; then
        say "skipped — no $tool on this machine (apt-get install systemd-container mmdebstrap)"
        exit 0
    fi
done
# mmdebstrap does what debootstrap does with half its CPU (it unpacks each package once, and without a sync per
# file): measured once side by side on a 2-core machine under load, 109 s (31 s of CPU) beside debootstrap's 169 s
# (59 s of CPU). Either will do.
if [ -n "${PURE_SYSTEMD_BOOTSTRAP:-}" ]; then
    BOOTSTRAP="$PURE_SYSTEMD_BOOTSTRAP"
    command -v "$BOOTSTRAP" >/dev/null || { say "FAIL: no $BOOTSTRAP (PURE_SYSTEMD_BOOTSTRAP) on this machine"; exit 1; }
elif command -v mmdebstrap >/dev/null; then
    BOOTSTRAP=mmdebstrap
elif command -v debootstrap >/dev/null; then
    BOOTSTRAP=debootstrap
else
    say "skipped — neither mmdebstrap nor debootstrap on this machine (apt-get install mmdebstrap)"
    exit 0
fi

WORK="$(mktemp -d /var/tmp/pure-systemd.XXXXXX)"
# In memory when there is room (some 450 MB: the Debian and the copy that boots): on a busy disk, copying and
# removing its 10,000 files took 15 and 23 s.
ON_TMPFS=""
if [ "$(awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo)" -gt 3000 ] \
    && mount -t tmpfs -o size=2g,mode=0700 pure-systemd "$WORK" 2>/dev/null; then
    ON_TMPFS=1
fi
NSPAWN_PID=""
cleanup() {
    local t
    t=$(date +%s.%N)
    if [ -n "$NSPAWN_PID" ] && kill -0 "$NSPAWN_PID" 2>/dev/null; then
        # SIGTERM asks the container's systemd for a clean poweroff; SIGKILL if it does not stop in time.
        kill -TERM "$NSPAWN_PID" 2>/dev/null || true
        # Until it has exited: a zombie, our child not yet waited for, still answers kill -0.
        for _ in $(seq 100); do
            [ "$(awk '{print $3}' "/proc/$NSPAWN_PID/stat" 2>/dev/null || echo Z)" = Z ] && break
            sleep 0.1
        done
        kill -KILL "$NSPAWN_PID" 2>/dev/null || true
        wait "$NSPAWN_PID" 2>/dev/null || true
        say "container powered off in $(since "$t") s"
    fi
    if [ -n "$ON_TMPFS" ]; then umount "$WORK" || umount -l "$WORK"; fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP # so that the container is stopped and the temp dir removed then too
# A command that fails outside a check stops the run; say where, so that it is not a silent exit 1.
# (-E: in functions too; checks run their commands in conditions, where a failure is the check's to report.)
set -E
trap 'say "FAIL: line ${BASH_LINENO[0]/#0/$LINENO}: \`$BASH_COMMAND\` exited $?; stopping here (${PASSED:-0} checks passed, ${FAILED:-0} failed before)"' ERR

# ---- the package -----------------------------------------------------------------------------------------------
if [ $# -ge 1 ]; then
    DEB="$1"
else
    say "building the package for this host (cargo build --release, cargo deb --no-build)"
    cargo build --release --bin pure-serve
    command -v cargo-deb >/dev/null || cargo install cargo-deb --version 3.8.0 --locked --quiet
    cargo deb --no-build --output "$WORK/deb" >/dev/null
    DEB="$(ls "$WORK"/deb/*.deb)"
fi
[ -f "$DEB" ] || { say "FAIL: no package at $DEB"; exit 1; }
say "package $(basename "$DEB") ($(since "$T0") s)"

# ---- the Debian to boot: bootstrapped once, from the mirror this machine's apt uses -------------------------
# The mirror: the first Debian archive (not the security one) in the apt sources; the tool's default otherwise.
mirror() {
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        sed -n -e 's/^URIs: *\([^ ]*\).*/\1/p' -e 's/^deb \(\[[^]]*\] \)\{0,1\}\([^ ]*\) .*/\2/p' "$f"
    done | grep -v security | grep '/debian/\{0,1\}$' | head -n 1
}
ROOTFS="${PURE_SYSTEMD_ROOTFS:-$WORK/rootfs}"
if [ -f "$ROOTFS/.pure-serve-rootfs-$SUITE" ]; then
    say "Debian $SUITE from $ROOTFS (built earlier)"
else
    MIRROR="$(mirror || true)"
    say "$BOOTSTRAP Debian $SUITE into $ROOTFS from ${MIRROR:-the default mirror of $BOOTSTRAP}"
    rm -rf "$ROOTFS"
    mkdir -p "$ROOTFS"
    # minbase (the Priority: required packages and apt, nothing more: no procps, no libnss-systemd) and systemd:
    # PID 1, journald, systemctl, systemd-analyze; dbus as on any real host; apt to install the package the way an
    # operator does. What the package needs beyond that it must depend on.
    T=$(date +%s.%N)
    OPTS=(--variant=minbase --include=systemd,systemd-sysv,dbus)
    if [ "$BOOTSTRAP" = mmdebstrap ]; then OPTS+=(--dpkgopt=force-unsafe-io); fi
    # shellcheck disable=SC2086 # no mirror: the tool's default
    if ! "$BOOTSTRAP" "${OPTS[@]}" "$SUITE" "$ROOTFS" $MIRROR >"$WORK/bootstrap.log" 2>&1; then
        tail -n 30 "$WORK/bootstrap.log"
        say "FAIL: $BOOTSTRAP of Debian $SUITE did not succeed (log above)"
        exit 1
    fi
    touch "$ROOTFS/.pure-serve-rootfs-$SUITE"
    say "$BOOTSTRAP done in $(since "$T") s"
fi

# ---- boot it ---------------------------------------------------------------------------------------------------
MACHINE="$WORK/machine"
T_COPY=$(date +%s.%N)
cp -a "$ROOTFS" "$MACHINE"
cp "$DEB" "$MACHINE/root/"
DEB_IN="/root/$(basename "$DEB")"
T_BOOT=$(date +%s.%N)
# --keep-unit --register=no: this host's init need not be systemd (no machined, no scope unit to make);
# --private-network: the node's ports are the container's own, only loopback.
systemd-nspawn -D "$MACHINE" -b --keep-unit --register=no --private-network --console=read-only \
    -M pure-systemd-test >"$WORK/console.log" 2>&1 </dev/null &
NSPAWN_PID=$!
PID1=""
for _ in $(seq 100); do
    PID1="$(cat "/proc/$NSPAWN_PID/task/$NSPAWN_PID/children" 2>/dev/null | awk '{print $1}')" || true
    [ -n "$PID1" ] && [ "$(cat "/proc/$PID1/comm" 2>/dev/null)" = systemd ] && break
    PID1=""
    sleep 0.1
done
if [ -z "$PID1" ]; then
    cat "$WORK/console.log"
    say "FAIL: systemd-nspawn did not start the container's systemd (console above)"
    exit 1
fi
# A command in the container: all its namespaces, its root, and an environment of its own (not this shell's).
inside() { nsenter -t "$PID1" -a -r -w env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 SYSTEMD_PAGER= \
    SYSTEMD_COLORS=0 TERM=dumb "$@"; }
STATE=""
for _ in $(seq 300); do
    STATE="$(inside systemctl is-system-running 2>/dev/null || true)"
    case "$STATE" in running | degraded) break ;; esac
    sleep 0.1
done
case "$STATE" in
    running | degraded) ;;
    *) tail -n 40 "$WORK/console.log"; say "FAIL: the container did not finish booting (state: ${STATE:-none})"; exit 1 ;;
esac
say "booted $(inside systemctl --version | head -n 1) as PID 1 in $(since "$T_BOOT") s (copy $(awk -v a="$T_COPY" -v b="$T_BOOT" 'BEGIN { printf "%.1f", b - a }') s), system $STATE"

# ---- checks ----------------------------------------------------------------------------------------------------
PASSED=0
FAILED=0
ok() { PASSED=$((PASSED + 1)); say "ok   $*"; }
# A failure says what was expected and shows what systemd and the journal say, then the run goes on.
fail() {
    FAILED=$((FAILED + 1))
    say "FAIL $*"
    inside systemctl status --no-pager -n 0 pure-serve 2>&1 | sed 's/^/    | /' || true
    inside journalctl -u pure-serve --no-pager -n 15 -o short-monotonic 2>&1 | sed 's/^/    | /' || true
}
prop() { inside systemctl show -P "$1" pure-serve; }
# Waits until a unit property has a value (at most $3 seconds).
wait_prop() {
    local i
    for i in $(seq $(($3 * 10))); do
        [ "$(prop "$1")" = "$2" ] && return 0
        sleep 0.1
    done
    return 1
}
wait_active() { wait_prop ActiveState active "$1" && wait_prop SubState running 1; }
# Waits until STATUS= matches an extended regular expression (at most $2 seconds).
wait_status() {
    local i
    for i in $(seq $(($2 * 10))); do
        prop StatusText | grep -Eq "$1" && return 0
        sleep 0.1
    done
    return 1
}
journal_warn() { inside journalctl -u pure-serve -p warning --no-pager -o cat; }
SENDERS=/etc/pure-serve/senders
APPS=/etc/pure-serve/apps.toml
NODE_STATE=/var/lib/private/pure-serve

# 1. install: apt-get enables and starts the unit; active means READY=1 arrived (Type=notify).
T=$(date +%s.%N)
if inside env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$DEB_IN" >"$WORK/install.log" 2>&1; then
    ok "install: apt-get install ./$(basename "$DEB") in $(since "$T") s"
else
    cat "$WORK/install.log"
    fail "install: apt-get install did not succeed (log above)"
    exit 1
fi
if wait_active 10; then
    START=$(prop ExecMainStartTimestampMonotonic)
    READY=$(prop ActiveEnterTimestampMonotonic)
    ok "start: $(inside systemctl is-enabled pure-serve), $(prop Type), active $(((READY - START) / 1000)) ms after exec (READY=1): STATUS=$(prop StatusText)"
else
    fail "start: the unit is not active (running) after install"
fi
case "$(prop StatusText)" in serving*) ok "start: STATUS= says it serves" ;; *) fail "start: STATUS= is '$(prop StatusText)'" ;; esac
[ "$(prop WatchdogUSec)" = 30s ] && ok "start: WatchdogUSec=30s" || fail "start: WatchdogUSec is $(prop WatchdogUSec)"
# The state: the dynamic user's own, 0700, behind /var/lib/private (0700 root); the key 0600.
PERMS="$(inside stat -c '%a %u' /var/lib/private "$NODE_STATE" "$NODE_STATE/node.key" 2>&1 | tr '\n' ' ')"
NODE_UID="$(inside stat -c %u /proc/"$(prop MainPID)")"
if [ "$PERMS" = "700 0 700 $NODE_UID 600 $NODE_UID " ] && [ "$NODE_UID" != 0 ]; then
    ok "state: /var/lib/private 0700 root, $NODE_STATE 0700 and node.key 0600 of the dynamic user $NODE_UID"
else
    fail "state: permissions (mode uid of /var/lib/private, the state, node.key) are '$PERMS', node uid $NODE_UID"
fi
NODE_KEY="$(inside pure-serve pubkey --key "$NODE_STATE/node.key")"
inside journalctl -u pure-serve -o cat --no-pager | grep -q "$NODE_KEY" \
    && ok "start: the journal shows the node's public key" || fail "start: no public key $NODE_KEY in the journal"

# 2. reload: a new sender comes into force without a restart, and its records are stored.
DEV_KEY="$(inside pure-serve keygen --out /root/dev.key)"
inside cp "$SENDERS" /root/senders.orig
inside sh -c "cat /root/senders.orig >/root/senders.good && echo 'dev $DEV_KEY' >>/root/senders.good && cp /root/senders.good $SENDERS"
PID_BEFORE=$(prop MainPID)
if inside systemctl reload pure-serve && wait_status ': 1 senders' 5 && [ "$(prop MainPID)" = "$PID_BEFORE" ]; then
    ok "reload: systemctl reload put the new sender in force, same process: STATUS=$(prop StatusText)"
else
    fail "reload: after systemctl reload STATUS= is '$(prop StatusText)', pid $PID_BEFORE -> $(prop MainPID)"
fi
if inside sh -c "seq 1 100 | sed 's/^/reading-/' | pure-serve send --key /root/dev.key --node $NODE_KEY --to 127.0.0.1:7380 --timeout 20" \
    >"$WORK/send.log" 2>&1; then
    ok "reload: the new sender's 100 records stored and acknowledged (pure-serve send)"
else
    cat "$WORK/send.log"
    fail "reload: pure-serve send of 100 records failed (above)"
fi

# 3. a bad senders file on reload: refused, the old list stays, the error at priority error in the journal.
inside sh -c "cp /root/senders.good $SENDERS && echo 'broken-line-without-key' >>$SENDERS"
inside systemctl reload pure-serve || true
if wait_status 'last reload refused' 5; then
    ok "bad reload: refused, still serving, same process: STATUS=$(prop StatusText)"
else
    fail "bad reload: STATUS= is '$(prop StatusText)', expected 'last reload refused'"
fi
[ "$(prop MainPID)" = "$PID_BEFORE" ] && [ "$(prop ActiveState)" = active ] \
    || fail "bad reload: the node did not stay up ($(prop ActiveState), pid $PID_BEFORE -> $(prop MainPID))"
if journal_warn | grep -q "reload of $SENDERS refused.*$SENDERS:[0-9]*:"; then
    ok "journal: journalctl -p warning shows '$(journal_warn | grep -o "reload of $SENDERS refused[^:]*" | tail -n 1)…'"
else
    fail "journal: journalctl -u pure-serve -p warning lacks the refused reload naming $SENDERS:LINE"
fi
journal_warn | grep -q "$NODE_KEY" \
    && fail "journal: info lines (the public key) show at -p warning: every line has one priority" \
    || ok "journal: info lines stay out of -p warning (priorities are the node's own)"
inside cp /root/senders.good "$SENDERS"
inside systemctl reload pure-serve
wait_status '^serving [^(]*$' 5 \
    && ok "reload: a good file again clears the refusal: STATUS=$(prop StatusText)" \
    || fail "reload: STATUS= still '$(prop StatusText)' after a good reload"

# 4. watchdog: pings keep it alive over several intervals; a hung node (SIGSTOP: no thread runs) is killed and
# restarted. The interval is shortened to 2 s in a drop-in, as an operator would with `systemctl edit`, so this
# takes seconds rather than the unit's 30 s.
inside mkdir -p /run/systemd/system/pure-serve.service.d
inside sh -c 'printf "[Service]\nWatchdogSec=2s\n" >/run/systemd/system/pure-serve.service.d/watchdog-test.conf'
inside systemctl daemon-reload
inside systemctl restart pure-serve
wait_active 10 || fail "watchdog: the unit did not come back after the restart with WatchdogSec=2s"
PID_W=$(prop MainPID)
RESTARTS=$(prop NRestarts)
sleep 5
if [ "$(prop MainPID)" = "$PID_W" ] && [ "$(prop NRestarts)" = "$RESTARTS" ] && [ "$(prop ActiveState)" = active ]; then
    ok "watchdog: WatchdogSec=2s, alive after 5 s (WATCHDOG=1 from the receive loop)"
else
    fail "watchdog: a node that runs was restarted (pid $PID_W -> $(prop MainPID), restarts $RESTARTS -> $(prop NRestarts))"
fi
T=$(date +%s.%N)
# MainPID is the container's pid, so the signal is sent from inside (the shell's kill: minbase has no /bin/kill).
inside sh -c "kill -STOP $PID_W"
for _ in $(seq 200); do
    NEW=$(prop MainPID)
    [ "$NEW" != "$PID_W" ] && [ "$NEW" != 0 ] && [ "$(prop SubState)" = running ] && break
    sleep 0.1
done
if [ "$(prop MainPID)" != "$PID_W" ] && [ "$(prop NRestarts)" = $((RESTARTS + 1)) ] \
    && inside journalctl -u pure-serve --no-pager -o cat | grep -q 'Watchdog timeout'; then
    ok "watchdog: the hung node was killed ('Watchdog timeout') and restarted, serving again $(since "$T") s after SIGSTOP"
else
    fail "watchdog: after SIGSTOP pid $PID_W -> $(prop MainPID), restarts $RESTARTS -> $(prop NRestarts)"
fi
inside rm -rf /run/systemd/system/pure-serve.service.d
inside systemctl daemon-reload
inside systemctl restart pure-serve
wait_active 10 || fail "watchdog: the unit did not restart without the drop-in"

# 5. a bad senders or apps file at start: exit 78, no restart loop, failed, the error at priority warning or above.
bad_file() { # $1 file, $2 what to append, $3 what the error must name
    local restarts journal_before
    restarts=$(prop NRestarts)
    journal_before=$(journal_warn | wc -l)
    inside sh -c "cp $1 /root/file.orig && echo '$2' >>$1"
    inside systemctl restart pure-serve 2>/dev/null || true
    wait_prop ActiveState failed 10 || true
    sleep 3 # beyond RestartSec=2s: a restart, were there one, would have begun
    if [ "$(prop ActiveState)" = failed ] && [ "$(prop ExecMainStatus)" = 78 ] && [ "$(prop NRestarts)" = "$restarts" ]; then
        ok "bad $1: exit 78, failed, not restarted (NRestarts $restarts)"
    else
        fail "bad $1: $(prop ActiveState)/$(prop SubState), exit $(prop ExecMainStatus), restarts $restarts -> $(prop NRestarts)"
    fi
    inside systemctl status --no-pager pure-serve >"$WORK/status.txt" 2>&1 || true
    grep -q 'Active: failed' "$WORK/status.txt" && grep -q 'status=78' "$WORK/status.txt" \
        && ok "bad $1: systemctl status: $(grep -o 'Active: failed[^;]*' "$WORK/status.txt"), $(grep -o 'status=78[^)]*' "$WORK/status.txt" | head -n 1)" \
        || { cat "$WORK/status.txt"; fail "bad $1: systemctl status does not say failed with status=78"; }
    if journal_warn | tail -n +"$((journal_before + 1))" | grep -q "$3"; then
        ok "bad $1: journalctl -p warning: $(journal_warn | tail -n +"$((journal_before + 1))" | sed 's/^ *//' | tr '\n' ' ' | cut -c 1-220)…"
    else
        fail "bad $1: journalctl -u pure-serve -p warning has no new line naming '$3'"
    fi
    inside cp /root/file.orig "$1"
    inside systemctl reset-failed pure-serve
    inside systemctl start pure-serve && wait_active 10 || fail "bad $1: the unit did not start again with the file mended"
}
bad_file "$SENDERS" "broken-line-without-key" "$SENDERS:[0-9]"
bad_file "$APPS" "[apps.main" "$APPS"

# 6. a failure a restart may cure (the link port taken by another process): restarted, then given up at the start
# limit instead of for ever.
inside systemctl stop pure-serve
inside systemd-run --quiet --unit=port-squatter -p Type=notify -p DynamicUser=yes -p StateDirectory=squatter \
    /usr/bin/pure-serve --senders "$SENDERS" --link-port 7380 --http-port 7391 --metrics-listen 127.0.0.1:7392 \
    || fail "start limit: could not start another node on UDP 7380"
T=$(date +%s.%N)
inside systemctl start pure-serve 2>/dev/null || true
# StartLimitBurst=5 in StartLimitIntervalSec=60: the first start and 4 restarts, 2 s apart, then systemd gives up
# (the Result stays the last failure's, exit-code; the journal says why it stopped trying).
for _ in $(seq 300); do
    inside journalctl -u pure-serve --no-pager -o cat | grep -q 'Start request repeated too quickly' && break
    sleep 0.1
done
sleep 3 # beyond RestartSec=2s: a restart, were there one, would have begun
if inside journalctl -u pure-serve --no-pager -o cat | grep -q 'Start request repeated too quickly' \
    && [ "$(prop ActiveState)" = failed ] && [ "$(prop ExecMainStatus)" = 1 ] && [ "$(prop NRestarts)" = 4 ]; then
    ok "start limit: port in use: exit 1, 4 restarts, then failed ('Start request repeated too quickly') after $(since "$T") s"
else
    fail "start limit: $(prop ActiveState)/$(prop SubState), result $(prop Result), exit $(prop ExecMainStatus), restarts $(prop NRestarts)"
fi
inside systemctl stop port-squatter
inside systemctl reset-failed pure-serve
inside systemctl start pure-serve && wait_active 10 || fail "start limit: the unit did not start once the port was free"

# 7. stop: clean (exit 0), and nothing the node acknowledged is lost, across the watchdog kill too.
T=$(date +%s.%N)
inside systemctl stop pure-serve
if [ "$(prop ActiveState)" = inactive ] && [ "$(prop Result)" = success ] && [ "$(prop ExecMainStatus)" = 0 ]; then
    ok "stop: inactive, exit 0, in $(since "$T") s"
else
    fail "stop: $(prop ActiveState), result $(prop Result), exit $(prop ExecMainStatus)"
fi
STORED="$(inside pure-serve records --state "$NODE_STATE" --app main | wc -l)"
[ "$STORED" = 100 ] && ok "stop: the store holds the 100 acknowledged records" \
    || fail "stop: the store holds $STORED records, expected 100"
inside systemctl start pure-serve && wait_active 10 || fail "stop: the unit did not start again"

# 8. hardening: the loaded unit's exposure, against the target in docs/operations.md.
inside systemd-analyze security --no-pager pure-serve >"$WORK/security.txt" 2>&1 || true
EXPOSURE="$(sed -n 's/.*Overall exposure level for pure-serve.service: \([0-9.]*\).*/\1/p' "$WORK/security.txt")"
if [ -n "$EXPOSURE" ] && awk -v e="$EXPOSURE" -v m="$EXPOSURE_MAX" 'BEGIN { exit !(e <= m) }'; then
    ok "security: systemd-analyze security pure-serve: exposure $EXPOSURE (target <= $EXPOSURE_MAX)"
else
    cat "$WORK/security.txt"
    fail "security: exposure '${EXPOSURE:-none}' is not <= $EXPOSURE_MAX (docs/operations.md, Hardening)"
fi
VERIFY="$(inside systemd-analyze verify pure-serve.service 2>&1 || echo "exit $?")"
[ -z "$VERIFY" ] && ok "verify: systemd-analyze verify pure-serve.service says nothing" \
    || fail "verify: systemd-analyze verify says: $VERIFY"

# 9. purge: the unit stopped and gone, the node's key and stores kept (docs/operations.md, Debian package).
inside env DEBIAN_FRONTEND=noninteractive apt-get purge -y -q pure-serve >"$WORK/purge.log" 2>&1 \
    || { cat "$WORK/purge.log"; fail "purge: apt-get purge did not succeed"; }
if ! inside systemctl is-active -q pure-serve && ! inside test -e /usr/lib/systemd/system/pure-serve.service \
    && inside test -f "$NODE_STATE/node.key" && inside test -d "$NODE_STATE/apps"; then
    ok "purge: stopped, unit removed, $NODE_STATE (key and stores) kept"
else
    fail "purge: active=$(inside systemctl is-active pure-serve), state: $(inside ls "$NODE_STATE" 2>&1 | tr '\n' ' ')"
fi

say "$PASSED checks passed, $FAILED failed, in $(since "$T0") s (boot to poweroff $(since "$T_BOOT") s)"
if [ "$FAILED" != 0 ]; then exit 1; fi
