/* cuTensorMapEncodeTiled / cuTensorMapEncodeIm2col (cuda.h, "Tensor Map
 * Object Management"): the worker encodes the 128-byte CUtensorMap with the
 * real driver (the emulated GPU: proxyd/backends/emu/tensor_map.py) and the
 * generic reply path copies it into the caller's struct. The device address
 * inside is the application's own (the session's allocations keep their
 * addresses, across a restore too), so the encoding stays valid as long as
 * the memory does, exactly as natively.
 *
 * What the shim checks before sending, because only it can: the caller's
 * CUtensorMap must be 64-byte aligned (cuda.h), and the rank must be one
 * the driver accepts (1..5; 3..5 for im2col) before it sizes the arrays the
 * call sends (tensorRank - 1 strides, tensorRank - 2 corners).
 *
 * Locking: none here; the generic bodies take gp_lock. */
#include <stdint.h>

#include "gp_gen.h"
#include "gp_shim.h"

static int bad_map(const CUtensorMap *m)
{
    return !m || ((uintptr_t)m & 63) != 0;
}

CUresult gpo_cuTensorMapEncodeTiled(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank,
                                    void *globalAddress, const cuuint64_t *globalDim, const cuuint64_t *globalStrides,
                                    const cuuint32_t *boxDim, const cuuint32_t *elementStrides,
                                    CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                    CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill)
{
    if (bad_map(tensorMap) || tensorRank < 1 || tensorRank > 5 || !globalDim || !boxDim || !elementStrides ||
        (tensorRank > 1 && !globalStrides))
        return CUDA_ERROR_INVALID_VALUE;
    return gpg_cuTensorMapEncodeTiled(tensorMap, tensorDataType, tensorRank, globalAddress, globalDim,
                                      tensorRank > 1 ? globalStrides : NULL, boxDim, elementStrides, interleave,
                                      swizzle, l2Promotion, oobFill);
}

CUresult gpo_cuTensorMapEncodeIm2col(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
                                     cuuint32_t tensorRank, void *globalAddress, const cuuint64_t *globalDim,
                                     const cuuint64_t *globalStrides, const int *pixelBoxLowerCorner,
                                     const int *pixelBoxUpperCorner, cuuint32_t channelsPerPixel,
                                     cuuint32_t pixelsPerColumn, const cuuint32_t *elementStrides,
                                     CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                     CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill)
{
    if (bad_map(tensorMap) || tensorRank < 3 || tensorRank > 5 || !globalDim || !globalStrides ||
        !pixelBoxLowerCorner || !pixelBoxUpperCorner || !elementStrides)
        return CUDA_ERROR_INVALID_VALUE;
    return gpg_cuTensorMapEncodeIm2col(tensorMap, tensorDataType, tensorRank, globalAddress, globalDim, globalStrides,
                                       pixelBoxLowerCorner, pixelBoxUpperCorner, channelsPerPixel, pixelsPerColumn,
                                       elementStrides, interleave, swizzle, l2Promotion, oobFill);
}
