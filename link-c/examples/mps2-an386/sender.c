/*
 * sender.c: a device program in C on a Cortex-M4 (QEMU's mps2-an386), through pure_link.h: the firmware
 * counterpart of ../deliver.c, built with arm-none-eabi-gcc and linked with the library built for
 * thumbv7em-none-eabihf. It queues records in its outbox in flash, delivers them to a pure-serve node over the
 * UART (the test's harness carries each SLIP frame to the node as a UDP datagram and brings the answers back), and
 * prints the node's downlink records.
 *
 * Command line (QEMU's `-semihosting-config arg=...`): `NAME WORD... -- FLASH-PATH`, the words
 *   key=HEX      the device's 32-byte X25519 secret key (64 hex digits)
 *   node=HEX     the node's public key (64 hex digits)
 *   app=NAME     the app (default main)
 *   records=N    queue records until the next sequence passes N: records 1..=N over all boots
 *   size=BYTES   each record's size: "rec-SEQ" padded with '.' (default 32)
 *   stay=MS      how long to stay awake for downlink once every record is stored (default 0)
 *   timeout=MS   give up, exit 2 (default 60000)
 *   window=BYTES offer the node downlink version 1.2 with this many bytes of datagrams in flight (default 8192,
 *                DOWN_WINDOW below; 0: version 1.1, each answer within the bytes the board sent)
 *
 * Console (semihosting: QEMU's stdout), one fact a line: `first seq: N`, `heard: N`, `in flash: N`, `applied: N
 * HASH` at start; `queued SEQ` once a record is in flash; `stored APP THROUGH` per acknowledgement; `down SEQ
 * PAYLOAD` per downlink record (printable ASCII as it is, else `hex:` and hex digits); `kept heard SEQ` once its
 * sequence is in flash; `delivered: ...` when every record is stored; `applied: N HASH` and `wide: 0|1` (the node took the offer of 1.2) at the end. Exit 0
 * done, 2 timeout, 4 flash error, 6 bad command line, 7 the node refused the app.
 *
 * What the program does with its downlink records, exactly once: it applies each to a state of 16 bytes kept in
 * the outbox with the heard sequence (pl_state, pl_set_heard_with): the count of records applied (u64) and a hash
 * of them (u64, both little-endian), the hash taken over each record's bytes and a newline, in order, by
 * FNV-1a's step (hash = (hash ^ byte) * 0x100000001b3) from 0. A power cut between the printing and the write
 * prints a record again at the next boot, but applies it once: `applied:` is the proof.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "board.h"
#include "pure_link.h"

#define EXIT_TIMEOUT 2
#define EXIT_FLASH 4
#define EXIT_CONFIG 6
#define EXIT_REFUSED 7

#define OUTBOX_PAGES 10      /* pages 0-9 of the board's 16: 40 KiB */
#define RECORD_MAX 256
#define ASK_EVERY_MS 5000 /* while staying awake, ask again within the node's --link-idle-ms (30 s) */
/* Downlink version 1.2's window (pl_set_down_window): what the board holds of datagrams that arrive before it
 * handles them. This program takes one datagram at a time into rx (below); what arrives meanwhile waits in the
 * carrier: on a real board the UART's or radio's receive ring, which 8 KiB of the 64 KiB of RAM would hold
 * (six datagrams of 1,200 bytes); here QEMU's UART and the test's harness. A large downlink (a firmware image
 * pushed as pieces) then comes several datagrams an answer, each acknowledged with a LISTEN of 96 bytes. */
#define DOWN_WINDOW 8192

/* newlib-nano's printf has no 64-bit integers: this formats one into a buffer of 21. */
static const char *u64s(uint64_t n, char out[21]) {
    char *p = out + 20;
    *p = 0;
    do {
        *--p = (char)('0' + n % 10);
        n /= 10;
    } while (n);
    return p;
}

static int hex32(const char *s, uint8_t out[32]) {
    if (strlen(s) != 64) return -1;
    for (int i = 0; i < 64; i++) {
        char c = s[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (v < 0) return -1;
        if (i % 2 == 0) out[i / 2] = (uint8_t)(v << 4); else out[i / 2] |= (uint8_t)v;
    }
    return 0;
}

static int number(const char *s, uint64_t *out) {
    if (!*s || strlen(s) > 19) return -1;
    uint64_t n = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return -1;
        n = n * 10 + (uint64_t)(*s - '0');
    }
    *out = n;
    return 0;
}

/* What the events of one pl_handle_* call left for the loop (pl_* are never called from the callback). */
struct seen {
    const char *app;
    uint64_t heard; /* the largest downlink sequence printed, 0 if none */
    int refused;
    uint8_t state[PL_STATE_LEN]; /* the program's state with the records printed applied */
};

