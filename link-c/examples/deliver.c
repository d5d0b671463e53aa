/*
 * deliver.c: a device program in C on a Linux host, through pure_link.h. It queues records in its outbox (a
 * "flash" of 16 pages of 4 KiB kept in a file, by NOR rules), delivers them to a pure-serve node over UDP, and
 * prints the node's downlink records for the app. What a firmware does, with a socket for its radio and a file
 * for its flash.
 *
 *   deliver FLASH SECRET_HEX NODE_PUBLIC_HEX APP HOST PORT COUNT LISTEN_MS [DOWN_WINDOW]
 *
 * Queues COUNT records "c-<seq>" (seq: the sequence each gets), prints "queued <seq>" for each once it is in
 * flash, "stored <through>" as the node stores them and "down <seq> <payload>" for each downlink record, then
 * stays LISTEN_MS after everything is stored and, listening, nothing more waits (0: not listening), prints
 * "wide 1" if the node took its offer of version 1.2 (else "wide 0") and exits 0. DOWN_WINDOW (default 0: version
 * 1.1) offers version 1.2 with that many bytes of datagrams in flight, and asks the socket for as large a receive
 * buffer. Exits 2 after 60 s without getting there, 1 on a bad argument or a failing call.
 */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "pure_link.h"

#define PAGE 4096
#define PAGES 16

static int flash_read(void *ctx, uint16_t page, uint32_t offset, uint8_t *buf, size_t len) {
    int fd = *(int *)ctx;
    return pread(fd, buf, len, (off_t)page * PAGE + offset) == (ssize_t)len ? 0 : -1;
}

static int flash_program(void *ctx, uint16_t page, uint32_t offset, const uint8_t *data, size_t len) {
    int fd = *(int *)ctx;
    uint8_t old[64];
    for (size_t done = 0; done < len; done += 8) {
        off_t at = (off_t)page * PAGE + offset + done;
        if (pread(fd, old, 8, at) != 8) return -1;
        for (int i = 0; i < 8; i++) old[i] &= data[done + i]; /* NOR: a program only clears bits */
        if (pwrite(fd, old, 8, at) != 8) return -1;
    }
    return 0;
}

static int flash_erase(void *ctx, uint16_t page) {
    int fd = *(int *)ctx;
    uint8_t ones[PAGE];
    memset(ones, 0xFF, sizeof ones);
    return pwrite(fd, ones, PAGE, (off_t)page * PAGE) == PAGE ? 0 : -1;
}

static uint64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

static int hex32(const char *s, uint8_t out[32]) {
    if (strlen(s) != 64) return -1;
    for (int i = 0; i < 32; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) return -1;
        out[i] = (uint8_t)v;
    }
    return 0;
}

/* What the event callback saw; pl_* functions are never called from inside the callback. */
struct seen {
    uint64_t stored;
    uint64_t downs[64];
    size_t ndowns;
};

