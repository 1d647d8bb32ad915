/* Hand-written part of the libnvidia-ml.so.1 stand-in (spec: shim:
 * override in specs/nvml/nvml.yaml). docs/libraries.md. */
#include "gp_lib_nvml.h"

/* nvml.h, nvmlReturn_t: the descriptions of the codes a caller may see,
 * answered here without a round trip */
const char *gpo_nvmlErrorString(nvmlReturn_t result)
{
    switch ((int)result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt received";
    case 12: return "Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "Operating System call failed";
    case 18: return "Resource in use";
    case 19: return "Memory error";
    case 20: return "No data";
    case 999: return "Unknown Error";
    default: return "Unknown Error";
    }
}
