/* paddock-fuseshim: preloaded into the node's squashfuse_ll daemon (LD_PRELOAD), it changes
 * which requests the kernel sends to it; never what a request answers.
 *
 * A Paddock image carries no extended attributes (layers/ drops them), yet the kernel asks
 * for them on every lookup of a fresh overlay and on every exec (user.overlay.*,
 * security.capability), and FUSE caches no xattr answer: ~9 round trips to the daemon per
 * sandbox. Answering getxattr and listxattr with ENOSYS once makes the kernel stop asking
 * on that connection (it then answers EOPNOTSUPP itself, which overlayfs and exec read as
 * "no such attribute", as they would "ENODATA"). The daemon also asks the kernel to cache
 * symlink targets (an image never changes under its mount): no READLINK per exec.
 *
 * It wraps fuse_session_new (libfuse 3): copies the daemon's operations, drops getxattr and
 * listxattr (libfuse answers ENOSYS for a missing one), and adds FUSE_CAP_CACHE_SYMLINKS to
 * what init asks for.
 */
#define _GNU_SOURCE
#define FUSE_USE_VERSION 35
#include <dlfcn.h>
#include <fuse3/fuse_lowlevel.h>
#include <string.h>

typedef struct fuse_session *(*session_new_fn)(struct fuse_args *, const struct fuse_lowlevel_ops *,
                                               size_t, void *);

static struct fuse_lowlevel_ops ops;
static void (*daemon_init)(void *, struct fuse_conn_info *);

static void shim_init(void *userdata, struct fuse_conn_info *conn) {
    if (daemon_init) daemon_init(userdata, conn);
    if (conn->capable & FUSE_CAP_CACHE_SYMLINKS) conn->want |= FUSE_CAP_CACHE_SYMLINKS;
}

struct fuse_session *fuse_session_new(struct fuse_args *args, const struct fuse_lowlevel_ops *op,
                                      size_t op_size, void *userdata) {
    session_new_fn real = (session_new_fn)dlsym(RTLD_NEXT, "fuse_session_new");
    if (!real) return NULL;
    memset(&ops, 0, sizeof ops);
    memcpy(&ops, op, op_size < sizeof ops ? op_size : sizeof ops);
    ops.getxattr = NULL;
    ops.listxattr = NULL;
    daemon_init = ops.init;
    ops.init = shim_init;
    return real(args, &ops, sizeof ops, userdata);
}
