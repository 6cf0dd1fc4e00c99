/* libd3d12.so for the WSL harness's real route (python -m emulated_dml.wsl --d3d12 PATH): WSL's
 * D3D12 entry points, forwarded to a real D3D12 library (PATH, compiled in as REAL_D3D12; a
 * vkd3d-proton build: D3D12 on Vulkan), with what the torch-directml wheel expects of WSL's
 * library and that library does differently:
 *
 * - by-value struct returns (wsl_abi.h): the 13 methods returning a struct get a stub in their
 *   vtable slot that calls the library's method with a result pointer and returns the struct;
 * - tiled resources reported absent (with them, the wheel places its reserved resources so that
 *   they alias on a software adapter, and 8/16-bit results come back as garbage);
 * - ID3D12Fence::SetEventOnCompletion(value, NULL) blocks until the fence reaches value, as
 *   Windows' and WSL's D3D12 do (the wheel waits for its work that way);
 * - the adapter the wheel passes (a DXCore adapter, wsl_dxcore.c) is not one the library knows:
 *   the device is created on the library's default adapter.
 *
 * vtables are static data of the library, one per interface: they are patched in place once
 * (mprotect), after the first device exists, by creating one object of each kind. The library
 * itself stays unmodified. The exports carry the symbol version VER_1, as WSL's do. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "wsl_abi.h"

#ifndef REAL_D3D12
#error "build with -DREAL_D3D12=\"/path/to/the/real/libd3d12.so\""
#endif

typedef void *(*VFN)(void);
typedef struct { VFN *lpVtbl; } IObj;

static void *real_lib;
static pthread_mutex_t patch_lock = PTHREAD_MUTEX_INITIALIZER;

#define MAX_SLOTS 64
static struct { VFN *vtbl; int slot; VFN original; } slots[MAX_SLOTS];
static int slot_count;

static void die(const char *what) {
    fprintf(stderr, "emulated_dml wsl_d3d12: %s\n", what);
    abort();
}

static VFN original(void *self, int slot) {
    VFN *vtbl = ((IObj *)self)->lpVtbl;
    int i;
    for (i = 0; i < slot_count; i++)
        if (slots[i].vtbl == vtbl && slots[i].slot == slot)
            return slots[i].original;
    die("a patched method was called on an object whose vtable was not patched");
    return NULL;
}

static void patch(void *object, int slot, VFN stub) {
    VFN *vtbl = ((IObj *)object)->lpVtbl;
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)&vtbl[slot] & ~(uintptr_t)(page - 1);
    int i;
    if (vtbl[slot] == stub)
        return;
    for (i = 0; i < slot_count; i++)
        if (slots[i].vtbl == vtbl && slots[i].slot == slot)
            return;
    if (slot_count == MAX_SLOTS)
        die("too many vtable slots to patch");
    slots[slot_count].vtbl = vtbl;
    slots[slot_count].slot = slot;
    slots[slot_count].original = vtbl[slot];
    slot_count++;
    /* left writable: the page may hold other relocated data whose protection is not known */
    if (mprotect((void *)start, (size_t)page, PROT_READ | PROT_WRITE) != 0)
        die("mprotect of a vtable failed");
    vtbl[slot] = stub;
}

#define ORIG(self, slot, type) ((type)original((self), (slot)))
#define RELEASE(obj) (((unsigned long (*)(void *))((IObj *)(obj))->lpVtbl[2])(obj))

/* -- struct returns ------------------------------------------------------------------------ */

static D3D12_RESOURCE_ALLOCATION_INFO dev_GetResourceAllocationInfo(void *self, uint32_t mask,
                                                                    uint32_t count,
                                                                    const void *descs) {
    D3D12_RESOURCE_ALLOCATION_INFO r;
    ORIG(self, DEVICE_GET_RESOURCE_ALLOCATION_INFO, void *(*)(void *, void *, uint32_t, uint32_t,
                                                              const void *))(self, &r, mask,
                                                                             count, descs);
    return r;
}

static D3D12_RESOURCE_ALLOCATION_INFO dev_GetResourceAllocationInfo1(void *self, uint32_t mask,
                                                                     uint32_t count,
                                                                     const void *descs,
                                                                     void *info1) {
    D3D12_RESOURCE_ALLOCATION_INFO r;
    ORIG(self, DEVICE_GET_RESOURCE_ALLOCATION_INFO1,
         void *(*)(void *, void *, uint32_t, uint32_t, const void *, void *))(self, &r, mask,
                                                                               count, descs,
                                                                               info1);
    return r;
}

