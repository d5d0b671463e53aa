/*
 * pure_link.h: the pure-serve link's device sender for C, with its outbox in flash.
 *
 * One device sends records for one app to a pure-serve node over encrypted UDP (or any datagram carrier) and
 * takes the node's downlink records. Records are kept in the device's flash from the moment pl_queue returns
 * PL_OK until the node has stored them on its disk, so a power cut or a deep sleep loses nothing queued and
 * doubles nothing. No heap, no operating system: the caller gives the memory, the flash (callbacks), the time in
 * milliseconds and the randomness it has.
 *
 * All functions of one device are called from one task (or one loop), never from an interrupt.
 * docs/devices.md says what to call when, what the device keeps in flash, and the outbox's format.
 *
 * Link with libpure_link_c.a (link-c/, `cargo build --release`, with `--target` for a microcontroller). The
 * library calls abort() if it ever panics, which it is written never to do on any input.
 */
#ifndef PURE_LINK_H
#define PURE_LINK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Errors: every function that can fail returns PL_OK or one of these. */
#define PL_OK 0
#define PL_ERR_ARG (-1)       /* a null pointer, or an app name that is not 1-32 of a-z 0-9 _ - (an app the node
                                 does not have is refused by the node: PL_EVENT_REFUSED, then PL_ERR_REFUSED) */
#define PL_ERR_FLASH (-2)     /* a flash callback returned non-zero (pl_queue: the record was not kept; queue it
                                 again). A program that returned non-zero is read back: a record whose entry is
                                 whole in flash anyway (a driver that wrote it, then failed a verify or timed
                                 out) is kept, and pl_queue returns PL_OK */
