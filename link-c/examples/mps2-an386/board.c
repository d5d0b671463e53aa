/*
 * board.c: the board's clock, UART and flash for the C firmware (board.h; docs/devices.md, "On a microcontroller, in C").
 */
#include "board.h"

#include <fcntl.h>
#include <unistd.h>

int semihost_call(int op, void *block) {
    register int r0 __asm__("r0") = op;
    register void *r1 __asm__("r1") = block;
    __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

/* ---- the clock: CMSDK APB dual timer (0x40002000), timer 1, free-running, 25 MHz / 256, counting down ---- */

#define DUALTIMER 0x40002000u
#define TIMER1_VALUE (*(volatile uint32_t *)(DUALTIMER + 0x04))
#define TIMER1_CONTROL (*(volatile uint32_t *)(DUALTIMER + 0x08))
#define SYSCLK_HZ 25000000ull
#define PRESCALE 256ull

static int clock_started;
static uint32_t clock_last;
static uint64_t clock_ticks;

uint64_t board_now_ms(void) {
    if (!clock_started) {
        /* enabled, free-running, no interrupt, prescale 256, 32-bit */
        TIMER1_CONTROL = (1u << 7) | (2u << 2) | (1u << 1);
        clock_last = TIMER1_VALUE;
        clock_started = 1;
    }
    uint32_t now = TIMER1_VALUE;
    clock_ticks += (uint32_t)(clock_last - now); /* it counts down; a wrap is taken by the unsigned subtraction */
    clock_last = now;
    return clock_ticks * 1000ull * PRESCALE / SYSCLK_HZ;
}

/* ---- UART0: CMSDK APB UART (0x40004000), polled; SLIP (RFC 1055) frames ---- */

#define UART0 0x40004000u
#define UART_DATA (*(volatile uint32_t *)(UART0 + 0x00))
#define UART_STATE (*(volatile uint32_t *)(UART0 + 0x04))
#define UART_CTRL (*(volatile uint32_t *)(UART0 + 0x08))
#define UART_BAUDDIV (*(volatile uint32_t *)(UART0 + 0x10))
#define STATE_TX_FULL (1u << 0)
#define STATE_RX_FULL (1u << 1)
#define STATE_RX_OVERRUN (1u << 3)

#define SLIP_END 0xC0
#define SLIP_ESC 0xDB
#define SLIP_ESC_END 0xDC
#define SLIP_ESC_ESC 0xDD

static size_t rx_len;
static int rx_escaped, rx_dropping;
static uint32_t rx_dropped;

void uart_init(void) {
    UART_BAUDDIV = 16; /* the smallest divisor allowed */
    UART_CTRL = 3;     /* transmit and receive enabled */
}

static void put(uint8_t b) {
    while (UART_STATE & STATE_TX_FULL) {
    }
    UART_DATA = b;
}

void uart_send(const uint8_t *datagram, size_t len) {
    put(SLIP_END);
    for (size_t i = 0; i < len; i++) {
        if (datagram[i] == SLIP_END) {
            put(SLIP_ESC);
            put(SLIP_ESC_END);
        } else if (datagram[i] == SLIP_ESC) {
            put(SLIP_ESC);
            put(SLIP_ESC_ESC);
        } else {
            put(datagram[i]);
        }
    }
    put(SLIP_END);
}

static void drop_frame(void) {
    rx_dropping = 1;
    rx_dropped++;
}

int uart_recv(uint8_t *buf, size_t cap, size_t *len) {
    for (;;) {
        uint32_t state = UART_STATE;
        if (state & STATE_RX_OVERRUN) { /* a byte was lost: so is its frame */
            UART_STATE = STATE_RX_OVERRUN;
            if (!rx_dropping) drop_frame();
        }
        if (!(state & STATE_RX_FULL)) return 0;
        uint8_t b = (uint8_t)UART_DATA;
        if (b == SLIP_END) {
            if (rx_escaped && !rx_dropping) rx_dropped++;
            int good = !rx_dropping && !rx_escaped && rx_len > 0;
            *len = rx_len;
            rx_len = 0;
            rx_escaped = rx_dropping = 0;
            if (good) return 1;
            continue;
        }
        if (rx_dropping) continue;
        if (rx_escaped) {
            rx_escaped = 0;
            if (b == SLIP_ESC_END) {
                b = SLIP_END;
            } else if (b == SLIP_ESC_ESC) {
                b = SLIP_ESC;
            } else {
                drop_frame();
                continue;
            }
        } else if (b == SLIP_ESC) {
            rx_escaped = 1;
            continue;
        }
        if (rx_len >= cap) {
            drop_frame();
            continue;
        }
        buf[rx_len++] = b;
    }
}

uint32_t uart_dropped(void) { return rx_dropped; }

/* ---- the flash: pages in a host file (newlib's semihosting open/lseek/read/write) ---- */

static int flash_fd = -1;

static int write_unit(uint32_t at, const uint8_t unit[FLASH_UNIT]) {
    return lseek(flash_fd, (off_t)at, SEEK_SET) == (off_t)at && write(flash_fd, unit, FLASH_UNIT) == FLASH_UNIT
               ? 0
               : -1;
}

int flash_open(const char *path) {
    /* O_RDWR alone opens an existing file as it is ("r+b"); O_CREAT would truncate it ("w+b"). */
    flash_fd = open(path, O_RDWR);
    if (flash_fd < 0) flash_fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (flash_fd < 0) return -1;
    off_t size = lseek(flash_fd, 0, SEEK_END);
    if (size < 0) return -1;
    /* A new part is erased. A file a cut left short is completed from where it ends, unit by unit. */
    static const uint8_t ones[FLASH_UNIT] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
    for (uint32_t at = (uint32_t)size - (uint32_t)size % FLASH_UNIT; at < FLASH_PAGE * FLASH_PAGES;
         at += FLASH_UNIT) {
        if (write_unit(at, ones)) return -1;
    }
    return 0;
}

static int in_range(uint16_t page, uint32_t offset, size_t len) {
    return page < FLASH_PAGES && offset <= FLASH_PAGE && len <= FLASH_PAGE - offset;
}

int flash_read(void *ctx, uint16_t page, uint32_t offset, uint8_t *buf, size_t len) {
    (void)ctx;
    if (!in_range(page, offset, len)) return -1;
    off_t at = (off_t)page * FLASH_PAGE + offset;
    return lseek(flash_fd, at, SEEK_SET) == at && read(flash_fd, buf, len) == (int)len ? 0 : -1;
}

int flash_program(void *ctx, uint16_t page, uint32_t offset, const uint8_t *data, size_t len) {
    (void)ctx;
    if (!in_range(page, offset, len) || offset % FLASH_UNIT || len % FLASH_UNIT) return -1;
    for (size_t done = 0; done < len; done += FLASH_UNIT) {
        uint8_t unit[FLASH_UNIT];
        uint32_t at = page * FLASH_PAGE + offset + (uint32_t)done;
        if (flash_read(ctx, page, offset + (uint32_t)done, unit, FLASH_UNIT)) return -1;
        for (unsigned i = 0; i < FLASH_UNIT; i++) unit[i] &= data[done + i]; /* NOR: a program only clears bits */
        if (write_unit(at, unit)) return -1;
    }
    return 0;
}

int flash_erase(void *ctx, uint16_t page) {
    (void)ctx;
    if (page >= FLASH_PAGES) return -1;
    static const uint8_t ones[FLASH_UNIT] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
    for (uint32_t at = 0; at < FLASH_PAGE; at += FLASH_UNIT) {
        if (write_unit(page * FLASH_PAGE + at, ones)) return -1;
    }
    return 0;
}
