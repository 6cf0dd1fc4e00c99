/* The two entry points the stand-in's libdirectml.so needs from libdxcore.so and libd3d12.so,
 * with an adapter list shaped for the emulator (the real DXCore hands out COM objects). The
 * real libraries have no SONAME, so the loader finds them by file name: through
 * LD_LIBRARY_PATH or the loader cache (/etc/ld.so.cache, which lists /usr/lib/wsl/lib on WSL). */
#ifndef EMULATED_DML_DXCORE_H
#define EMULATED_DML_DXCORE_H

#define EMU_MAX_ADAPTERS 16
#define EMU_E_INVALIDARG ((int)0x80070057)
#define EMU_E_POINTER ((int)0x80004003)

struct emu_adapter {
    char name[128];
    int float64;
    int memory_mib; /* dedicated video memory; 0: as much as the host has */
};

struct emu_factory {
    int count;
    struct emu_adapter adapters[EMU_MAX_ADAPTERS];
};

int DXCoreCreateAdapterFactory(const void *riid, void **factory);
int D3D12CreateDevice(void *adapter, int minimum_feature_level, const void *riid, void **device);

#endif
