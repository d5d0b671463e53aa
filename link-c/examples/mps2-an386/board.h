/*
 * board.h: what the C firmware needs of QEMU's mps2-an386 board: a millisecond clock, datagrams over UART0 (one
 * SLIP frame each), and flash pages kept in a host file across power cuts (QEMU SIGKILLed). docs/devices.md says how
 * each maps to the board; the Rust board support in firmware/qemu-m4/src/board/ does the same for Rust firmware.
 */
#ifndef BOARD_H
#define BOARD_H

#include <stddef.h>
#include <stdint.h>

/* A semihosting call (`bkpt 0xab`, answered by QEMU on the host): op in r0, the block's address in r1. */
int semihost_call(int op, void *block);

/* Milliseconds since the first call: the dual timer's timer 1, read when asked (call it at least every 12 h). */
uint64_t board_now_ms(void);

/* UART0: enables it (polled, no interrupts). */
void uart_init(void);
/* Sends one datagram as one SLIP frame; returns once its last byte is in the transmit register. */
void uart_send(const uint8_t *datagram, size_t len);
/* Takes the bytes that have arrived, never waiting: 1 and *len when they end a frame (the datagram is
 * buf[0..*len]), else 0. A frame that has begun stays in buf between calls: pass the same buffer each time. A
 * frame longer than cap, or with a bad escape, is dropped whole and counted. */
int uart_recv(uint8_t *buf, size_t cap, size_t *len);
/* Frames dropped so far. */
uint32_t uart_dropped(void);

/* The flash: FLASH_PAGES pages of FLASH_PAGE bytes in the host file at path (made erased if missing), by NOR
 * rules, programmed and erased in 8-byte units that are each one host write (a cut leaves a unit whole). */
#define FLASH_PAGE 4096u
#define FLASH_PAGES 16u
#define FLASH_UNIT 8u
int flash_open(const char *path);
int flash_read(void *ctx, uint16_t page, uint32_t offset, uint8_t *buf, size_t len);
int flash_program(void *ctx, uint16_t page, uint32_t offset, const uint8_t *data, size_t len);
int flash_erase(void *ctx, uint16_t page);

#endif
