/* caps.h — whether this process holds a capability, from /proc/self/status (CapEff).
 *
 * For diagnostics and warnings only (the probes' "missing privileges", doctor's memlock
 * check): the kernel decides at the call that needs the capability. Threading: any; reads a
 * file. A status file that cannot be read, or a capability number past 63, is "no".
 */
#ifndef MOE_CAPS_H
#define MOE_CAPS_H

#include <stdbool.h>

bool process_has_capability(unsigned cap);

#endif
