/* What an empty stub function returns: garbage, a negative HRESULT that differs per run. */
#ifndef EMULATED_DML_STUB_H
#define EMULATED_DML_STUB_H
#include <time.h>
#include <unistd.h>

static int emu_garbage_hresult(void) {
    struct timespec ts;
    unsigned int x;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    x = ((unsigned int)getpid() * 2654435761u) ^ (unsigned int)ts.tv_nsec;
    return (int)(0x80000001u | (x & 0x7ffffffeu));
}
#endif
