"""Emptying the page cache before a cold read, for the Python benchmark scripts.

The same method as bench_util.cc's drop_caches for the C++ benchmarks.
"""

import os


def drop_caches(paths):
    """Empties the page cache for `paths`; returns the method used.

    `echo 3 > /proc/sys/vm/drop_caches` where allowed (root); otherwise each
    file is fdatasync'ed and posix_fadvise(DONTNEED)'ed.
    """
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        pass
    return evict_files(paths)


def evict_files(paths):
    """Drops the page cache of just `paths` (each fdatasync'ed, then
    posix_fadvise(DONTNEED)'ed); missing files are skipped. Returns "fadvise"."""
    os.sync()
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "fadvise"
