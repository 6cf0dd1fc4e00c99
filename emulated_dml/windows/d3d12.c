/* d3d12.dll for the Windows lane's real route (.ci/windows-lane with DMLSHIM_WINDOWS_D3D12=DIR):
 * D3D12's entry points, forwarded to a real D3D12 library (a vkd3d-proton build's d3d12.dll,
 * D3D12 on Vulkan, here on Mesa's lavapipe through wine's winevulkan), with what the
 * torch-directml wheel's DirectML.dll needs and that library reports otherwise:
 *
 * - tiled resources reported absent (ID3D12Device::CheckFeatureSupport, D3D12_OPTIONS). With
 *   TiledResourcesTier 1 reported, DirectML.dll's DMLCreateDevice fails with
 *   DXGI_ERROR_UNSUPPORTED (0x887A0004: the wheel raises "RuntimeError: unknown error", wine
 *   having no text for it), and on the Linux wheel the same report makes its reserved resources
 *   alias on a software adapter (emulated_dml/wheel/wsl_d3d12.c adapts it the same way).
 *
 * Nothing else needs adapting on Windows: the library's COM methods use the Windows calling
 * convention (no by-value struct returns to fix, unlike WSL's), its fence waits block on a NULL
 * event, and it finds the adapter torch-directml passes (a DXCore adapter, dxcore.c) by LUID.
 *
 * The real library lies beside this one as REAL_D3D12 (its d3d12core.dll too, loaded by name);
 * .ci/windows-lane copies both there and builds this file with mingw-w64. The library itself
 * stays unmodified: its device vtable (static data, one for every device) is patched in place
 * once, when the first device is created. Ordinals 101 and 102 are D3D12's own
 * (torch_directml_native.pyd imports D3D12CreateDevice by ordinal): d3d12.def. */
#define WIN32_LEAN_AND_MEAN
#include <windows.h>
#include <stdint.h>

#ifndef REAL_D3D12
#define REAL_D3D12 L"vkd3d-proton-d3d12.dll"
#endif

enum {
    /* IUnknown (3), ID3D12Object (4), GetNodeCount, CreateCommandQueue,
     * CreateCommandAllocator, CreateGraphicsPipelineState, CreateComputePipelineState,
     * CreateCommandList, then CheckFeatureSupport */
    DEVICE_CHECK_FEATURE_SUPPORT = 13,
    D3D12_FEATURE_D3D12_OPTIONS = 0,
    D3D12_OPTIONS_TILED_RESOURCES_TIER_OFFSET = 12, /* after two BOOLs and an enum */
};

typedef HRESULT(WINAPI *CheckFeatureSupportFn)(void *, int32_t, void *, UINT);
typedef struct { void **lpVtbl; } IObj;

static HMODULE real_lib;
static INIT_ONCE load_once = INIT_ONCE_STATIC_INIT;
static INIT_ONCE patch_once = INIT_ONCE_STATIC_INIT;
static CheckFeatureSupportFn original_check_feature_support;

/* The real library, from this DLL's own folder: a load by name would find this DLL again. */
static BOOL CALLBACK load_real(INIT_ONCE *once, void *param, void **context) {
    WCHAR path[MAX_PATH + 64];
    HMODULE self = NULL;
    DWORD n;
    WCHAR *slash;
    (void)once; (void)param; (void)context;
    GetModuleHandleExW(GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS |
                       GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT, (LPCWSTR)&load_real, &self);
    n = GetModuleFileNameW(self, path, MAX_PATH);
    if (n == 0 || n >= MAX_PATH)
        return TRUE;
    slash = wcsrchr(path, L'\\');
    if (slash == NULL)
        return TRUE;
    lstrcpyW(slash + 1, REAL_D3D12);
    real_lib = LoadLibraryW(path);
    return TRUE;
}

static FARPROC real(const char *name) {
    InitOnceExecuteOnce(&load_once, load_real, NULL, NULL);
    return real_lib ? GetProcAddress(real_lib, name) : NULL;
}

/* -- the adaptation ------------------------------------------------------------------------- */

