"""numba's on-disk cache is written under a file lock (kernels/cpu_fast/code_cache.py), so two
processes compiling one kernel for different argument types at once cannot leave an index
that names one signature's file holding the other's code (which crashed a product on its
first call with a 1-D output after two test workers had compiled it together)."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import textwrap
import time

SAVER = textwrap.dedent("""
    import sys
    import numba.core.caching as caching
    import zinfer.kernels.cpu_fast.code_cache  # noqa: F401  (installs the lock)
    files = caching.IndexDataCacheFile(sys.argv[1], "kernel-1.py311", source_stamp=(0.0, 0))
    files.save(("sig", sys.argv[2]), b"code for " + sys.argv[2].encode())
    print(files.load(("sig", sys.argv[2])).decode())
""")


def test_a_save_waits_for_the_lock_and_every_signature_keeps_its_own_code(tmp_path):
    lock = open(tmp_path / "kernel-1.py311.nbi.lock", "a")
    fcntl.flock(lock, fcntl.LOCK_EX)  # as another process saving right now
    savers = [subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path), sig], stdout=subprocess.PIPE, text=True)
              for sig in ("int64[:]", "int64[:, :]")]
    time.sleep(1.5)
    assert all(p.poll() is None for p in savers), "a save ran while another process held the index"
    fcntl.flock(lock, fcntl.LOCK_UN)
    lock.close()
    outputs = [p.communicate(timeout=60)[0].strip() for p in savers]
    assert outputs == ["code for int64[:]", "code for int64[:, :]"]
    # both entries survive in the one index, each naming its own data file
    import numba.core.caching as caching

    import zinfer.kernels.cpu_fast.code_cache  # noqa: F401

    files = caching.IndexDataCacheFile(str(tmp_path), "kernel-1.py311", source_stamp=(0.0, 0))
    for sig in ("int64[:]", "int64[:, :]"):
        assert files.load(("sig", sig)) == b"code for " + sig.encode()
