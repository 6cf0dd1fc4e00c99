/* libdxcore.so for the WSL harness's real route: the DXCore adapter factory the torch-directml
 * wheel enumerates adapters with, reporting the one Vulkan device that the real D3D12 library
 * (wsl_d3d12.c) creates its device on. WSL's libdxcore.so talks to the host's driver through
 * /dev/dxg; this one asks Vulkan (libvulkan.so.1) for the device's name, IDs and memory, and the
 * D3D12 device (libd3d12.so, found as the wheel finds it) for the adapter's LUID, so that the
 * LUID matches the device's GetAdapterLuid as on WSL.
 *
 * The wheel calls (seen on its Windows build as well): DXCoreCreateAdapterFactory,
 * CreateAdapterList (attribute D3D12_CORE_COMPUTE), Sort, GetAdapterCount, GetAdapter,
 * GetProperty (IsHardware, HardwareID, DriverDescription with its size asked first,
 * DriverVersion, DedicatedAdapterMemory, IsIntegrated), IsAttributeSupported, GetAdapterByLuid.
 * COM objects in C: every method takes `this` first (System V convention, as the wheel calls
 * them); C++'s `bool` is C's _Bool. The adapter says it is hardware: the wheel leaves software
 * adapters out.
 *
 * -DADAPTERS=N reports N adapters, all the same device (for multi-adapter code paths: one rank
 * per adapter); adapter i's LUID is the device's plus i, its name the device's with " #i" after
 * the first. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "wsl_abi.h"

/* The few Vulkan 1.0 declarations used (from vulkan_core.h; no build dependency on its headers). */
typedef struct VkInstance_T *VkInstance;
typedef struct VkPhysicalDevice_T *VkPhysicalDevice;
typedef void (*PFN_vkVoidFunction)(void);
typedef PFN_vkVoidFunction (*PFN_vkGetInstanceProcAddr)(VkInstance, const char *);
typedef struct {
    int32_t sType; /* VK_STRUCTURE_TYPE_APPLICATION_INFO = 0 */
    const void *pNext;
    const char *pApplicationName;
    uint32_t applicationVersion;
    const char *pEngineName;
    uint32_t engineVersion, apiVersion;
} VkApplicationInfo;
typedef struct {
    int32_t sType; /* VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO = 1 */
    const void *pNext;
    uint32_t flags;
    const VkApplicationInfo *pApplicationInfo;
    uint32_t enabledLayerCount;
    const char *const *ppEnabledLayerNames;
    uint32_t enabledExtensionCount;
    const char *const *ppEnabledExtensionNames;
} VkInstanceCreateInfo;
typedef int32_t (*PFN_vkCreateInstance)(const VkInstanceCreateInfo *, const void *, VkInstance *);
typedef int32_t (*PFN_vkEnumeratePhysicalDevices)(VkInstance, uint32_t *, VkPhysicalDevice *);
typedef void (*PFN_vkGetPhysicalDevice)(VkPhysicalDevice, void *);
typedef void (*PFN_vkDestroyInstance)(VkInstance, const void *);
/* VkPhysicalDeviceProperties: apiVersion, driverVersion, vendorID, deviceID, deviceType, then
 * deviceName[256] at byte 20 (the limits that follow are not read: a large enough buffer) */
#define VK_PROPS_DRIVER_VERSION 1
#define VK_PROPS_VENDOR_ID 2
#define VK_PROPS_DEVICE_ID 3
#define VK_PROPS_DEVICE_TYPE 4
#define VK_PROPS_DEVICE_NAME 20
#define VK_DEVICE_TYPE_INTEGRATED_GPU 1
#define VK_DEVICE_TYPE_CPU 4
/* VkPhysicalDeviceMemoryProperties: memoryTypeCount, memoryTypes[32] (8 bytes each), then
 * memoryHeapCount at byte 260 and memoryHeaps[16] at 264: {VkDeviceSize size; flags; pad} */
typedef struct {
    uint32_t memoryTypeCount;
    uint32_t memoryTypes[32][2];
    uint32_t memoryHeapCount;
    struct { uint64_t size; uint32_t flags; } memoryHeaps[16];
} VkMemoryProperties;
#define VK_MEMORY_HEAP_DEVICE_LOCAL 0x1
_Static_assert(sizeof(VkMemoryProperties) == 520, "VkPhysicalDeviceMemoryProperties");

#define EXPORT __attribute__((visibility("default")))

