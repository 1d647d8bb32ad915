/* Call profile (GPUPROXY_PROFILE, profile.c; interceptor/LAYERS: state):
 * per-function call counts and sync waits. transport.c calls these for every
 * op it begins and every wait; the caller holds gp_lock. */
#ifndef GP_PROFILE_H
#define GP_PROFILE_H

#include "gp_base.h"

void gp_prof_op(uint32_t fid);
uint64_t gp_prof_wait_begin(void);
void gp_prof_wait_end(uint64_t t0);

#endif
