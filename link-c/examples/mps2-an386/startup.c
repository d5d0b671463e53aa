/*
 * startup.c: the reset handler and vector table of the C firmware on mps2-an386, and its command line.
 *
 * What a part's vendor startup file does (CMSIS's startup_*.s), written out because the board has none here:
 * copy .data from flash to RAM, zero .bss, give the FPU to the program (the library and newlib are built for the
 * hard-float ABI), open newlib's semihosting streams (stdout is QEMU's stdout), read the command line QEMU was given
 * (`-semihosting-config arg=...`) into argv, and call main; main's return is the exit status QEMU exits with.
 * Every fault ends the run with status 101, as a panic of the Rust firmware does.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "board.h"

extern uint32_t __stack_top__, __data_start__, __data_end__, __data_load__, __bss_start__, __bss_end__;
extern void initialise_monitor_handles(void);
int main(int argc, char **argv);

void reset_handler(void);

static void fault_handler(void) { exit(101); }

#define SYS_GET_CMDLINE 0x15
#define CPACR (*(volatile uint32_t *)0xE000ED88)

static char cmdline[512];
static char *args[33];

void reset_handler(void) {
    memcpy(&__data_start__, &__data_load__, (size_t)((char *)&__data_end__ - (char *)&__data_start__));
    memset(&__bss_start__, 0, (size_t)((char *)&__bss_end__ - (char *)&__bss_start__));
    CPACR |= 0xFu << 20; /* CP10 and CP11 (the FPU): full access */
    __asm__ volatile("dsb\n\tisb" ::: "memory");
    initialise_monitor_handles();

    /* The words QEMU was given, split at spaces (a word holds none; the harness makes sure of it). */
    uintptr_t block[2] = {(uintptr_t)cmdline, sizeof cmdline - 1};
    int argc = 0;
    if (semihost_call(SYS_GET_CMDLINE, block) == 0) {
        cmdline[block[1] < sizeof cmdline ? block[1] : sizeof cmdline - 1] = 0;
        for (char *p = cmdline; *p && argc < 32;) {
            while (*p == ' ') *p++ = 0;
            if (*p) args[argc++] = p;
            while (*p && *p != ' ') p++;
        }
    }
    args[argc] = NULL;
    exit(main(argc, args));
}

/* The Cortex-M4's first 16 vectors: the initial stack pointer, reset, and the core's faults. */
__attribute__((section(".vectors"), used)) static void (*const vectors[16])(void) = {
    (void (*)(void))(uintptr_t)&__stack_top__,
    reset_handler,
    fault_handler, /* NMI */
    fault_handler, /* HardFault */
    fault_handler, /* MemManage */
    fault_handler, /* BusFault */
    fault_handler, /* UsageFault */
};