enum {
    PROP_INSTANCE_LUID = 0,
    PROP_DRIVER_VERSION = 1,
    PROP_DRIVER_DESCRIPTION = 2,
    PROP_HARDWARE_ID = 3,
    PROP_KMD_MODEL_VERSION = 4,
    PROP_COMPUTE_PREEMPTION = 5,
    PROP_GRAPHICS_PREEMPTION = 6,
    PROP_DEDICATED_ADAPTER_MEMORY = 7,
    PROP_DEDICATED_SYSTEM_MEMORY = 8,
    PROP_SHARED_SYSTEM_MEMORY = 9,
    PROP_ACG_COMPATIBLE = 10,
    PROP_IS_HARDWARE = 11,
    PROP_IS_INTEGRATED = 12,
    PROP_IS_DETACHABLE = 13,
    PROP_HARDWARE_ID_PARTS = 14,
};
#define STATE_ADAPTER_MEMORY_BUDGET 1
#ifndef ADAPTERS
#define ADAPTERS 1
#endif

static struct {
    int ready;
    char name[256];
    uint32_t vendor, device;
    uint64_t driver_version, dedicated, shared;
    int integrated;
    int luid_ready;
    LUID luid;
} info;
static pthread_mutex_t info_lock = PTHREAD_MUTEX_INITIALIZER;

static int read_vulkan(void) {
    void *vk = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    PFN_vkGetInstanceProcAddr gipa;
    PFN_vkCreateInstance create;
    PFN_vkEnumeratePhysicalDevices enumerate;
    PFN_vkGetPhysicalDevice properties, memory;
    PFN_vkDestroyInstance destroy;
    VkApplicationInfo app = {0, NULL, "emulated_dml", 1, NULL, 0, (1u << 22) | (1u << 12)};
    VkInstanceCreateInfo ci = {1, NULL, 0, &app, 0, NULL, 0, NULL};
    VkInstance instance;
    VkPhysicalDevice phys[8];
    uint32_t n = 8, i;
    uint64_t props_buffer[1024]; /* VkPhysicalDeviceProperties is 824 bytes */
    const uint32_t *props = (const uint32_t *)props_buffer;
    VkMemoryProperties mem;

    if (vk == NULL) {
        fprintf(stderr, "emulated_dml wsl_dxcore: cannot load libvulkan.so.1: %s\n", dlerror());
        return -1;
    }
    gipa = (PFN_vkGetInstanceProcAddr)dlsym(vk, "vkGetInstanceProcAddr");
    create = gipa ? (PFN_vkCreateInstance)gipa(NULL, "vkCreateInstance") : NULL;
    if (create == NULL || create(&ci, NULL, &instance) != 0) {
        fprintf(stderr, "emulated_dml wsl_dxcore: vkCreateInstance failed\n");
        return -1;
    }
    enumerate = (PFN_vkEnumeratePhysicalDevices)gipa(instance, "vkEnumeratePhysicalDevices");
    properties = (PFN_vkGetPhysicalDevice)gipa(instance, "vkGetPhysicalDeviceProperties");
    memory = (PFN_vkGetPhysicalDevice)gipa(instance, "vkGetPhysicalDeviceMemoryProperties");
    destroy = (PFN_vkDestroyInstance)gipa(instance, "vkDestroyInstance");
    if (enumerate(instance, &n, phys) < 0 || n == 0) {
        fprintf(stderr, "emulated_dml wsl_dxcore: no Vulkan device\n");
        destroy(instance, NULL);
        return -1;
    }
    /* the device vkd3d-proton picks by default: the first one */
    memset(props_buffer, 0, sizeof props_buffer);
    properties(phys[0], props_buffer);
    memory(phys[0], &mem);
    snprintf(info.name, sizeof info.name, "%s", (const char *)props_buffer + VK_PROPS_DEVICE_NAME);
    info.vendor = props[VK_PROPS_VENDOR_ID];
    info.device = props[VK_PROPS_DEVICE_ID];
    info.driver_version = props[VK_PROPS_DRIVER_VERSION];
    info.integrated = props[VK_PROPS_DEVICE_TYPE] == VK_DEVICE_TYPE_INTEGRATED_GPU ||
                      props[VK_PROPS_DEVICE_TYPE] == VK_DEVICE_TYPE_CPU;
    for (i = 0; i < mem.memoryHeapCount && i < 16; i++) {
        if (mem.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL) {
            if (info.dedicated == 0)
                info.dedicated = mem.memoryHeaps[i].size;
        } else if (info.shared == 0) {
            info.shared = mem.memoryHeaps[i].size;
        }
    }
    destroy(instance, NULL);
    return 0;
}

