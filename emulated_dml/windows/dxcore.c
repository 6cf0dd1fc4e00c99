/* dxcore.dll for wine, which has none (wine 8): the DXCore adapter factory, list and adapter
 * over DXGI (CreateDXGIFactory1, EnumAdapters1), enough for torch-directml's Windows wheel.
 * torch_directml_native.pyd imports DXCoreCreateAdapterFactory statically; it then calls
 * CreateAdapterList (D3D12_CORE_COMPUTE), Sort, GetAdapterCount, GetAdapter, GetPropertySize
 * and GetProperty (IsHardware, HardwareID, DriverDescription, DriverVersion,
 * DedicatedAdapterMemory, IsIntegrated), IsAttributeSupported (D3D12_GRAPHICS) and
 * GetAdapterByLuid, and hands the adapter to D3D12CreateDevice, whose wine implementation
 * asks the adapter for DXGI interfaces: QueryInterface forwards what it does not know to the
 * DXGI adapter. Built by .ci/windows-lane with mingw-w64 (x86_64-w64-mingw32-gcc); the
 * interfaces are those of Microsoft's dxcore_interface.h (DirectX-Headers), which mingw-w64
 * does not ship. */
#define COBJMACROS
#define WIN32_LEAN_AND_MEAN
#include <windows.h>
#include <initguid.h>
#include <dxgi1_2.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

DEFINE_GUID(IID_IDXCoreAdapterFactory, 0x78ee5945, 0xc36e, 0x4b13, 0xa6, 0x69, 0x00, 0x5d, 0xd1,
            0x1c, 0x0f, 0x06);
DEFINE_GUID(IID_IDXCoreAdapterList, 0x526c7776, 0x40e9, 0x459b, 0xb7, 0x11, 0xf3, 0x2a, 0xd7,
            0x6d, 0xfc, 0x28);
DEFINE_GUID(IID_IDXCoreAdapter, 0xf0db4c7f, 0xfe5a, 0x42a2, 0xbd, 0x62, 0xf2, 0xa6, 0xcf, 0x6f,
            0xc8, 0x3e);
DEFINE_GUID(ATTR_D3D11_GRAPHICS, 0x8c47866b, 0x7583, 0x450d, 0xf0, 0xf0, 0x6b, 0xad, 0xa8, 0x95,
            0xaf, 0x4b);
DEFINE_GUID(ATTR_D3D12_GRAPHICS, 0x0c9ece4d, 0x2f6e, 0x4f01, 0x8c, 0x96, 0xe8, 0x9e, 0x33, 0x1b,
            0x47, 0xb1);
DEFINE_GUID(ATTR_D3D12_CORE_COMPUTE, 0x248e2800, 0xa793, 0x4724, 0xab, 0xaa, 0x23, 0xa6, 0xde,
            0x1b, 0xe0, 0x90);

enum property {
    InstanceLuid = 0, DriverVersion = 1, DriverDescription = 2, HardwareID = 3,
    KmdModelVersion = 4, ComputePreemptionGranularity = 5, GraphicsPreemptionGranularity = 6,
    DedicatedAdapterMemory = 7, DedicatedSystemMemory = 8, SharedSystemMemory = 9,
    AcgCompatible = 10, IsHardware = 11, IsIntegrated = 12, IsDetachable = 13,
    HardwareIDParts = 14,
};

#define MAX_ADAPTERS 16

/* ---- objects: each starts with its vtable pointer, as COM wants ---------------------------- */
typedef struct Adapter {
    const struct AdapterVtbl *lpVtbl;
    LONG refs;
    IDXGIAdapter1 *dxgi;
    DXGI_ADAPTER_DESC1 desc;
    char description[256]; /* UTF-8, what DriverDescription returns */
} Adapter;

typedef struct List {
    const struct ListVtbl *lpVtbl;
    LONG refs;
    UINT count;
    IDXGIAdapter1 *dxgi[MAX_ADAPTERS];
} List;

typedef struct Factory {
    const struct FactoryVtbl *lpVtbl;
} Factory;

