"""Runs inside the MDS reader's virtual environment (scripts/streaming_env.sh), not the
pipeline's: reads MDS folders with ``streaming.StreamingDataset`` and saves every sample's
columns to one .npz per folder (values back to back, and each sample's length), for
tests/test_output_formats.py to compare with the Parquet output.

    python read_mds.py OUT_DIR FOLDER [FOLDER ...]

streaming imports its vision datasets when loaded, and so torchvision, whose registry build for
this torch (a CUDA build beside the CPU torch) fails to load; the MDS reader never uses it, so
the three names streaming takes from it are stood in for before streaming is imported.
"""

import importlib.machinery
import sys
import types
from pathlib import Path

import numpy as np


def stand_in_for_torchvision() -> None:
    modules = {name: types.ModuleType(name) for name in (
        "torchvision", "torchvision.datasets", "torchvision.transforms",
        "torchvision.transforms.functional")}
    for name, module in modules.items():  # transformers looks for torchvision by its spec
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    modules["torchvision.datasets"].VisionDataset = type("VisionDataset", (), {})
    modules["torchvision.datasets"].CIFAR10 = type("CIFAR10", (), {})
    modules["torchvision.transforms.functional"].to_tensor = None
    sys.modules.update(modules)


def main(out_dir: str, folders: list[str]) -> None:
    stand_in_for_torchvision()
    from streaming import StreamingDataset

    for index, folder in enumerate(folders):
        dataset = StreamingDataset(local=folder, shuffle=False, batch_size=1)
        samples = [dataset[i] for i in range(len(dataset))]
        arrays = {}
        for column in samples[0]:
            arrays[column] = np.concatenate([s[column] for s in samples])
            arrays[f"{column}.lengths"] = np.array([len(s[column]) for s in samples])
        np.savez(Path(out_dir) / f"{index}.npz", **arrays)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