static int ensure_info(void) {
    int ok;
    pthread_mutex_lock(&info_lock);
    if (!info.ready && read_vulkan() == 0)
        info.ready = 1;
    ok = info.ready;
    pthread_mutex_unlock(&info_lock);
    return ok;
}

static const GUID IID_DEVICE = {0x189819f1, 0x1db6, 0x4b57,
                                {0xbe, 0x54, 0x18, 0x21, 0x33, 0x9b, 0x85, 0xf7}};

/* The adapter's LUID is the D3D12 device's: made once, through the libd3d12.so the wheel uses. */
static int ensure_luid(void) {
    void *d3d12, *dev = NULL;
    PFN_D3D12_CREATE_DEVICE create;
    int ok;
    pthread_mutex_lock(&info_lock);
    if (!info.luid_ready) {
        d3d12 = dlopen("libd3d12.so", RTLD_NOW | RTLD_LOCAL);
        create = d3d12 ? (PFN_D3D12_CREATE_DEVICE)dlsym(d3d12, "D3D12CreateDevice") : NULL;
        if (create != NULL && create(NULL, 0xb000, &IID_DEVICE, &dev) >= 0 && dev != NULL) {
            void **vtbl = *(void ***)dev;
            info.luid = ((LUID (*)(void *))vtbl[DEVICE_GET_ADAPTER_LUID])(dev);
            ((unsigned long (*)(void *))vtbl[2])(dev);
            info.luid_ready = 1;
        } else {
            fprintf(stderr, "emulated_dml wsl_dxcore: no D3D12 device for the adapter's LUID\n");
        }
    }
    ok = info.luid_ready;
    pthread_mutex_unlock(&info_lock);
    return ok;
}

/* -- the three objects: static singletons (their lifetime is the process's) ----------------- */

typedef struct { void *const *lpVtbl; int index; } Obj;
static Obj factory_obj, list_obj, adapter_objs[ADAPTERS];

static const GUID IID_UNKNOWN = {0x00000000, 0x0000, 0x0000,
                                 {0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x46}};
static const GUID IID_FACTORY = {0x78ee5945, 0xc36e, 0x4b13,
                                 {0xa6, 0x69, 0x00, 0x5d, 0xd1, 0x1c, 0x0f, 0x06}};
static const GUID IID_LIST = {0x526c7776, 0x40e9, 0x459b,
                              {0xb7, 0x11, 0xf3, 0x2a, 0xd7, 0x6d, 0xfc, 0x28}};
static const GUID IID_ADAPTER = {0xf0db4c7f, 0xfe5a, 0x42a2,
                                 {0xbd, 0x62, 0xf2, 0xa6, 0xcf, 0x6f, 0xc8, 0x3e}};

static int same(const GUID *a, const GUID *b) { return memcmp(a, b, sizeof *a) == 0; }

static HRESULT give(Obj *obj, const GUID *own, const GUID *iid, void **out) {
    if (out == NULL)
        return E_POINTER;
    *out = NULL;
    if (iid != NULL && !same(iid, own) && !same(iid, &IID_UNKNOWN))
        return E_NOINTERFACE;
    *out = obj;
    return S_OK;
}

static unsigned long add_ref(void *self) { (void)self; return 2; }
static unsigned long release(void *self) { (void)self; return 1; }

/* IDXCoreAdapter */
static HRESULT adapter_qi(void *self, const GUID *iid, void **out) {
    return give((Obj *)self, &IID_ADAPTER, iid, out);
}

static int index_of(void *self) { return ((Obj *)self)->index; }
static _Bool adapter_is_valid(void *self) { (void)self; return ensure_info(); }
static _Bool adapter_is_attribute_supported(void *self, const GUID *attribute) {
    (void)self;
    (void)attribute; /* D3D12 core compute and graphics: a D3D12 device is what it makes */
    return 1;
}

/* the adapter's name: the device's, " #i" after it for adapters past the first */
static void adapter_name(int index, char *out, size_t size) {
    if (index == 0)
        snprintf(out, size, "%s", info.name);
    else
        snprintf(out, size, "%s #%d", info.name, index);
}

