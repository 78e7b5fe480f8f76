/* Preloaded in gVisor boxes only (LD_PRELOAD, see sandbox/gvisor.py): gVisor's 2022
 * Sentry answers statx() with EINVAL when AT_NO_AUTOMOUNT is set, which coreutils 9
 * always sets, so `ls -l` and `stat` fail. Nothing is automounted in a box, so the
 * flag changes nothing there: drop it and make the call. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf) {
    return (int)syscall(SYS_statx, dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
}
