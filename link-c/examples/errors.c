/*
 * What pl_queue answers when a record is not kept, and why: a record larger than a flash page takes
 * (PL_ERR_TOO_LARGE, and pl_max_record says the bound), a flash whose program callback fails (PL_ERR_FLASH; the
 * next record is kept on a fresh page). Then an outbox full of records started until its kept page is full of run
 * entries (pl_open: PL_ERR_FULL), and pl_drop_oldest as the way out. Prints one line per check and exits 0 when
 * each holds.
 * tests/c_device.rs builds and runs it.
 */
#include <stdio.h>
#include <string.h>

#include "pure_link.h"

#define PAGE 512
#define PAGES 4

static uint8_t flash_bytes[PAGES][PAGE];
static int fail_programs;

static int rd(void *ctx, uint16_t page, uint32_t offset, uint8_t *buf, size_t len) {
    (void)ctx;
    memcpy(buf, &flash_bytes[page][offset], len);
    return 0;
}

static int pr(void *ctx, uint16_t page, uint32_t offset, const uint8_t *data, size_t len) {
    (void)ctx;
    if (fail_programs) {
        return -1;
    }
    for (size_t i = 0; i < len; i++) {
        flash_bytes[page][offset + i] &= data[i];
    }
    return 0;
}

static int er(void *ctx, uint16_t page) {
    (void)ctx;
    memset(flash_bytes[page], 0xFF, PAGE);
    return 0;
}

static int failed;

static void expect(const char *what, long got, long want) {
    printf("%s: %ld (want %ld)\n", what, got, want);
    if (got != want) {
        failed = 1;
    }
}

int main(void) {
    static pl_device dev;
    static uint8_t record[PAGE];
    const pl_flash flash = {NULL, PAGE, PAGES, rd, pr, er};
    uint8_t secret[32], node[32] = {9};
    memset(flash_bytes, 0xFF, sizeof flash_bytes);
    memset(secret, 0x42, sizeof secret);
    memset(record, 'r', sizeof record);
    expect("pl_open with datagrams of 95 bytes", pl_open(&dev, &flash, secret, node, "main", NULL, 0, 95), PL_ERR_ARG);
    expect("pl_open", pl_open(&dev, &flash, secret, node, "main", NULL, 0, 0), PL_OK);
    expect("pl_max_record", (long)pl_max_record(&dev), PAGE - 64);
    expect("a record of the page less 63", pl_queue(&dev, record, PAGE - 63), PL_ERR_TOO_LARGE);
    expect("a record of the page less 64", pl_queue(&dev, record, PAGE - 64), PL_OK);
    fail_programs = 1;
    expect("a record while the flash fails", pl_queue(&dev, record, 10), PL_ERR_FLASH);
    fail_programs = 0;
    expect("the next record", pl_queue(&dev, record, 10), PL_OK);
    pl_close(&dev);

    /* Four pages of 512 bytes: 12 records of 100 bytes fill three, the fourth is kept for marks. */
    memset(flash_bytes, 0xFF, sizeof flash_bytes);
    pl_open(&dev, &flash, secret, node, "main", NULL, 0, 0);
    int queued = 0;
    while (pl_queue(&dev, record, 100) == PL_OK) {
        queued++;
    }
    pl_close(&dev);
    /* Three or four a page (the first also holds the first start's entries). */
    expect("records queued fill three pages", queued >= 9 && queued <= 12, 1);
    /* A device that queues a reading at every start, its node away: each reading is refused, none takes the kept
     * page (which a start's run entry opened). */
    int starts = 0, readings_kept = 0, r;
    while ((r = pl_open(&dev, &flash, secret, node, "main", NULL, 0, 0)) == PL_OK && starts < 1000) {
        readings_kept += pl_queue(&dev, record, 16) == PL_OK;
        pl_close(&dev);
        starts++;
    }
    expect("readings kept with the outbox full", readings_kept, 0);
    /* Each start wrote a run entry of 16 bytes into the kept page: (512 - 56) / 16 of them. */
    expect("starts until the kept page is full", starts, 28);
    expect("pl_open then", r, PL_ERR_FULL);
    int dropped = pl_drop_oldest(&flash);
    printf("pl_drop_oldest gave up %d of %d records\n", dropped, queued);
    expect("the oldest page's records, not all", dropped >= 3 && dropped <= 4, 1);
    expect("pl_open after it", pl_open(&dev, &flash, secret, node, "main", NULL, 0, 0), PL_OK);
    /* The rest are there, numbered on after them. */
    expect("records left", (long)pl_unacked(&dev), (long)(queued - dropped));
    expect("the next sequence", (long)pl_next_seq(&dev), (long)(queued + 1));
    pl_close(&dev);
    return failed;
}
