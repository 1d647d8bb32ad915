/* Kernel function handles known to the shim; see funcs.c. */
#ifndef GP_FUNCS_H
#define GP_FUNCS_H

#include "gp_base.h"

typedef struct gp_fninfo {
    uint64_t handle;
    char *name;
    int have_layout;
    uint32_t nparams;
    uint32_t *off;
    uint32_t *size;
    uint32_t param_bytes;
    /* State of the deprecated execution-control API (legacy_launch.c):
     * cuFuncSetBlockShape, cuFuncSetSharedSize, cuParamSet*. */
    int legacy_block[3];
    unsigned legacy_shared;
    uint8_t *legacy_params;
    uint32_t legacy_param_size;
    struct gp_fninfo *next;
} gp_fninfo;

gp_fninfo *gp_fn_lookup(CUfunction f);
gp_fninfo *gp_fn_add(CUfunction f, const char *name, size_t namelen);
int gp_fn_read_layout(gp_fninfo *p, gp_rd *rd);
void gp_fn_pack(const gp_fninfo *p, void **params, uint8_t *buf);

#endif
