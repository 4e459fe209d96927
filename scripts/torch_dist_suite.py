#!/usr/bin/python3
"""torch_dist_suite.py — PyTorch's own distributed test suite on the libcoll backend.

    PYTHONPATH=build/torch WORLD_SIZE=2 /usr/bin/python3 scripts/torch_dist_suite.py [-v] [-k PATTERN]

Runs torch.testing._internal.distributed.distributed_test (shipped with python3-torch) the
way torch 1.13's test/distributed/test_distributed_spawn.py does: BACKEND, WORLD_SIZE,
INIT_METHOD (file:// per test), TEMP_DIR, and DistributedTest._DistTestBase mixed into
TestDistBackend, every test spawning WORLD_SIZE fresh processes that import this file
(so libcoll_torch registers "libcoll" in each).  The suite's skip decorators test the
backend's name against feature sets (DistTestCases): the driver enters "libcoll" in
those it supports (subgroups, DDP, plugin).  Needs the `expecttest` package (setup.sh).
It must never change the suite's tests themselves, only the feature sets.
"""
import os
import shutil
import sys
import tempfile

# A CI=... environment turns on the suite's CI mode (IS_CI), which writes XML reports through
# `xmlrunner`, a package we neither need nor install: the results are read from our exit code.
os.environ.pop("CI", None)
os.environ.setdefault("BACKEND", "libcoll")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("COLL_TIMEOUT_MS", "120000")
# Our own TEMP_DIR, removed at the end by this name: the harness's setUp points
# os.environ["TEMP_DIR"] at a directory of its own per test.
own_temp = tempfile.mkdtemp(prefix="coll-torch-suite-") if "TEMP_DIR" not in os.environ else None
if own_temp:
    os.environ["TEMP_DIR"] = own_temp

import libcoll_torch  # noqa: F401,E402  registers "libcoll"
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

for feature in ("subgroup", "ddp", "plugin"):
    DistTestCases.backend_feature[feature].add("libcoll")
DistTestCases.skip_collective["sendrecv anysource"].add("libcoll")

# torch 1.13's TestDistBackend._run turns on DDP's experimental ReplicatedTensor path,
# which imports torch.distributed._shard: that fails on Debian's Python 3.11 (a dataclass
# with a mutable default, for every backend, Gloo too).  Leave DDP on its default path.
try:
    import torch.nn.parallel._replicated_tensor_ddp_utils as _rt  # noqa: E402
    _rt._set_ddp_with_replicated_tensor = lambda value: None
except ImportError:  # torch 2.x has no such path
    pass

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    try:
        run_tests()
    finally:
        if own_temp:
            shutil.rmtree(own_temp, ignore_errors=True)
