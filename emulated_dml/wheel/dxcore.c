/* libdxcore.so, built twice: -DEMU_WSL gives WSL's library (EMU_ADAPTERS adapters, float64 per
 * EMU_FLOAT64, EMU_MEMORY_MIB of video memory each); without it, the empty link stub torch-directml ships in its own folder. */
#include <stdio.h>
#include "dxcore.h"

#ifdef EMU_WSL
#ifndef EMU_ADAPTERS
#define EMU_ADAPTERS 1
#endif
#ifndef EMU_FLOAT64
#define EMU_FLOAT64 0
#endif
#ifndef EMU_MEMORY_MIB
#define EMU_MEMORY_MIB 0
#endif

static struct emu_factory factory;

int DXCoreCreateAdapterFactory(const void *riid, void **out) {
    int i;
    (void)riid;
    if (out == NULL)
        return EMU_E_POINTER;
    factory.count = EMU_ADAPTERS > EMU_MAX_ADAPTERS ? EMU_MAX_ADAPTERS : EMU_ADAPTERS;
    for (i = 0; i < factory.count; i++) {
        snprintf(factory.adapters[i].name, sizeof factory.adapters[i].name,
                 "Emulated DirectML Adapter %d (emulated_dml)", i);
        factory.adapters[i].float64 = EMU_FLOAT64;
        factory.adapters[i].memory_mib = EMU_MEMORY_MIB;
    }
    *out = &factory;
    return 0;
}
#else
#include "stub.h"

/* The wheel's stub is `push rbp; mov rbp,rsp; pop rbp; ret`: it returns whatever eax holds,
 * which torch-directml reads as a failing HRESULT (a different negative number each run). */
int DXCoreCreateAdapterFactory(const void *riid, void **out) {
    (void)riid;
    (void)out;
    return emu_garbage_hresult();
}
#endif