struct AdapterVtbl {
    HRESULT (STDMETHODCALLTYPE *QueryInterface)(Adapter *, REFIID, void **);
    ULONG (STDMETHODCALLTYPE *AddRef)(Adapter *);
    ULONG (STDMETHODCALLTYPE *Release)(Adapter *);
    bool (STDMETHODCALLTYPE *IsValid)(Adapter *);
    bool (STDMETHODCALLTYPE *IsAttributeSupported)(Adapter *, REFGUID);
    bool (STDMETHODCALLTYPE *IsPropertySupported)(Adapter *, uint32_t);
    HRESULT (STDMETHODCALLTYPE *GetProperty)(Adapter *, uint32_t, size_t, void *);
    HRESULT (STDMETHODCALLTYPE *GetPropertySize)(Adapter *, uint32_t, size_t *);
    bool (STDMETHODCALLTYPE *IsQueryStateSupported)(Adapter *, uint32_t);
    HRESULT (STDMETHODCALLTYPE *QueryState)(Adapter *, uint32_t, size_t, const void *, size_t,
                                            void *);
    bool (STDMETHODCALLTYPE *IsSetStateSupported)(Adapter *, uint32_t);
    HRESULT (STDMETHODCALLTYPE *SetState)(Adapter *, uint32_t, size_t, const void *, size_t,
                                          const void *);
    HRESULT (STDMETHODCALLTYPE *GetFactory)(Adapter *, REFIID, void **);
};

struct ListVtbl {
    HRESULT (STDMETHODCALLTYPE *QueryInterface)(List *, REFIID, void **);
    ULONG (STDMETHODCALLTYPE *AddRef)(List *);
    ULONG (STDMETHODCALLTYPE *Release)(List *);
    HRESULT (STDMETHODCALLTYPE *GetAdapter)(List *, uint32_t, REFIID, void **);
    uint32_t (STDMETHODCALLTYPE *GetAdapterCount)(List *);
    bool (STDMETHODCALLTYPE *IsStale)(List *);
    HRESULT (STDMETHODCALLTYPE *GetFactory)(List *, REFIID, void **);
    HRESULT (STDMETHODCALLTYPE *Sort)(List *, uint32_t, const uint32_t *);
    bool (STDMETHODCALLTYPE *IsAdapterPreferenceSupported)(List *, uint32_t);
};

struct FactoryVtbl {
    HRESULT (STDMETHODCALLTYPE *QueryInterface)(Factory *, REFIID, void **);
    ULONG (STDMETHODCALLTYPE *AddRef)(Factory *);
    ULONG (STDMETHODCALLTYPE *Release)(Factory *);
    HRESULT (STDMETHODCALLTYPE *CreateAdapterList)(Factory *, uint32_t, const GUID *, REFIID,
                                                   void **);
    HRESULT (STDMETHODCALLTYPE *GetAdapterByLuid)(Factory *, const LUID *, REFIID, void **);
    bool (STDMETHODCALLTYPE *IsNotificationTypeSupported)(Factory *, uint32_t);
    HRESULT (STDMETHODCALLTYPE *RegisterEventNotification)(Factory *, IUnknown *, uint32_t,
                                                           void *, void *, uint32_t *);
    HRESULT (STDMETHODCALLTYPE *UnregisterEventNotification)(Factory *, uint32_t);
};

static Factory the_factory;

static HRESULT new_adapter(IDXGIAdapter1 *dxgi, REFIID riid, void **out);

/* ---- adapter ------------------------------------------------------------------------------ */
static HRESULT STDMETHODCALLTYPE adapter_qi(Adapter *self, REFIID riid, void **out) {
    if (!out)
        return E_POINTER;
    if (IsEqualGUID(riid, &IID_IUnknown) || IsEqualGUID(riid, &IID_IDXCoreAdapter)) {
        InterlockedIncrement(&self->refs);
        *out = self;
        return S_OK;
    }
    /* wine's D3D12CreateDevice asks for IDXGIAdapter: the DXGI adapter answers */
    return IDXGIAdapter1_QueryInterface(self->dxgi, riid, out);
}

static ULONG STDMETHODCALLTYPE adapter_addref(Adapter *self) {
    return InterlockedIncrement(&self->refs);
}

static ULONG STDMETHODCALLTYPE adapter_release(Adapter *self) {
    ULONG refs = InterlockedDecrement(&self->refs);
    if (!refs) {
        IDXGIAdapter1_Release(self->dxgi);
        HeapFree(GetProcessHeap(), 0, self);
    }
    return refs;
}

static bool STDMETHODCALLTYPE adapter_is_valid(Adapter *self) {
    (void)self;
    return true;
}