static HRESULT WINAPI device_CheckFeatureSupport(void *self, int32_t feature, void *data,
                                                 UINT size) {
    HRESULT hr = original_check_feature_support(self, feature, data, size);
    if (SUCCEEDED(hr) && feature == D3D12_FEATURE_D3D12_OPTIONS && data != NULL &&
        size >= D3D12_OPTIONS_TILED_RESOURCES_TIER_OFFSET + 4)
        ZeroMemory((char *)data + D3D12_OPTIONS_TILED_RESOURCES_TIER_OFFSET, 4);
    return hr;
}

static BOOL CALLBACK patch_device_vtable(INIT_ONCE *once, void *device, void **context) {
    void **slot = &((IObj *)device)->lpVtbl[DEVICE_CHECK_FEATURE_SUPPORT];
    DWORD protection;
    (void)once; (void)context;
    if (!VirtualProtect(slot, sizeof(*slot), PAGE_READWRITE, &protection))
        return FALSE;
    original_check_feature_support = (CheckFeatureSupportFn)*slot;
    *slot = (void *)device_CheckFeatureSupport;
    VirtualProtect(slot, sizeof(*slot), protection, &protection);
    return TRUE;
}

/* -- D3D12's entry points ------------------------------------------------------------------- */

#define FORWARD(name, params, ...)                                                \
    typedef HRESULT(WINAPI * Fn) params;                                          \
    Fn fn = (Fn)(void (*)(void))real(name);                                       \
    if (fn == NULL)                                                               \
        return E_NOINTERFACE; /* no real library beside this one */               \
    return fn(__VA_ARGS__)

HRESULT WINAPI D3D12CreateDevice(void *adapter, int level, REFIID iid, void **device) {
    typedef HRESULT(WINAPI * Fn)(void *, int, REFIID, void **);
    Fn fn = (Fn)(void (*)(void))real("D3D12CreateDevice");
    HRESULT hr;
    if (fn == NULL)
        return E_NOINTERFACE;
    hr = fn(adapter, level, iid, device);
    if (SUCCEEDED(hr) && device != NULL && *device != NULL &&
        !InitOnceExecuteOnce(&patch_once, patch_device_vtable, *device, NULL)) {
        ((ULONG(WINAPI *)(void *))((IObj *)*device)->lpVtbl[2])(*device); /* Release */
        *device = NULL;
        return E_FAIL;
    }
    return hr;
}

HRESULT WINAPI D3D12GetDebugInterface(REFIID iid, void **debug) {
    FORWARD("D3D12GetDebugInterface", (REFIID, void **), iid, debug);
}

HRESULT WINAPI D3D12GetInterface(REFCLSID clsid, REFIID iid, void **out) {
    FORWARD("D3D12GetInterface", (REFCLSID, REFIID, void **), clsid, iid, out);
}

HRESULT WINAPI D3D12EnableExperimentalFeatures(UINT count, const IID *iids, void *configs,
                                               UINT *sizes) {
    FORWARD("D3D12EnableExperimentalFeatures", (UINT, const IID *, void *, UINT *),
            count, iids, configs, sizes);
}

HRESULT WINAPI D3D12SerializeRootSignature(const void *desc, int version, void **blob,
                                           void **errors) {
    FORWARD("D3D12SerializeRootSignature", (const void *, int, void **, void **),
            desc, version, blob, errors);
}

HRESULT WINAPI D3D12SerializeVersionedRootSignature(const void *desc, void **blob,
                                                    void **errors) {
    FORWARD("D3D12SerializeVersionedRootSignature",
            (const void *, void **, void **), desc, blob, errors);
}

HRESULT WINAPI D3D12CreateRootSignatureDeserializer(const void *data, SIZE_T size, REFIID iid,
                                                    void **out) {
    FORWARD("D3D12CreateRootSignatureDeserializer",
            (const void *, SIZE_T, REFIID, void **), data, size, iid, out);
}

HRESULT WINAPI D3D12CreateVersionedRootSignatureDeserializer(const void *data, SIZE_T size,
                                                             REFIID iid, void **out) {
    FORWARD("D3D12CreateVersionedRootSignatureDeserializer",
            (const void *, SIZE_T, REFIID, void **), data, size, iid, out);
}