static uint64_t le64(const uint8_t *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

static void put_le64(uint8_t *b, uint64_t v) {
    for (int i = 0; i < 8; i++, v >>= 8) b[i] = (uint8_t)v;
}

/* Applies one downlink record to the state: one more, and the hash over its bytes and a newline. */
static void apply(uint8_t state[PL_STATE_LEN], const uint8_t *payload, size_t len) {
    uint64_t hash = le64(state + 8);
    for (size_t i = 0; i <= len; i++) hash = (hash ^ (i < len ? payload[i] : '\n')) * 0x100000001b3ull;
    put_le64(state, le64(state) + 1);
    put_le64(state + 8, hash);
}

static void print_applied(pl_device *dev) {
    uint8_t state[PL_STATE_LEN];
    char a[21];
    pl_state(dev, state);
    uint64_t hash = le64(state + 8);
    printf("applied: %s %08x%08x\n", u64s(le64(state), a), (unsigned)(hash >> 32), (unsigned)hash);
}

static void on_event(void *ctx, const pl_event *e) {
    struct seen *s = ctx;
    char a[21], b[21];
    switch (e->kind) {
    case PL_EVENT_STORED:
        printf("stored %s %s\n", s->app, u64s(e->seq, a));
        break;
    case PL_EVENT_DOWN: {
        int text = 1;
        for (size_t i = 0; i < e->payload_len; i++) text &= e->payload[i] >= 0x20 && e->payload[i] < 0x7f;
        if (text) {
            printf("down %s %.*s\n", u64s(e->seq, a), (int)e->payload_len, (const char *)e->payload);
        } else {
            printf("down %s hex:", u64s(e->seq, a));
            for (size_t i = 0; i < e->payload_len; i++) printf("%02x", e->payload[i]);
            printf("\n");
        }
        if (e->seq > s->heard) s->heard = e->seq;
        apply(s->state, e->payload, e->payload_len);
        break;
    }
    case PL_EVENT_REFUSED:
        printf("refused %s %u\n", s->app, e->reason);
        s->refused = 1;
        break;
    case PL_EVENT_NOT_STORED:
        printf("not stored %s %u\n", s->app, e->reason);
        break;
    case PL_EVENT_NODE_AHEAD:
    case PL_EVENT_NODE_BEHIND:
        printf("node %s %s %s %s\n", e->kind == PL_EVENT_NODE_AHEAD ? "ahead" : "behind", s->app, u64s(e->seq, a),
               u64s(e->ours, b));
        break;
    case PL_EVENT_DOWNLINK_UNANSWERED:
        printf("downlink unanswered %s\n", s->app);
        break;
    default:
        break;
    }
}

static size_t make_record(uint64_t seq, size_t size, uint8_t *buf) {
    char digits[21];
    memset(buf, '.', size);
    char text[32] = "rec-";
    strcat(text, u64s(seq, digits));
    size_t n = strlen(text);
    memcpy(buf, text, n < size ? n : size);
    return size;
}

static pl_device dev;
static uint8_t tx[1200];
static uint8_t rx[1472];

int main(int argc, char **argv) {
    uint8_t key[32], node[32];
    int have_key = 0, have_node = 0;
    const char *app = "main", *flash_path = NULL;
    uint64_t records = 0, size = 32, stay_ms = 0, timeout_ms = 60000, window = DOWN_WINDOW;
    for (int i = 1; i < argc; i++) {
        const char *w = argv[i];
        if (!strcmp(w, "--")) {
            flash_path = i + 1 < argc ? argv[i + 1] : NULL;
            break;
        }
        const char *v = strchr(w, '=');
        int bad = !v;
        if (!bad) {
            v++;
            if (!strncmp(w, "key=", 4)) bad = hex32(v, key), have_key = 1;
            else if (!strncmp(w, "node=", 5)) bad = hex32(v, node), have_node = 1;
            else if (!strncmp(w, "app=", 4)) app = v;
            else if (!strncmp(w, "records=", 8)) bad = number(v, &records);
            else if (!strncmp(w, "size=", 5)) bad = number(v, &size) || size > RECORD_MAX;
            else if (!strncmp(w, "stay=", 5)) bad = number(v, &stay_ms);
            else if (!strncmp(w, "timeout=", 8)) bad = number(v, &timeout_ms);
            else if (!strncmp(w, "window=", 7)) bad = number(v, &window) || window > 0xFFFFFFFFu;
            else bad = 1;
        }
        if (bad) {
            printf("error: command line: %s: not a word this firmware takes, or a bad value\n", w);
            return EXIT_CONFIG;
        }
    }
    if (!have_key || !have_node || !flash_path) {
        printf("error: command line: key=, node= and -- FLASH-PATH are needed\n");
        return EXIT_CONFIG;
    }
    if (pl_device_size() != PL_DEVICE_SIZE) {
        printf("error: pure_link.h does not match the library\n");
        return EXIT_CONFIG;
    }
    if (flash_open(flash_path)) {
        printf("error: flash: cannot open %s\n", flash_path);
        return EXIT_FLASH;
    }
    uart_init();

    pl_flash flash = {NULL, FLASH_PAGE, OUTBOX_PAGES, flash_read, flash_program, flash_erase};
    /* No random source on this board: the run id still never repeats, from the run count kept in flash. */
    int r = pl_open(&dev, &flash, key, node, app, NULL, 0, sizeof tx);
    if (r != PL_OK) {
        printf("error: pl_open: %d\n", r);
        return r == PL_ERR_FLASH || r == PL_ERR_GEOMETRY ? EXIT_FLASH : EXIT_CONFIG;
    }
    if ((r = pl_set_down_window(&dev, (uint32_t)window)) != PL_OK) {
        printf("error: pl_set_down_window: %d\n", r);
        return EXIT_CONFIG;
    }
    char a[21];
    printf("first seq: %s\n", u64s(pl_next_seq(&dev), a));
    printf("heard: %s\n", u64s(pl_heard(&dev), a));
    printf("in flash: %u\n", (unsigned)pl_unacked(&dev));
    print_applied(&dev);
    if (size > pl_max_record(&dev)) {
        printf("error: command line: size=%u is above %u\n", (unsigned)size, (unsigned)pl_max_record(&dev));
        return EXIT_CONFIG;
    }
    if ((r = pl_listen(&dev)) != PL_OK) {
        printf("error: pl_listen: %d\n", r);
        return EXIT_CONFIG;
    }

    struct seen seen = {app, 0, 0, {0}};
    uint8_t record[RECORD_MAX];
    unsigned queued = 0;
    uint64_t started = board_now_ms(), done_at = 0, asked_at = started;
    int done = 0;
    for (;;) {
        uint64_t now = board_now_ms();
        /* Queue what the outbox takes; PL_OK means the record is in flash. A full outbox takes more once the
         * node has stored some. */
        while (pl_next_seq(&dev) <= records) {
            uint64_t seq = pl_next_seq(&dev);
            r = pl_queue(&dev, record, make_record(seq, (size_t)size, record));
            if (r == PL_ERR_FULL) break;
            if (r != PL_OK) {
                printf("error: pl_queue: %d\n", r);
                return r == PL_ERR_FLASH ? EXIT_FLASH : EXIT_CONFIG;
            }
            printf("queued %s\n", u64s(seq, a));
            queued++;
        }

        size_t n;
        while ((n = pl_poll_transmit(&dev, now, tx, sizeof tx)) > 0) uart_send(tx, n);

        uint64_t at;
        seen.heard = 0;
        pl_state(&dev, seen.state);
        if (uart_recv(rx, sizeof rx, &n)) {
            pl_handle_datagram(&dev, board_now_ms(), rx, n, on_event, &seen);
        } else if (pl_poll_timeout(&dev, &at) && now >= at) {
            pl_handle_timeout(&dev, now, on_event, &seen);
        }
        /* The downlink records just printed and applied: the state with them and their sequence go to flash in
         * one write, before the next pl_poll_transmit tells the node they were taken. A cut before it prints them
         * again next boot, and applies them then: once. */
        if (seen.heard) {
            if (pl_set_heard_with(&dev, seen.heard, seen.state) != PL_OK) {
                printf("error: flash: keeping heard\n");
                return EXIT_FLASH;
            }
            printf("kept heard %s\n", u64s(seen.heard, a));
        }
        if (seen.refused) return EXIT_REFUSED;

        if (!done && pl_next_seq(&dev) > records && pl_unacked(&dev) == 0) {
            done = 1;
            done_at = now;
            printf("delivered: %u records queued this boot, all stored, in %u ms\n", queued,
                   (unsigned)(now - started));
        }
        if (done) {
            if (now >= done_at + stay_ms && pl_is_idle(&dev)) break;
            if (now >= asked_at + ASK_EVERY_MS) {
                asked_at = now;
                pl_listen(&dev);
            }
        }
        if (now >= started + timeout_ms) {
            printf("error: timeout after %u ms: next seq %s, %u unacknowledged\n", (unsigned)timeout_ms,
                   u64s(pl_next_seq(&dev), a), (unsigned)pl_unacked(&dev));
            return EXIT_TIMEOUT;
        }
    }
    printf("next seq: %s\n", u64s(pl_next_seq(&dev), a));
    printf("heard: %s\n", u64s(pl_heard(&dev), a));
    print_applied(&dev);
    printf("wide: %d\n", pl_is_wide(&dev));
    printf("uart dropped: %u\n", (unsigned)uart_dropped());
    printf("run: %u ms\n", (unsigned)(board_now_ms() - started));
    pl_close(&dev);
    return 0;
}