static bool known_attribute(const GUID *attribute) {
    return IsEqualGUID(attribute, &ATTR_D3D12_CORE_COMPUTE)
        || IsEqualGUID(attribute, &ATTR_D3D12_GRAPHICS)
        || IsEqualGUID(attribute, &ATTR_D3D11_GRAPHICS);
}

static bool STDMETHODCALLTYPE adapter_has_attribute(Adapter *self, REFGUID attribute) {
    (void)self;
    return known_attribute(attribute);
}

/* the size of each property this adapter answers; 0: not supported */
static size_t property_size(Adapter *self, uint32_t property) {
    switch (property) {
    case InstanceLuid: return sizeof(LUID);
    case DriverVersion: return sizeof(uint64_t);
    case DriverDescription: return strlen(self->description) + 1;
    case HardwareID: return 4 * sizeof(uint32_t);
    case HardwareIDParts: return 5 * sizeof(uint32_t);
    case DedicatedAdapterMemory:
    case DedicatedSystemMemory:
    case SharedSystemMemory: return sizeof(uint64_t);
    case IsHardware:
    case IsIntegrated:
    case IsDetachable:
    case AcgCompatible: return sizeof(bool);
    default: return 0;
    }
}

static bool STDMETHODCALLTYPE adapter_has_property(Adapter *self, uint32_t property) {
    return property_size(self, property) != 0;
}

static HRESULT STDMETHODCALLTYPE adapter_property_size(Adapter *self, uint32_t property,
                                                       size_t *size) {
    if (!size)
        return E_POINTER;
    *size = property_size(self, property);
    return *size ? S_OK : DXGI_ERROR_UNSUPPORTED;
}

static HRESULT STDMETHODCALLTYPE adapter_property(Adapter *self, uint32_t property, size_t size,
                                                  void *data) {
    size_t need = property_size(self, property);
    const DXGI_ADAPTER_DESC1 *d = &self->desc;
    if (!need)
        return DXGI_ERROR_UNSUPPORTED;
    if (!data)
        return E_POINTER;
    if (size < need)
        return E_INVALIDARG;
    switch (property) {
    case InstanceLuid: memcpy(data, &d->AdapterLuid, sizeof(LUID)); break;
    case DriverVersion: {
        LARGE_INTEGER version = {0};
        IDXGIAdapter1_CheckInterfaceSupport(self->dxgi, &IID_IDXGIDevice, &version);
        *(uint64_t *)data = (uint64_t)version.QuadPart;
        break;
    }
    case DriverDescription: memcpy(data, self->description, need); break;
    case HardwareID: {
        uint32_t id[4] = {d->VendorId, d->DeviceId, d->SubSysId, d->Revision};
        memcpy(data, id, sizeof(id));
        break;
    }
    case HardwareIDParts: {
        uint32_t id[5] = {d->VendorId, d->DeviceId, d->SubSysId >> 16, d->SubSysId & 0xffff,
                          d->Revision};
        memcpy(data, id, sizeof(id));
        break;
    }
    case DedicatedAdapterMemory: *(uint64_t *)data = d->DedicatedVideoMemory; break;
    case DedicatedSystemMemory: *(uint64_t *)data = d->DedicatedSystemMemory; break;
    case SharedSystemMemory: *(uint64_t *)data = d->SharedSystemMemory; break;
    /* DirectML lists hardware adapters only; wine's DXGI adapter is the Vulkan device */
    case IsHardware: *(bool *)data = !(d->Flags & DXGI_ADAPTER_FLAG_SOFTWARE); break;
    case IsIntegrated: *(bool *)data = d->DedicatedVideoMemory == 0; break;
    case IsDetachable:
    case AcgCompatible: *(bool *)data = false; break;
    }
    return S_OK;
}

static bool STDMETHODCALLTYPE adapter_no_state(Adapter *self, uint32_t state) {
    (void)self, (void)state;
    return false;
}

static HRESULT STDMETHODCALLTYPE adapter_query_state(Adapter *self, uint32_t state, size_t n,
                                                     const void *in, size_t m, void *out) {
    (void)self, (void)state, (void)n, (void)in, (void)m, (void)out;
    return DXGI_ERROR_UNSUPPORTED;
}

