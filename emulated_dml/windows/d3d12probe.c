/* d3d12probe.exe: does the D3D12 library beside it create a device? .ci/windows-lane runs it
 * before the tests that need a real D3D12 library (DMLSHIM_WINDOWS_D3D12), so that a library
 * that cannot start under this wine is refused with the reason, not met as DirectML's
 * "RuntimeError: unknown error" in every test. Prints the HRESULT of D3D12CreateDevice on the
 * default adapter (feature level 11_0, the one DirectML asks for); exit status 0 when it made a
 * device. The library writes its own reason on stderr (vkd3d-proton: "Could not get instance
 * proc addr for ..."). Built by the lane with mingw-w64. */
#define COBJMACROS
#define WIN32_LEAN_AND_MEAN
#include <windows.h>
#include <initguid.h>
#include <d3d12.h>
#include <stdio.h>

int main(void)
{
    ID3D12Device *device = NULL;
    HRESULT hr = D3D12CreateDevice(NULL, D3D_FEATURE_LEVEL_11_0, &IID_ID3D12Device,
                                   (void **)&device);
    printf("D3D12CreateDevice: 0x%08lx\n", (unsigned long)hr);
    fflush(stdout);
    if (SUCCEEDED(hr) && device)
        ID3D12Device_Release(device);
    return SUCCEEDED(hr) ? 0 : 1;
}
