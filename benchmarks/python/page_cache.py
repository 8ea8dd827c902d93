# SPDX-License-Identifier: Apache-2.0
"""What the Python benchmarks share: dropping a directory's files from the OS page cache."""
import os


def drop_cache(directory):
    """Every file under `directory` written back and dropped from the page cache (no root needed)."""
    for root, _, files in os.walk(directory):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)  # dirty pages cannot be dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