static HRESULT STDMETHODCALLTYPE adapter_set_state(Adapter *self, uint32_t state, size_t n,
                                                   const void *in, size_t m, const void *data) {
    (void)self, (void)state, (void)n, (void)in, (void)m, (void)data;
    return DXGI_ERROR_UNSUPPORTED;
}

static HRESULT STDMETHODCALLTYPE adapter_factory(Adapter *self, REFIID riid, void **out) {
    (void)self;
    return the_factory.lpVtbl->QueryInterface(&the_factory, riid, out);
}

static const struct AdapterVtbl adapter_vtbl = {
    adapter_qi, adapter_addref, adapter_release, adapter_is_valid, adapter_has_attribute,
    adapter_has_property, adapter_property, adapter_property_size, adapter_no_state,
    adapter_query_state, adapter_no_state, adapter_set_state, adapter_factory,
};

static HRESULT new_adapter(IDXGIAdapter1 *dxgi, REFIID riid, void **out) {
    Adapter *a;
    HRESULT hr;
    if (!IsEqualGUID(riid, &IID_IDXCoreAdapter) && !IsEqualGUID(riid, &IID_IUnknown))
        return E_NOINTERFACE;
    a = HeapAlloc(GetProcessHeap(), HEAP_ZERO_MEMORY, sizeof(*a));
    if (!a)
        return E_OUTOFMEMORY;
    a->lpVtbl = &adapter_vtbl;
    a->refs = 1;
    a->dxgi = dxgi;
    IDXGIAdapter1_AddRef(dxgi);
    hr = IDXGIAdapter1_GetDesc1(dxgi, &a->desc);
    if (FAILED(hr)) {
        adapter_release(a);
        return hr;
    }
    WideCharToMultiByte(CP_UTF8, 0, a->desc.Description, -1, a->description,
                        sizeof(a->description) - 1, NULL, NULL);
    *out = a;
    return S_OK;
}

/* ---- adapter list ------------------------------------------------------------------------- */
static HRESULT STDMETHODCALLTYPE list_qi(List *self, REFIID riid, void **out) {
    if (!out)
        return E_POINTER;
    if (IsEqualGUID(riid, &IID_IUnknown) || IsEqualGUID(riid, &IID_IDXCoreAdapterList)) {
        InterlockedIncrement(&self->refs);
        *out = self;
        return S_OK;
    }
    *out = NULL;
    return E_NOINTERFACE;
}

static ULONG STDMETHODCALLTYPE list_addref(List *self) {
    return InterlockedIncrement(&self->refs);
}

static ULONG STDMETHODCALLTYPE list_release(List *self) {
    ULONG refs = InterlockedDecrement(&self->refs);
    if (!refs) {
        for (UINT i = 0; i < self->count; i++)
            IDXGIAdapter1_Release(self->dxgi[i]);
        HeapFree(GetProcessHeap(), 0, self);
    }
    return refs;
}

static HRESULT STDMETHODCALLTYPE list_adapter(List *self, uint32_t index, REFIID riid,
                                              void **out) {
    if (!out)
        return E_POINTER;
    *out = NULL;
    if (index >= self->count)
        return E_INVALIDARG;
    return new_adapter(self->dxgi[index], riid, out);
}

static uint32_t STDMETHODCALLTYPE list_count(List *self) {
    return self->count;
}

static bool STDMETHODCALLTYPE list_is_stale(List *self) {
    (void)self;
    return false;
}

static HRESULT STDMETHODCALLTYPE list_factory(List *self, REFIID riid, void **out) {
    (void)self;
    return the_factory.lpVtbl->QueryInterface(&the_factory, riid, out);
}

/* DXGI's order (the primary adapter first) stands for every preference */
static HRESULT STDMETHODCALLTYPE list_sort(List *self, uint32_t n, const uint32_t *prefs) {
    (void)self, (void)n, (void)prefs;
    return S_OK;
}

static bool STDMETHODCALLTYPE list_preference_supported(List *self, uint32_t preference) {
    (void)self;
    return preference <= 2;
}

static const struct ListVtbl list_vtbl = {
    list_qi, list_addref, list_release, list_adapter, list_count, list_is_stale, list_factory,
    list_sort, list_preference_supported,
};