static size_t property_size(uint32_t property, int index) {
    char name[sizeof info.name + 16];
    switch (property) {
    case PROP_INSTANCE_LUID: return sizeof(LUID);
    case PROP_DRIVER_VERSION: return sizeof(uint64_t);
    case PROP_DRIVER_DESCRIPTION:
        adapter_name(index, name, sizeof name);
        return strlen(name) + 1;
    case PROP_HARDWARE_ID: return 4 * sizeof(uint32_t);
    case PROP_KMD_MODEL_VERSION: return sizeof(uint32_t);
    case PROP_COMPUTE_PREEMPTION: case PROP_GRAPHICS_PREEMPTION: return sizeof(uint16_t);
    case PROP_DEDICATED_ADAPTER_MEMORY: case PROP_DEDICATED_SYSTEM_MEMORY:
    case PROP_SHARED_SYSTEM_MEMORY: return sizeof(uint64_t);
    case PROP_ACG_COMPATIBLE: case PROP_IS_HARDWARE: case PROP_IS_INTEGRATED:
    case PROP_IS_DETACHABLE: return sizeof(_Bool);
    case PROP_HARDWARE_ID_PARTS: return 5 * sizeof(uint32_t);
    default: return 0;
    }
}

static _Bool adapter_is_property_supported(void *self, uint32_t property) {
    return property_size(property, index_of(self)) != 0;
}

static HRESULT adapter_get_property_size(void *self, uint32_t property, size_t *size) {
    if (size == NULL)
        return E_POINTER;
    if (!ensure_info())
        return E_FAIL;
    *size = property_size(property, index_of(self));
    return *size ? S_OK : E_INVALIDARG;
}

static HRESULT adapter_get_property(void *self, uint32_t property, size_t size, void *data) {
    size_t need;
    uint32_t ids[5];
    uint64_t u64 = 0;
    _Bool flag = 0;
    const void *src = &u64;
    LUID luid;
    char name[sizeof info.name + 16];
    int index = index_of(self);
    if (data == NULL)
        return E_POINTER;
    if (!ensure_info())
        return E_FAIL;
    need = property_size(property, index);
    if (need == 0)
        return E_INVALIDARG;
    if (size < need)
        return E_INVALIDARG; /* DXCore: the buffer is too small */
    switch (property) {
    case PROP_INSTANCE_LUID:
        if (!ensure_luid())
            return E_FAIL;
        luid = info.luid;
        luid.LowPart += (uint32_t)index;
        src = &luid;
        break;
    case PROP_DRIVER_VERSION: u64 = info.driver_version; break;
    case PROP_DRIVER_DESCRIPTION:
        adapter_name(index, name, sizeof name);
        src = name;
        break;
    case PROP_HARDWARE_ID:
        ids[0] = info.vendor; ids[1] = info.device; ids[2] = 0; ids[3] = 0;
        src = ids;
        break;
    case PROP_HARDWARE_ID_PARTS:
        ids[0] = info.vendor; ids[1] = info.device; ids[2] = 0; ids[3] = 0; ids[4] = 0;
        src = ids;
        break;
    case PROP_KMD_MODEL_VERSION: u64 = 0x2c00; break; /* KMT_DRIVERVERSION_WDDM_2_9 */
    case PROP_COMPUTE_PREEMPTION: case PROP_GRAPHICS_PREEMPTION: u64 = 0; break;
    case PROP_DEDICATED_ADAPTER_MEMORY: u64 = info.dedicated; break;
    case PROP_DEDICATED_SYSTEM_MEMORY: u64 = 0; break;
    case PROP_SHARED_SYSTEM_MEMORY: u64 = info.shared; break;
    case PROP_IS_HARDWARE: flag = 1; src = &flag; break;
    case PROP_IS_INTEGRATED: flag = info.integrated != 0; src = &flag; break;
    default: flag = 0; src = &flag; break; /* ACG compatible, detachable: no */
    }
    memcpy(data, src, need);
    return S_OK;
}

static _Bool adapter_is_query_state_supported(void *self, uint32_t kind) {
    (void)self;
    return kind == STATE_ADAPTER_MEMORY_BUDGET;
}

static HRESULT adapter_query_state(void *self, uint32_t kind, size_t in_size, const void *in,
                                   size_t out_size, void *out) {
    uint64_t budget[4];
    (void)self;
    (void)in_size;
    (void)in;
    if (kind != STATE_ADAPTER_MEMORY_BUDGET)
        return E_NOTIMPL;
    if (out == NULL || out_size < sizeof budget)
        return E_INVALIDARG;
    if (!ensure_info())
        return E_FAIL;
    budget[0] = info.dedicated; /* budget */
    budget[1] = 0;              /* current usage (not tracked) */
    budget[2] = info.dedicated; /* available for reservation */
    budget[3] = 0;              /* current reservation */
    memcpy(out, budget, sizeof budget);
    return S_OK;
}

static _Bool adapter_is_set_state_supported(void *self, uint32_t kind) {
    (void)self;
    (void)kind;
    return 0;
}

