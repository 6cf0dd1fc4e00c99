/* bcryptprimitives.dll for wine 8, which has none: Windows 10 and later have it, and the Rust
 * standard library (1.78 and later) takes its random numbers from its ProcessPrng, which every
 * Rust-built Windows wheel imports statically (safetensors, tokenizers, pydantic-core, hf-xet,
 * polars): without it their import fails with "DLL load failed ... The specified module could
 * not be found". ProcessPrng fills a buffer from the system's generator and never fails
 * (Microsoft's contract); here over BCryptGenRandom with the system-preferred RNG, in chunks
 * (it takes a ULONG length). Built by .ci/windows-lane with mingw-w64; wine 9 and later have
 * their own (a builtin wine prefers to this one). */
#define WIN32_LEAN_AND_MEAN
#include <windows.h>
#include <bcrypt.h>

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T size)
{
    while (size) {
        ULONG chunk = size > 0x40000000 ? 0x40000000 : (ULONG)size;
        if (!BCRYPT_SUCCESS(BCryptGenRandom(NULL, data, chunk,
                                            BCRYPT_USE_SYSTEM_PREFERRED_RNG)))
            return FALSE;
        data += chunk;
        size -= chunk;
    }
    return TRUE;
}
