// What both stand-in libraries (fake_cuda.c, fake_nccl.c) carry: the call counter the driver
// reads back and the per-call delay it sets (microseconds; 0 = return at once).
#ifndef FAKE_COMMON_H
#define FAKE_COMMON_H

#include <stddef.h>
#include <time.h>

volatile unsigned long long fake_calls;
unsigned int fake_delay_us;

static void delay(void) {
    if (fake_delay_us == 0)
        return;
    struct timespec ts = {fake_delay_us / 1000000, (long)(fake_delay_us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

#endif
