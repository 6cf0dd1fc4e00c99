/* The stand-in's libdirectml.so: links libd3d12.so and libdxcore.so by file name (NEEDED, no
 * RPATH), as the real one does, and enumerates adapters through them. A negative return is
 * the failing HRESULT, which the Python side raises as "Unknown error <n>", as the wheel does. */
#include <string.h>
#include "dxcore.h"

static const char IID_FACTORY[16] = "IDXCoreAdapterFa";
static const char IID_DEVICE[16] = "ID3D12Device....";

static int enumerate(struct emu_factory **out) {
    void *factory = NULL;
    int hr = DXCoreCreateAdapterFactory(IID_FACTORY, &factory);
    int i;
    if (hr < 0)
        return hr;
    if (factory == NULL)
        return EMU_E_POINTER;
    *out = (struct emu_factory *)factory;
    for (i = 0; i < (*out)->count; i++) {
        void *device = NULL;
        hr = D3D12CreateDevice(&(*out)->adapters[i], 0xb000, IID_DEVICE, &device);
        if (hr < 0)
            return hr;
    }
    return (*out)->count;
}

int dml_get_device_count(void) {
    struct emu_factory *factory = NULL;
    return enumerate(&factory);
}

/* Copies the adapter name into buf; returns its length counting the terminating NUL, which
 * the wheel's get_device_name passes on to Python (the name ends with "\0"). */
int dml_get_device_name(int index, char *buf, int size) {
    struct emu_factory *factory = NULL;
    int n = enumerate(&factory);
    int len;
    if (n < 0)
        return n;
    if (index < 0 || index >= n || size < 1)
        return EMU_E_INVALIDARG;
    len = (int)strlen(factory->adapters[index].name) + 1;
    if (len > size)
        len = size;
    memcpy(buf, factory->adapters[index].name, (size_t)len - 1);
    buf[len - 1] = '\0';
    return len;
}

int dml_has_float64_support(int index) {
    struct emu_factory *factory = NULL;
    int n = enumerate(&factory);
    if (n < 0)
        return n;
    if (index < 0 || index >= n)
        return EMU_E_INVALIDARG;
    return factory->adapters[index].float64 ? 1 : 0;
}

/* The adapter's dedicated video memory in MiB (0: unlimited), or the failing HRESULT. */
int dml_get_adapter_memory_mib(int index) {
    struct emu_factory *factory = NULL;
    int n = enumerate(&factory);
    if (n < 0)
        return n;
    if (index < 0 || index >= n)
        return EMU_E_INVALIDARG;
    return factory->adapters[index].memory_mib;
}