#define PL_ERR_FULL (-3)      /* the outbox has no room: queue again once the node has stored records. Room is
                                 the flash's pages, and at most 64 records unstored, whatever the flash size
                                 (the library's RAM holds where each lies: docs/devices.md, "C") */
#define PL_ERR_TOO_LARGE (-4) /* the record does not fit in one datagram: see pl_max_record */
#define PL_ERR_REFUSED (-5)   /* the node refused the app (not listed for this device, or no such app) */
#define PL_ERR_KEY (-6)       /* the node's public key is not a usable key */
#define PL_ERR_GEOMETRY (-7)  /* pages not 512-65536 bytes (a multiple of 8), fewer than 3, or more records
                                 in flash than this library holds (64) */

/* Events, handed to the pl_event_fn given to pl_handle_datagram and pl_handle_timeout. */
#define PL_EVENT_STORED 1               /* the node stored every record up to seq, on its disk */
#define PL_EVENT_REFUSED 2              /* the node refused the app (reason, docs/protocol.md 5); not sent again this run, kept in flash for the next */
#define PL_EVENT_NOT_STORED 3           /* the node cannot store now (reason); records stay and go again */
#define PL_EVENT_NODE_AHEAD 4           /* the node held records past ours (seq: the node's, ours) */
#define PL_EVENT_NODE_BEHIND 5          /* the node lost records (seq: the node's, ours): renumbered, sent again */
#define PL_EVENT_DOWN 6                 /* a downlink record: seq, payload (valid during the call only) */
#define PL_EVENT_DOWNLINK_UNANSWERED 7  /* the node never answered listening: it has no downlink */

typedef struct pl_event {
    int kind;
    uint64_t seq;
    uint64_t ours;
    uint8_t reason;
    const uint8_t *payload;
    size_t payload_len;
} pl_event;

typedef void (*pl_event_fn)(void *ctx, const pl_event *event);

/*
 * The flash the outbox lives in: `pages` pages of `page_size` bytes (at least 3 pages of 512-65536 bytes, a
 * multiple of 8), by NOR rules. Each callback returns 0 on success.
 *  read:    copies len bytes from the page at offset.
 *  program: clears the bits of data that are 0 at offset (offset and len multiples of 8); never sets a bit.
 *  erase:   sets every byte of the page to 0xFF.
 */
typedef struct pl_flash {
    void *ctx;
    uint32_t page_size;
    uint16_t pages;
    int (*read)(void *ctx, uint16_t page, uint32_t offset, uint8_t *buf, size_t len);
    int (*program)(void *ctx, uint16_t page, uint32_t offset, const uint8_t *data, size_t len);
    int (*erase)(void *ctx, uint16_t page);
} pl_flash;

/* Memory for one device. pl_device_size() returns the size the library was built with. */
#define PL_DEVICE_SIZE 2048
typedef struct pl_device {
    _Alignas(8) uint8_t opaque[PL_DEVICE_SIZE];
} pl_device;

/*
 * Opens a device: its outbox in `flash` (formatted on first use, else read back), a new run counted in flash
 * (its id hashes the count with the key and `entropy`: give a hardware random number where there is one; without
 * one, a device whose flash is wiped repeats its first run ids and needs a new key: docs/devices.md), and
 * its flow to `app`, numbering on from the outbox. A new outbox (new flash, or flash wiped, with a key the node
 * may know from an earlier outbox) asks the node first where the numbering stands, and its records follow what the
 * node holds from the key (docs/devices.md, "A new outbox"). `secret` is the device's 32-byte X25519 secret key
 * (`pure-serve keygen`), `node_public` the node's 32-byte public key: raw bytes, as `keygen --many` writes them
 * (DEVICE.bin, DEVICE.h); a key printed or kept in base64 (`keygen --out`, the node's banner, `pure-serve pubkey`)
 * is decoded first. A node that does not list the device's key, or a wrong `node_public`, answers nothing at all:
 * no event comes (the node counts the packets as drops=unknown_key or auth). `max_datagram` is the largest datagram the
 * carrier takes (0: 1200; at least 96, at most 1472, else PL_ERR_ARG); pl_poll_transmit's buffer must hold it (a
 * smaller one is given nothing: pl_poll_transmit returns 0 while records wait).
 * Costs two X25519 scalar multiplications, the public key and the shared secret (tens of milliseconds each on a
 * Cortex-M4). PL_ERR_FULL: no room left in flash for the new run's count (docs/devices.md, "Writing").
 */
int pl_open(pl_device *dev, const pl_flash *flash, const uint8_t secret[32], const uint8_t node_public[32],
            const char *app, const uint8_t *entropy, size_t entropy_len, size_t max_datagram);

/* Asks the node for the app's downlink records, after the heard sequence kept in the outbox. Call it again to ask
 * again: a device that stays awake asks at least every --link-idle-ms of the node's (30 s by default), so that
 * records pushed meanwhile come at once. */
int pl_listen(pl_device *dev);

/*
 * Offers the node version 1.2 of downlink (docs/protocol.md 13, docs/devices.md "Large downlink"), for a device
 * that takes large downlink (a firmware image): once the node has checked that the device receives at its address,
 * it sends several datagrams of DOWN records per answer, at most `bytes` of datagrams in flight beyond the records
 * the device has taken, instead of at most what the device sent (version 1.1). The device acknowledges each
 * datagram with a small LISTEN by itself, so it sends about 100 bytes (the smallest datagram, 96) per datagram
 * of up to max_datagram bytes it is sent.
 * Choose what the device can hold of datagrams that arrive before it handles them: its receive buffer (the
 * socket's, the radio's or the UART's ring buffer); a datagram beyond it is lost and sent again, slower.
 * 0 (the default) offers nothing: version 1.1, each answer within the bytes the device sent. Call it after
 * pl_open, before the first pl_poll_transmit of a run (a later call takes effect from the next LISTEN).
 * A node of version 1.1 drops the offer: the device then loses at most two retransmission timeouts of its LISTEN
 * per run and goes on with 1.1.
 */
int pl_set_down_window(pl_device *dev, uint32_t bytes);

/* 1 once the node challenged this run (it speaks version 1.2: pl_set_down_window), else 0. */
int pl_is_wide(pl_device *dev);

/*
 * Gives up the records of the oldest flash page of the outbox, unstored, and frees the page: the way out when
 * pl_open returns PL_ERR_FULL because every start wrote a run entry while the device could not reach its node and
 * its records filled every other page (docs/devices.md, "Writing"). Those records will not reach the node; the
 * rest keep their order and are renumbered after what the node has. Returns how many records were given up (>= 0),
 * or PL_ERR_FULL when no page but the one being written holds records, PL_ERR_FLASH, PL_ERR_GEOMETRY. Call it with
 * no device open on that flash, then pl_open again.
 */
int pl_drop_oldest(const pl_flash *flash);

/* Queues a record. When this returns PL_OK the record is in flash and will reach the node's disk once.
 * PL_ERR_TOO_LARGE: longer than pl_max_record (for good). PL_ERR_FULL: no room until the node stores records.
 * PL_ERR_FLASH: a flash callback failed; the record was not kept (a later call writes on a fresh page). */
int pl_queue(pl_device *dev, const uint8_t *record, size_t len);

/* Builds the next datagram into out (out_len >= max_datagram): its length, or 0 when nothing is to be sent now.
 * Call it until it returns 0, sending each datagram. */
size_t pl_poll_transmit(pl_device *dev, uint64_t now_ms, uint8_t *out, size_t out_len);

/* 1 and *at_ms set when pl_handle_timeout is due at *at_ms; 0 when no timer runs. */
int pl_poll_timeout(pl_device *dev, uint64_t *at_ms);

/* Takes a datagram from the node; it is decrypted in place (its bytes are garbage after). Events go to cb. */
void pl_handle_datagram(pl_device *dev, uint64_t now_ms, uint8_t *datagram, size_t len, pl_event_fn cb,
                        void *ctx);

/* The time pl_poll_timeout gave has come. Events go to cb. */
void pl_handle_timeout(pl_device *dev, uint64_t now_ms, pl_event_fn cb, void *ctx);

/* Keeps seq as the downlink heard sequence in flash. Call it once the program has done what a PL_EVENT_DOWN
 * record asks, before the next pl_poll_transmit (which tells the node, which then deletes the record). */
int pl_set_heard(pl_device *dev, uint64_t seq);

/*
 * Exactly once for a program whose downlink records change a small state: PL_STATE_LEN bytes (a setting, a
 * counter, a hash of what was applied, where a larger state lies) kept in the outbox in the same flash write as
 * the heard sequence. Apply each PL_EVENT_DOWN record to the state read with pl_state, then keep both with
 * pl_set_heard_with (instead of pl_set_heard) before the next pl_poll_transmit: a power cut at any moment leaves
 * both or neither, so a record is applied once. A seq not above the one kept changes nothing.
 */
#define PL_STATE_LEN 16
int pl_set_heard_with(pl_device *dev, uint64_t seq, const uint8_t state[PL_STATE_LEN]);
/* Copies the state kept (zeros until pl_set_heard_with kept one) to out. */
int pl_state(pl_device *dev, uint8_t out[PL_STATE_LEN]);

/* The downlink heard sequence kept in flash: the last one pl_set_heard or pl_set_heard_with kept (0 before any). */
uint64_t pl_heard(pl_device *dev);

/* The sequence the next record queued gets. On a new outbox, until the node's first answer, numbers count from 1
 * and then move to follow what the node holds from the key (PL_EVENT_STORED says the node's numbers). */
uint64_t pl_next_seq(pl_device *dev);

/* Records queued and not yet stored by the node. */
size_t pl_unacked(pl_device *dev);

/* 1 when nothing waits for the node (every record stored, every downlink answer in): time to sleep. */
int pl_is_idle(pl_device *dev);

/* The largest record pl_queue takes: what a datagram carries for the app (1,125 bytes for `main` at 1,200-byte
 * datagrams), and at most the flash page's size less 64 (448 bytes with 512-byte pages). */
size_t pl_max_record(pl_device *dev);

/* Closes the device; its memory may be reused. */
void pl_close(pl_device *dev);

/* PL_DEVICE_SIZE as the library was built. */
size_t pl_device_size(void);

#ifdef __cplusplus
}
#endif

#endif /* PURE_LINK_H */