static D3D12_RESOURCE_ALLOCATION_INFO dev_GetResourceAllocationInfo2(void *self, uint32_t mask,
                                                                     uint32_t count,
                                                                     const void *descs,
                                                                     void *info1) {
    D3D12_RESOURCE_ALLOCATION_INFO r;
    ORIG(self, DEVICE_GET_RESOURCE_ALLOCATION_INFO2,
         void *(*)(void *, void *, uint32_t, uint32_t, const void *, void *))(self, &r, mask,
                                                                               count, descs,
                                                                               info1);
    return r;
}

static D3D12_RESOURCE_ALLOCATION_INFO dev_GetResourceAllocationInfo3(
    void *self, uint32_t mask, uint32_t count, const void *descs, const uint32_t *num_castable,
    const void *const *castable, void *info1) {
    D3D12_RESOURCE_ALLOCATION_INFO r;
    ORIG(self, DEVICE_GET_RESOURCE_ALLOCATION_INFO3,
         void *(*)(void *, void *, uint32_t, uint32_t, const void *, const uint32_t *,
                   const void *const *, void *))(self, &r, mask, count, descs, num_castable,
                                                 castable, info1);
    return r;
}

static D3D12_HEAP_PROPERTIES dev_GetCustomHeapProperties(void *self, uint32_t node_mask,
                                                         int32_t heap_type) {
    D3D12_HEAP_PROPERTIES r;
    ORIG(self, DEVICE_GET_CUSTOM_HEAP_PROPERTIES, void *(*)(void *, void *, uint32_t, int32_t))(
        self, &r, node_mask, heap_type);
    return r;
}

static LUID dev_GetAdapterLuid(void *self) {
    LUID r;
    ORIG(self, DEVICE_GET_ADAPTER_LUID, void *(*)(void *, void *))(self, &r);
    return r;
}

static D3D12_HEAP_DESC heap_GetDesc(void *self) {
    D3D12_HEAP_DESC r;
    ORIG(self, HEAP_GET_DESC, void *(*)(void *, void *))(self, &r);
    return r;
}

static D3D12_RESOURCE_DESC resource_GetDesc(void *self) {
    D3D12_RESOURCE_DESC r;
    ORIG(self, RESOURCE_GET_DESC, void *(*)(void *, void *))(self, &r);
    return r;
}

static D3D12_RESOURCE_DESC1 resource_GetDesc1(void *self) {
    D3D12_RESOURCE_DESC1 r;
    ORIG(self, RESOURCE_GET_DESC1, void *(*)(void *, void *))(self, &r);
    return r;
}

static D3D12_DESCRIPTOR_HEAP_DESC descriptor_heap_GetDesc(void *self) {
    D3D12_DESCRIPTOR_HEAP_DESC r;
    ORIG(self, DESCRIPTOR_HEAP_GET_DESC, void *(*)(void *, void *))(self, &r);
    return r;
}

static D3D12_CPU_DESCRIPTOR_HANDLE descriptor_heap_GetCPUStart(void *self) {
    D3D12_CPU_DESCRIPTOR_HANDLE r;
    ORIG(self, DESCRIPTOR_HEAP_GET_CPU_START, void *(*)(void *, void *))(self, &r);
    return r;
}

static D3D12_GPU_DESCRIPTOR_HANDLE descriptor_heap_GetGPUStart(void *self) {
    D3D12_GPU_DESCRIPTOR_HANDLE r;
    ORIG(self, DESCRIPTOR_HEAP_GET_GPU_START, void *(*)(void *, void *))(self, &r);
    return r;
}

static D3D12_COMMAND_QUEUE_DESC queue_GetDesc(void *self) {
    D3D12_COMMAND_QUEUE_DESC r;
    ORIG(self, QUEUE_GET_DESC, void *(*)(void *, void *))(self, &r);
    return r;
}

/* -- capabilities and waits ---------------------------------------------------------------- */

static HRESULT dev_CheckFeatureSupport(void *self, int32_t feature, void *data, uint32_t size) {
    HRESULT hr = ORIG(self, DEVICE_CHECK_FEATURE_SUPPORT,
                      HRESULT (*)(void *, int32_t, void *, uint32_t))(self, feature, data, size);
    if (hr >= 0 && feature == D3D12_FEATURE_D3D12_OPTIONS && data != NULL &&
        size >= D3D12_OPTIONS_TILED_RESOURCES_TIER_OFFSET + 4)
        memset((char *)data + D3D12_OPTIONS_TILED_RESOURCES_TIER_OFFSET, 0, 4);
    return hr;
}

