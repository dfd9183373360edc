"""The Arm SME2 kit's config template, as its mac template writes it, for the tests that submit one."""

from __future__ import annotations

import copy

__all__ = ["MAC_TEMPLATE", "template"]

MAC_TEMPLATE = {
    "model": "REPLACE_WITH_PATH_TO_MODEL_PTE",
    "output_root": "out_toy_cnn/runs/mac",
    "experiments": [
        {"name": "mac_sme2_on", "runner_path": "executorch/cmake-out/mac-arm64/executor_runner",
         "mode": "timing", "runs": 10, "warmup": 1, "threads": [1]},
        {"name": "mac_sme2_off", "runner_path": "executorch/cmake-out/mac-arm64-sme2-off/executor_runner",
         "mode": "timing", "runs": 10, "warmup": 1, "threads": [1]},
    ],
    "analysis": {"compare_pairs": []},
}

def template(**top):
    cfg = copy.deepcopy(MAC_TEMPLATE)
    cfg["model"] = "toy_cnn_xnnpack_fp32.pte"
    cfg.update(top)
    return cfg
