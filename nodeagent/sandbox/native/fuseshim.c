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
 * Open and release likewise: the kernel sends an OPEN (and a RELEASE after) for every file a
 * sandbox opens, exec included; answered ENOSYS once (where the kernel offers
 * FUSE_CAP_NO_OPEN_SUPPORT) it opens files itself, keeping their page cache, and sends reads
 * with no file handle. Such a read is served by the daemon's own open, read and release in a
 * row, their replies captured here and the read answered once: reads come only on page cache
 * misses, opens came on every open.
 *
 * It wraps fuse_session_new (libfuse 3): copies the daemon's operations, drops getxattr and
 * listxattr (libfuse answers ENOSYS for a missing one), wraps open and read, and adds
 * FUSE_CAP_CACHE_SYMLINKS to what init asks for. It interposes the fuse_reply_* calls a
 * captured open, read and release make; outside a capture they go straight to libfuse.
 */
#define _GNU_SOURCE
#define FUSE_USE_VERSION 35
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse3/fuse_lowlevel.h>
#include <stdlib.h>
#include <string.h>

typedef struct fuse_session *(*session_new_fn)(struct fuse_args *, const struct fuse_lowlevel_ops *,
                                               size_t, void *);
typedef int (*reply_open_fn)(fuse_req_t, const struct fuse_file_info *);
typedef int (*reply_buf_fn)(fuse_req_t, const char *, size_t);
typedef int (*reply_err_fn)(fuse_req_t, int);

static struct fuse_lowlevel_ops ops;
static struct fuse_lowlevel_ops daemon_ops;   /* the daemon's own */
static int no_open;   /* the kernel skips OPEN/RELEASE once open answers ENOSYS */
static reply_open_fn real_reply_open;
static reply_buf_fn real_reply_buf;
static reply_err_fn real_reply_err;

/* A read served by the daemon's open + read + release: their replies land here. */
static __thread struct capture {
    int on, err, opened;
    char *data;
    size_t len;
} cap;

int fuse_reply_open(fuse_req_t req, const struct fuse_file_info *fi) {
    if (!cap.on) return real_reply_open(req, fi);
    cap.opened = 1;   /* fi is the capture's own: its fh is already there */
    return 0;
}

int fuse_reply_buf(fuse_req_t req, const char *buf, size_t size) {
    if (!cap.on) return real_reply_buf(req, buf, size);
    free(cap.data);
    cap.data = size ? malloc(size) : NULL;
    if (size && !cap.data) {
        cap.err = ENOMEM;
        return 0;
    }
    if (size) memcpy(cap.data, buf, size);
    cap.len = size;
    return 0;
}

int fuse_reply_err(fuse_req_t req, int err) {
    if (!cap.on) return real_reply_err(req, err);
    if (err && !cap.err) cap.err = err;
    return 0;
}

static void shim_init(void *userdata, struct fuse_conn_info *conn) {
    if (daemon_ops.init) daemon_ops.init(userdata, conn);
    if (conn->capable & FUSE_CAP_CACHE_SYMLINKS) conn->want |= FUSE_CAP_CACHE_SYMLINKS;
    no_open = (conn->capable & FUSE_CAP_NO_OPEN_SUPPORT) != 0;
}

static void shim_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    if (no_open) real_reply_err(req, ENOSYS);   /* once: the kernel opens files itself from now on */
    else daemon_ops.open(req, ino, fi);
}

static void shim_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
    if (fi->fh) {   /* opened by the daemon (before the kernel stopped asking) */
        daemon_ops.read(req, ino, size, off, fi);
        return;
    }
    struct fuse_file_info own;
    memset(&own, 0, sizeof own);
    own.flags = O_RDONLY;
    memset(&cap, 0, sizeof cap);
    cap.on = 1;
    daemon_ops.open(req, ino, &own);
    if (cap.opened && !cap.err) {
        daemon_ops.read(req, ino, size, off, &own);
        int err = cap.err;
        if (daemon_ops.release) daemon_ops.release(req, ino, &own);
        cap.err = err;   /* a release's own answer is not the read's */
    } else if (cap.opened && daemon_ops.release) {
        daemon_ops.release(req, ino, &own);
    }
    cap.on = 0;
    if (cap.err) real_reply_err(req, cap.err);
    else real_reply_buf(req, cap.data, cap.len);
    free(cap.data);
    cap.data = NULL;
}

struct fuse_session *fuse_session_new(struct fuse_args *args, const struct fuse_lowlevel_ops *op,
                                      size_t op_size, void *userdata) {
    session_new_fn real = (session_new_fn)dlsym(RTLD_NEXT, "fuse_session_new");
    real_reply_open = (reply_open_fn)dlsym(RTLD_NEXT, "fuse_reply_open");
    real_reply_buf = (reply_buf_fn)dlsym(RTLD_NEXT, "fuse_reply_buf");
    real_reply_err = (reply_err_fn)dlsym(RTLD_NEXT, "fuse_reply_err");
    if (!real || !real_reply_open || !real_reply_buf || !real_reply_err) return NULL;
    memset(&daemon_ops, 0, sizeof daemon_ops);
    memcpy(&daemon_ops, op, op_size < sizeof daemon_ops ? op_size : sizeof daemon_ops);
    ops = daemon_ops;
    ops.getxattr = NULL;
    ops.listxattr = NULL;
    ops.init = shim_init;
    if (daemon_ops.open && daemon_ops.read) {
        ops.open = shim_open;
        ops.read = shim_read;
    }
    return real(args, &ops, sizeof ops, userdata);
}
