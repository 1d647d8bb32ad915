/* Interface of the library stand-ins (libcublas.so.13, libcublasLt.so.13,
 * libnvidia-ml.so.1, libcufft.so.12, libcurand.so.10, libcusparse.so.12,
 * libcusolver.so.12; docs/libraries.md; interceptor/LAYERS: libraries):
 * the hand-written lib_*.c and the generated gp_lib_*_stubs.c include this
 * (through gp_lib_<api>.h). Below them: the library state libcuda.so.1
 * keeps (gp_lib.h) and the transport (gp_transport.h); the runtime API
 * (cudaFree(NULL) before a handle) through cuda_runtime_api.h. */
#ifndef GP_LIBRARIES_H
#define GP_LIBRARIES_H

#include <stddef.h>

#include "gp_lib.h"
#include "gp_memory.h"
#include "gp_transport.h"

/* cuDNN (cudnn_ops.h, "Scaling Parameters"): bytes of alpha/beta of a call
 * on tensors described by desc: sizeof(double) for CUDNN_DATA_DOUBLE
 * tensors, else sizeof(float). The data type is noted by
 * cudnnSetTensorNdDescriptor. lib_cudnn.c (in libcudnn.so.9). */
size_t gp_cudnn_scalar_size(const void *desc);

#endif