static void on_event(void *ctx, const pl_event *e) {
    struct seen *s = ctx;
    switch (e->kind) {
    case PL_EVENT_STORED:
        s->stored = e->seq;
        printf("stored %llu\n", (unsigned long long)e->seq);
        break;
    case PL_EVENT_DOWN:
        printf("down %llu %.*s\n", (unsigned long long)e->seq, (int)e->payload_len, (const char *)e->payload);
        if (s->ndowns < 64) s->downs[s->ndowns++] = e->seq;
        break;
    case PL_EVENT_REFUSED:
        printf("refused %u\n", e->reason);
        break;
    case PL_EVENT_NODE_BEHIND:
    case PL_EVENT_NODE_AHEAD:
        printf("node %s %llu ours %llu\n", e->kind == PL_EVENT_NODE_BEHIND ? "behind" : "ahead",
               (unsigned long long)e->seq, (unsigned long long)e->ours);
        break;
    default:
        break;
    }
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc != 9 && argc != 10) {
        fprintf(stderr, "usage: deliver FLASH SECRET_HEX NODE_PUBLIC_HEX APP HOST PORT COUNT LISTEN_MS [DOWN_WINDOW]\n");
        return 1;
    }
    uint8_t secret[32], node[32];
    if (hex32(argv[2], secret) || hex32(argv[3], node)) {
        fprintf(stderr, "deliver: a key is not 64 hex digits\n");
        return 1;
    }
    long count = atol(argv[7]), listen_ms = atol(argv[8]);
    long down_window = argc == 10 ? atol(argv[9]) : 0;
    if (down_window < 0 || down_window > 16L * 1024 * 1024) {
        fprintf(stderr, "deliver: DOWN_WINDOW %ld is not 0-16777216 bytes\n", down_window);
        return 1;
    }

    int fd = open(argv[1], O_RDWR | O_CREAT, 0600);
    if (fd < 0) {
        fprintf(stderr, "deliver: %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    if (lseek(fd, 0, SEEK_END) < (off_t)PAGE * PAGES) {
        for (uint16_t p = 0; p < PAGES; p++) flash_erase(&fd, p); /* a new chip: erased */
    }
    pl_flash flash = {&fd, PAGE, PAGES, flash_read, flash_program, flash_erase};

    struct addrinfo hints = {0}, *ai;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_DGRAM;
    if (getaddrinfo(argv[5], argv[6], &hints, &ai) != 0) {
        fprintf(stderr, "deliver: cannot resolve %s:%s\n", argv[5], argv[6]);
        return 1;
    }
    int sock = socket(AF_INET, SOCK_DGRAM, 0);
    if (sock < 0 || connect(sock, ai->ai_addr, ai->ai_addrlen) < 0) {
        fprintf(stderr, "deliver: socket: %s\n", strerror(errno));
        return 1;
    }
    freeaddrinfo(ai);
    if (down_window > 0) {
        /* Room for the datagrams the node sends in flight: what the window says the device holds. */
        int size = (int)down_window;
        if (setsockopt(sock, SOL_SOCKET, SO_RCVBUF, &size, sizeof size) < 0) {
            fprintf(stderr, "deliver: SO_RCVBUF %d: %s\n", size, strerror(errno));
            return 1;
        }
    }

    if (pl_device_size() != PL_DEVICE_SIZE) {
        fprintf(stderr, "deliver: pure_link.h does not match the library\n");
        return 1;
    }
    static pl_device dev;
    uint8_t entropy[16];
    int rnd = open("/dev/urandom", O_RDONLY);
    if (rnd < 0 || read(rnd, entropy, sizeof entropy) != (ssize_t)sizeof entropy) return 1;
    close(rnd);
    int r = pl_open(&dev, &flash, secret, node, argv[4], entropy, sizeof entropy, 0);
    if (r != PL_OK) {
        fprintf(stderr, "deliver: pl_open: %d\n", r);
        return 1;
    }
    if (down_window > 0 && (r = pl_set_down_window(&dev, (uint32_t)down_window)) != PL_OK) {
        fprintf(stderr, "deliver: pl_set_down_window: %d\n", r);
        return 1;
    }
    if (listen_ms > 0 && (r = pl_listen(&dev)) != PL_OK) {
        fprintf(stderr, "deliver: pl_listen: %d\n", r);
        return 1;
    }
    printf("first %llu\n", (unsigned long long)pl_next_seq(&dev));

    struct seen seen = {0};
    uint8_t out[1500], in[1500];
    long queued = 0;
    uint64_t start = now_ms(), done_at = 0;
    for (;;) {
        while (queued < count) {
            char rec[32];
            uint64_t seq = pl_next_seq(&dev);
            int n = snprintf(rec, sizeof rec, "c-%llu", (unsigned long long)seq);
            r = pl_queue(&dev, (const uint8_t *)rec, (size_t)n);
            if (r == PL_ERR_FULL) break; /* the outbox is full: send, and queue more once stored */
            if (r != PL_OK) {
                fprintf(stderr, "deliver: pl_queue: %d\n", r);
                return 1;
            }
            printf("queued %llu\n", (unsigned long long)seq);
            queued++;
        }
        size_t n;
        while ((n = pl_poll_transmit(&dev, now_ms(), out, sizeof out)) > 0) send(sock, out, n, 0);

        uint64_t now = now_ms();
        if (queued == count && pl_unacked(&dev) == 0 && (listen_ms == 0 || done_at || pl_is_idle(&dev))) {
            if (!done_at) done_at = now;
            if (now >= done_at + (uint64_t)listen_ms) break;
        }
        if (now > start + 60000) {
            fprintf(stderr, "deliver: not done after 60 s\n");
            return 2;
        }
        uint64_t at;
        int wait = 100;
        if (pl_poll_timeout(&dev, &at)) wait = at > now ? (int)(at - now < 100 ? at - now : 100) : 0;
        struct pollfd p = {sock, POLLIN, 0};
        if (poll(&p, 1, wait) > 0) {
            ssize_t got = recv(sock, in, sizeof in, 0);
            if (got > 0) {
                seen.ndowns = 0;
                pl_handle_datagram(&dev, now_ms(), in, (size_t)got, on_event, &seen);
                /* The downlink records were printed: keep the last one's sequence before the next transmit. */
                if (seen.ndowns > 0 && pl_set_heard(&dev, seen.downs[seen.ndowns - 1]) != PL_OK) {
                    fprintf(stderr, "deliver: pl_set_heard failed\n");
                    return 1;
                }
            }
        }
        if (pl_poll_timeout(&dev, &at) && now_ms() >= at) pl_handle_timeout(&dev, now_ms(), on_event, &seen);
    }
    printf("wide %d\n", pl_is_wide(&dev));
    printf("next %llu\n", (unsigned long long)pl_next_seq(&dev));
    pl_close(&dev);
    close(fd);
    return 0;
}