static HRESULT fence_SetEventOnCompletion(void *self, uint64_t value, void *event) {
    uint64_t (*completed)(void *);
    struct timespec nap = {0, 20000};
    if (event != NULL)
        return ORIG(self, FENCE_SET_EVENT_ON_COMPLETION,
                    HRESULT (*)(void *, uint64_t, void *))(self, value, event);
    completed = (uint64_t (*)(void *))((IObj *)self)->lpVtbl[FENCE_GET_COMPLETED_VALUE];
    while (completed(self) < value)
        nanosleep(&nap, NULL);
    return S_OK;
}

/* -- patching, once, from a live device ---------------------------------------------------- */

static const GUID IID_QUEUE = {0x0ec870a6, 0x5d7e, 0x4c22,
                               {0x8c, 0xfc, 0x5b, 0xaa, 0xe0, 0x76, 0x16, 0xed}};
static const GUID IID_DESCRIPTOR_HEAP = {0x8efb471d, 0x616c, 0x4f49,
                                         {0x90, 0xf7, 0x12, 0x7b, 0xb7, 0x63, 0xfa, 0x51}};
static const GUID IID_HEAP = {0x6b3b2502, 0x6e51, 0x45b3,
                              {0x90, 0xee, 0x98, 0x84, 0x26, 0x5e, 0x8d, 0xf3}};
static const GUID IID_RESOURCE = {0x696442be, 0xa72e, 0x4059,
                                  {0xbc, 0x79, 0x5b, 0x5c, 0x98, 0x04, 0x0f, 0xad}};
static const GUID IID_FENCE = {0x0a753dcf, 0xc4d8, 0x4b91,
                               {0xad, 0xf6, 0xbe, 0x5a, 0x60, 0xd9, 0x5a, 0x76}};

static int patched;

/* Calls the library's own (unpatched) creation methods of the device: slot n, raw. */
#define DEVCALL(dev, slot, type) ((type)((IObj *)(dev))->lpVtbl[slot])

static void patch_from(void *dev) {
    void *obj = NULL;
    D3D12_COMMAND_QUEUE_DESC qdesc = {0, 0, 0, 0};
    D3D12_DESCRIPTOR_HEAP_DESC hdesc = {0 /* CBV_SRV_UAV */, 1, 0, 0};
    D3D12_HEAP_DESC heapdesc;
    D3D12_HEAP_PROPERTIES props = {1 /* DEFAULT */, 0, 0, 0, 0};
    D3D12_RESOURCE_DESC rdesc;

    patch(dev, DEVICE_CHECK_FEATURE_SUPPORT, (VFN)dev_CheckFeatureSupport);
    patch(dev, DEVICE_GET_RESOURCE_ALLOCATION_INFO, (VFN)dev_GetResourceAllocationInfo);
    patch(dev, DEVICE_GET_CUSTOM_HEAP_PROPERTIES, (VFN)dev_GetCustomHeapProperties);
    patch(dev, DEVICE_GET_ADAPTER_LUID, (VFN)dev_GetAdapterLuid);
    patch(dev, DEVICE_GET_RESOURCE_ALLOCATION_INFO1, (VFN)dev_GetResourceAllocationInfo1);
    patch(dev, DEVICE_GET_RESOURCE_ALLOCATION_INFO2, (VFN)dev_GetResourceAllocationInfo2);
    patch(dev, DEVICE_GET_RESOURCE_ALLOCATION_INFO3, (VFN)dev_GetResourceAllocationInfo3);

    if (DEVCALL(dev, DEVICE_CREATE_COMMAND_QUEUE,
                HRESULT (*)(void *, const void *, const GUID *, void **))(dev, &qdesc, &IID_QUEUE,
                                                                         &obj) < 0)
        die("CreateCommandQueue failed");
    patch(obj, QUEUE_GET_DESC, (VFN)queue_GetDesc);
    RELEASE(obj);

    if (DEVCALL(dev, DEVICE_CREATE_DESCRIPTOR_HEAP,
                HRESULT (*)(void *, const void *, const GUID *, void **))(
            dev, &hdesc, &IID_DESCRIPTOR_HEAP, &obj) < 0)
        die("CreateDescriptorHeap failed");
    patch(obj, DESCRIPTOR_HEAP_GET_DESC, (VFN)descriptor_heap_GetDesc);
    patch(obj, DESCRIPTOR_HEAP_GET_CPU_START, (VFN)descriptor_heap_GetCPUStart);
    patch(obj, DESCRIPTOR_HEAP_GET_GPU_START, (VFN)descriptor_heap_GetGPUStart);
    RELEASE(obj);

    memset(&heapdesc, 0, sizeof heapdesc);
    heapdesc.SizeInBytes = 65536;
    heapdesc.Properties = props;
    heapdesc.Flags = 0x4 | 0x80; /* DENY_RT_DS_TEXTURES | DENY_NON_RT_DS_TEXTURES: buffers */
    if (DEVCALL(dev, DEVICE_CREATE_HEAP,
                HRESULT (*)(void *, const void *, const GUID *, void **))(dev, &heapdesc,
                                                                         &IID_HEAP, &obj) < 0)
        die("CreateHeap failed");
    patch(obj, HEAP_GET_DESC, (VFN)heap_GetDesc);
    RELEASE(obj);

    memset(&rdesc, 0, sizeof rdesc);
    rdesc.Dimension = 1; /* BUFFER */
    rdesc.Width = 256;
    rdesc.Height = 1;
    rdesc.DepthOrArraySize = 1;
    rdesc.MipLevels = 1;
    rdesc.SampleCount = 1;
    rdesc.Layout = 1; /* ROW_MAJOR */
    if (DEVCALL(dev, DEVICE_CREATE_COMMITTED_RESOURCE,
                HRESULT (*)(void *, const void *, int32_t, const void *, int32_t, const void *,
                            const GUID *, void **))(dev, &props, 0, &rdesc, 0, NULL,
                                                    &IID_RESOURCE, &obj) < 0)
        die("CreateCommittedResource failed");
    patch(obj, RESOURCE_GET_DESC, (VFN)resource_GetDesc);
    patch(obj, RESOURCE_GET_DESC1, (VFN)resource_GetDesc1);
    RELEASE(obj);

    if (DEVCALL(dev, DEVICE_CREATE_FENCE,
                HRESULT (*)(void *, uint64_t, int32_t, const GUID *, void **))(dev, 0, 0,
                                                                               &IID_FENCE,
                                                                               &obj) < 0)
        die("CreateFence failed");
    patch(obj, FENCE_SET_EVENT_ON_COMPLETION, (VFN)fence_SetEventOnCompletion);
    RELEASE(obj);
}