/* ---- factory ------------------------------------------------------------------------------ */
static HRESULT enum_adapters(List *list) {
    IDXGIFactory1 *dxgi;
    IDXGIAdapter1 *adapter;
    HRESULT hr = CreateDXGIFactory1(&IID_IDXGIFactory1, (void **)&dxgi);
    if (FAILED(hr))
        return hr;
    for (UINT i = 0; list->count < MAX_ADAPTERS
                     && IDXGIFactory1_EnumAdapters1(dxgi, i, &adapter) == S_OK; i++)
        list->dxgi[list->count++] = adapter;
    IDXGIFactory1_Release(dxgi);
    return S_OK;
}

static HRESULT STDMETHODCALLTYPE factory_qi(Factory *self, REFIID riid, void **out) {
    if (!out)
        return E_POINTER;
    if (IsEqualGUID(riid, &IID_IUnknown) || IsEqualGUID(riid, &IID_IDXCoreAdapterFactory)) {
        *out = self;
        return S_OK;
    }
    *out = NULL;
    return E_NOINTERFACE;
}

/* one factory for the process, never freed (DXCore hands out the same one too) */
static ULONG STDMETHODCALLTYPE factory_addref(Factory *self) {
    (void)self;
    return 2;
}

static ULONG STDMETHODCALLTYPE factory_release(Factory *self) {
    (void)self;
    return 1;
}

static HRESULT STDMETHODCALLTYPE factory_create_list(Factory *self, uint32_t n,
                                                     const GUID *attributes, REFIID riid,
                                                     void **out) {
    List *list;
    HRESULT hr;
    (void)self;
    if (!out)
        return E_POINTER;
    *out = NULL;
    if (!IsEqualGUID(riid, &IID_IDXCoreAdapterList) && !IsEqualGUID(riid, &IID_IUnknown))
        return E_NOINTERFACE;
    list = HeapAlloc(GetProcessHeap(), HEAP_ZERO_MEMORY, sizeof(*list));
    if (!list)
        return E_OUTOFMEMORY;
    list->lpVtbl = &list_vtbl;
    list->refs = 1;
    for (uint32_t i = 0; i < n; i++) {
        if (!known_attribute(&attributes[i])) {
            *out = list; /* an attribute no adapter has: an empty list */
            return S_OK;
        }
    }
    hr = enum_adapters(list);
    if (FAILED(hr)) {
        list_release(list);
        return hr;
    }
    *out = list;
    return S_OK;
}

static HRESULT STDMETHODCALLTYPE factory_by_luid(Factory *self, const LUID *luid, REFIID riid,
                                                 void **out) {
    List all = {0};
    HRESULT hr = enum_adapters(&all);
    (void)self;
    if (!out)
        return E_POINTER;
    *out = NULL;
    if (FAILED(hr))
        return hr;
    hr = E_INVALIDARG;
    for (UINT i = 0; i < all.count; i++) {
        DXGI_ADAPTER_DESC1 desc;
        if (*out == NULL && SUCCEEDED(IDXGIAdapter1_GetDesc1(all.dxgi[i], &desc))
            && desc.AdapterLuid.LowPart == luid->LowPart
            && desc.AdapterLuid.HighPart == luid->HighPart)
            hr = new_adapter(all.dxgi[i], riid, out);
        IDXGIAdapter1_Release(all.dxgi[i]);
    }
    return hr;
}

static bool STDMETHODCALLTYPE factory_notification_supported(Factory *self, uint32_t type) {
    (void)self, (void)type;
    return false;
}

static HRESULT STDMETHODCALLTYPE factory_register(Factory *self, IUnknown *object, uint32_t type,
                                                  void *callback, void *context,
                                                  uint32_t *cookie) {
    (void)self, (void)object, (void)type, (void)callback, (void)context, (void)cookie;
    return DXGI_ERROR_UNSUPPORTED;
}

static HRESULT STDMETHODCALLTYPE factory_unregister(Factory *self, uint32_t cookie) {
    (void)self, (void)cookie;
    return E_INVALIDARG;
}

static const struct FactoryVtbl factory_vtbl = {
    factory_qi, factory_addref, factory_release, factory_create_list, factory_by_luid,
    factory_notification_supported, factory_register, factory_unregister,
};

static Factory the_factory = {&factory_vtbl};

__declspec(dllexport) HRESULT WINAPI DXCoreCreateAdapterFactory(REFIID riid, void **out) {
    return factory_qi(&the_factory, riid, out);
}
