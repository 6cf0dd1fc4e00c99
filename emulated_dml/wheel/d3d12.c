/* libd3d12.so, built twice like dxcore.c: WSL's (-DEMU_WSL) or the wheel's empty stub. */
#include <stddef.h>
#include "dxcore.h"

#ifdef EMU_WSL
int D3D12CreateDevice(void *adapter, int minimum_feature_level, const void *riid, void **device) {
    (void)minimum_feature_level;
    (void)riid;
    if (adapter == NULL)
        return EMU_E_INVALIDARG;
    if (device != NULL)
        *device = adapter;
    return 0;
}
#else
#include "stub.h"

int D3D12CreateDevice(void *adapter, int minimum_feature_level, const void *riid, void **device) {
    (void)adapter;
    (void)minimum_feature_level;
    (void)riid;
    (void)device;
    return emu_garbage_hresult();
}
#endif