static HRESULT adapter_set_state(void *self, uint32_t kind, size_t a, const void *b, size_t c,
                                 const void *d) {
    (void)self; (void)kind; (void)a; (void)b; (void)c; (void)d;
    return E_NOTIMPL;
}

static HRESULT adapter_get_factory(void *self, const GUID *iid, void **out) {
    (void)self;
    return give(&factory_obj, &IID_FACTORY, iid, out);
}

static void *const adapter_vtbl[] = {
    (void *)adapter_qi, (void *)add_ref, (void *)release, (void *)adapter_is_valid,
    (void *)adapter_is_attribute_supported, (void *)adapter_is_property_supported,
    (void *)adapter_get_property, (void *)adapter_get_property_size,
    (void *)adapter_is_query_state_supported, (void *)adapter_query_state,
    (void *)adapter_is_set_state_supported, (void *)adapter_set_state,
    (void *)adapter_get_factory,
};

/* IDXCoreAdapterList */
static HRESULT list_qi(void *self, const GUID *iid, void **out) {
    (void)self;
    return give(&list_obj, &IID_LIST, iid, out);
}
static HRESULT list_get_adapter(void *self, uint32_t index, const GUID *iid, void **out) {
    (void)self;
    if (index >= ADAPTERS || !ensure_info())
        return E_INVALIDARG;
    return give(&adapter_objs[index], &IID_ADAPTER, iid, out);
}
static uint32_t list_get_adapter_count(void *self) {
    (void)self;
    return ensure_info() ? ADAPTERS : 0;
}
static _Bool list_is_stale(void *self) { (void)self; return 0; }
static HRESULT list_get_factory(void *self, const GUID *iid, void **out) {
    (void)self;
    return give(&factory_obj, &IID_FACTORY, iid, out);
}
static HRESULT list_sort(void *self, uint32_t count, const uint32_t *preferences) {
    (void)self; (void)count; (void)preferences;
    return S_OK; /* one adapter */
}
static _Bool list_is_preference_supported(void *self, uint32_t preference) {
    (void)self; (void)preference;
    return 1;
}

static void *const list_vtbl[] = {
    (void *)list_qi, (void *)add_ref, (void *)release, (void *)list_get_adapter,
    (void *)list_get_adapter_count, (void *)list_is_stale, (void *)list_get_factory,
    (void *)list_sort, (void *)list_is_preference_supported,
};

/* IDXCoreAdapterFactory */
static HRESULT factory_qi(void *self, const GUID *iid, void **out) {
    (void)self;
    return give(&factory_obj, &IID_FACTORY, iid, out);
}
static HRESULT factory_create_adapter_list(void *self, uint32_t count, const GUID *attributes,
                                           const GUID *iid, void **out) {
    (void)self; (void)count; (void)attributes;
    return give(&list_obj, &IID_LIST, iid, out);
}
static HRESULT factory_get_adapter_by_luid(void *self, const LUID *luid, const GUID *iid,
                                           void **out) {
    uint32_t index;
    (void)self;
    if (luid == NULL || !ensure_luid())
        return E_INVALIDARG;
    index = luid->LowPart - info.luid.LowPart;
    if (luid->HighPart != info.luid.HighPart || index >= ADAPTERS)
        return E_INVALIDARG;
    return give(&adapter_objs[index], &IID_ADAPTER, iid, out);
}
static _Bool factory_is_notification_supported(void *self, uint32_t type) {
    (void)self; (void)type;
    return 0;
}
static HRESULT factory_register(void *self, void *obj, uint32_t type, void *cb, void *ctx,
                                uint32_t *cookie) {
    (void)self; (void)obj; (void)type; (void)cb; (void)ctx; (void)cookie;
    return E_NOTIMPL;
}
static HRESULT factory_unregister(void *self, uint32_t cookie) {
    (void)self; (void)cookie;
    return E_NOTIMPL;
}

static void *const factory_vtbl[] = {
    (void *)factory_qi, (void *)add_ref, (void *)release, (void *)factory_create_adapter_list,
    (void *)factory_get_adapter_by_luid, (void *)factory_is_notification_supported,
    (void *)factory_register, (void *)factory_unregister,
};

static Obj factory_obj = {factory_vtbl, 0};
static Obj list_obj = {list_vtbl, 0};

EXPORT HRESULT DXCoreCreateAdapterFactory(const GUID *iid, void **out) {
    int i;
    for (i = 0; i < ADAPTERS; i++) {
        adapter_objs[i].lpVtbl = adapter_vtbl;
        adapter_objs[i].index = i;
    }
    return give(&factory_obj, &IID_FACTORY, iid, out);
}