static void *real(const char *name) {
    void *fn;
    if (real_lib == NULL) {
        real_lib = dlopen(REAL_D3D12, RTLD_NOW | RTLD_LOCAL);
        if (real_lib == NULL) {
            fprintf(stderr, "emulated_dml wsl_d3d12: cannot load %s: %s\n", REAL_D3D12,
                    dlerror());
            return NULL;
        }
    }
    fn = dlsym(real_lib, name);
    if (fn == NULL)
        fprintf(stderr, "emulated_dml wsl_d3d12: %s has no %s\n", REAL_D3D12, name);
    return fn;
}

#define EXPORT __attribute__((visibility("default")))

EXPORT HRESULT D3D12CreateDevice(void *adapter, int32_t feature_level, const GUID *iid,
                                 void **device) {
    PFN_D3D12_CREATE_DEVICE create = (PFN_D3D12_CREATE_DEVICE)real("D3D12CreateDevice");
    HRESULT hr;
    (void)adapter;
    if (create == NULL)
        return E_FAIL;
    hr = create(NULL, feature_level, iid, device);
    if (hr >= 0 && device != NULL && *device != NULL) {
        pthread_mutex_lock(&patch_lock);
        if (!patched) {
            patch_from(*device);
            patched = 1;
        }
        pthread_mutex_unlock(&patch_lock);
    }
    return hr;
}

/* The rest take and return no struct by value: forwarded as they are. */
#define FORWARD(name, params, args)                                   \
    EXPORT HRESULT name params {                                      \
        HRESULT (*fn) params = (HRESULT (*) params)real(#name);       \
        return fn == NULL ? E_NOTIMPL : fn args;                      \
    }

FORWARD(D3D12SerializeRootSignature, (const void *desc, int32_t version, void **blob,
                                      void **error), (desc, version, blob, error))
FORWARD(D3D12SerializeVersionedRootSignature, (const void *desc, void **blob, void **error),
        (desc, blob, error))
FORWARD(D3D12CreateRootSignatureDeserializer, (const void *data, size_t size, const GUID *iid,
                                               void **out), (data, size, iid, out))
FORWARD(D3D12CreateVersionedRootSignatureDeserializer, (const void *data, size_t size,
                                                        const GUID *iid, void **out),
        (data, size, iid, out))
FORWARD(D3D12GetDebugInterface, (const GUID *iid, void **out), (iid, out))
FORWARD(D3D12EnableExperimentalFeatures, (uint32_t count, const GUID *iids, void *configs,
                                          uint32_t *sizes), (count, iids, configs, sizes))
FORWARD(D3D12GetInterface, (const GUID *clsid, const GUID *iid, void **out), (clsid, iid, out))
