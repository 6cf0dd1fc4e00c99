/* What the torch-directml wheel's Linux binaries expect of WSL's libd3d12.so/libdxcore.so, as
 * far as the project's adapter over a real D3D12 library needs it (wsl_d3d12.c, wsl_dxcore.c).
 *
 * The wheel is built against WSL's DirectX headers: COM methods are called with the System V
 * convention, and a method returning a struct returns it BY VALUE (in rax/rdx up to 16 bytes of
 * integers, else through a hidden pointer passed before `this`). A D3D12 library built with
 * widl's WIDL_EXPLICIT_AGGREGATE_RETURNS headers (vkd3d-proton) takes the result pointer as the
 * argument after `this` and returns it. The structs below are the ones those methods return,
 * laid out as in d3d12.h (field for field: their sizes decide the calling convention). */
#ifndef EMULATED_DML_WSL_ABI_H
#define EMULATED_DML_WSL_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef int32_t HRESULT;
typedef struct { uint32_t Data1; uint16_t Data2, Data3; uint8_t Data4[8]; } GUID;
typedef struct { uint32_t LowPart; int32_t HighPart; } LUID;

#define S_OK 0
#define E_NOINTERFACE ((HRESULT)0x80004002)
#define E_NOTIMPL ((HRESULT)0x80004001)
#define E_POINTER ((HRESULT)0x80004003)
#define E_INVALIDARG ((HRESULT)0x80070057)
#define E_FAIL ((HRESULT)0x80004005)

typedef struct { uint64_t SizeInBytes, Alignment; } D3D12_RESOURCE_ALLOCATION_INFO; /* 16 */

typedef struct {
    int32_t Type, CPUPageProperty, MemoryPoolPreference;
    uint32_t CreationNodeMask, VisibleNodeMask;
} D3D12_HEAP_PROPERTIES; /* 20: hidden pointer */

typedef struct {
    int32_t Dimension;
    uint64_t Alignment, Width;
    uint32_t Height;
    uint16_t DepthOrArraySize, MipLevels;
    int32_t Format;
    uint32_t SampleCount, SampleQuality;
    int32_t Layout, Flags;
} D3D12_RESOURCE_DESC; /* 56 */

typedef struct {
    int32_t Dimension;
    uint64_t Alignment, Width;
    uint32_t Height;
    uint16_t DepthOrArraySize, MipLevels;
    int32_t Format;
    uint32_t SampleCount, SampleQuality;
    int32_t Layout, Flags;
    uint32_t MipRegionWidth, MipRegionHeight, MipRegionDepth;
} D3D12_RESOURCE_DESC1; /* 64 */

typedef struct { int32_t Type, Priority, Flags; uint32_t NodeMask; } D3D12_COMMAND_QUEUE_DESC;
typedef struct { int32_t Type; uint32_t NumDescriptors; int32_t Flags; uint32_t NodeMask; }
    D3D12_DESCRIPTOR_HEAP_DESC; /* 16 */
typedef struct { size_t ptr; } D3D12_CPU_DESCRIPTOR_HANDLE;
typedef struct { uint64_t ptr; } D3D12_GPU_DESCRIPTOR_HANDLE;
typedef struct {
    uint64_t SizeInBytes;
    D3D12_HEAP_PROPERTIES Properties;
    uint64_t Alignment;
    int32_t Flags;
} D3D12_HEAP_DESC; /* 48 */

_Static_assert(sizeof(D3D12_RESOURCE_DESC) == 56, "D3D12_RESOURCE_DESC");
_Static_assert(sizeof(D3D12_RESOURCE_DESC1) == 64, "D3D12_RESOURCE_DESC1");
_Static_assert(sizeof(D3D12_HEAP_PROPERTIES) == 20, "D3D12_HEAP_PROPERTIES");
_Static_assert(sizeof(D3D12_HEAP_DESC) == 48, "D3D12_HEAP_DESC");

/* vtable slots (IUnknown 0-2, ID3D12Object 3-6, ID3D12DeviceChild 7) */
enum {
    DEVICE_CREATE_COMMAND_QUEUE = 8,
    DEVICE_CHECK_FEATURE_SUPPORT = 13,
    DEVICE_CREATE_DESCRIPTOR_HEAP = 14,
    DEVICE_GET_RESOURCE_ALLOCATION_INFO = 25,
    DEVICE_GET_CUSTOM_HEAP_PROPERTIES = 26,
    DEVICE_CREATE_COMMITTED_RESOURCE = 27,
    DEVICE_CREATE_HEAP = 28,
    DEVICE_CREATE_FENCE = 36,
    DEVICE_GET_ADAPTER_LUID = 43,
    DEVICE_GET_RESOURCE_ALLOCATION_INFO1 = 56, /* ID3D12Device4 */
    DEVICE_GET_RESOURCE_ALLOCATION_INFO2 = 68, /* ID3D12Device8 */
    DEVICE_GET_RESOURCE_ALLOCATION_INFO3 = 80, /* ID3D12Device12 */
    HEAP_GET_DESC = 8,
    RESOURCE_GET_DESC = 10,
    RESOURCE_GET_DESC1 = 16, /* ID3D12Resource2 */
    DESCRIPTOR_HEAP_GET_DESC = 8,
    DESCRIPTOR_HEAP_GET_CPU_START = 9,
    DESCRIPTOR_HEAP_GET_GPU_START = 10,
    QUEUE_GET_DESC = 18,
    FENCE_GET_COMPLETED_VALUE = 8,
    FENCE_SET_EVENT_ON_COMPLETION = 9,
};

#define D3D12_FEATURE_D3D12_OPTIONS 0
#define D3D12_OPTIONS_TILED_RESOURCES_TIER_OFFSET 12 /* after two BOOLs and an enum */

typedef HRESULT (*PFN_D3D12_CREATE_DEVICE)(void *adapter, int32_t feature_level, const GUID *iid,
                                            void **device);

#endif
