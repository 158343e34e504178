"""A chest X-ray model in an exported MONAI Bundle: MONAI's transforms doing what training's preprocessing does.

Each image (PNG, JPEG, TIFF, BMP or DICOM) is decoded by the bundle's copies of :mod:`.grayscale` and :mod:`.dicom`
(through :class:`.bundle_reader.RadiographReader`, a MONAI image reader), so its 8-bit pixels are training's to
the bit; MONAI's transforms then scale them to [0, 1], replicate the gray channel where the model reads three, and
normalise with the float32 statistics training used. ``model.pt`` is the state dict
of MONAI's own ``DenseNet121`` (the named head adds names, no weights), or of its ``DenseNet`` with the smoke network's
arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..data.bundle_parts import BundleParts
from . import bundle_reader, dicom, grayscale
from .names import DENSENET121, NETWORK_ARGUMENTS, NETWORK_KEY
from .transforms import image_batch_transform

BATCH_SIZE = 32


def image_bundle_parts(preprocessing: Mapping[str, Any], class_count: int) -> BundleParts:
    size = int(preprocessing.get("image_size", 224))
    channels = int(preprocessing.get("in_channels", 1))
    normalize = bool(preprocessing.get("imagenet_normalize", True))
    batch = image_batch_transform(size, train=False, in_channels=channels, imagenet_normalize=normalize)
    network = str(preprocessing.get(NETWORK_KEY, DENSENET121))
    network_definition: dict[str, Any] = {"_target_": "DenseNet121", "spatial_dims": 2}  # MONAI's own class
    if network != DENSENET121:
        network_definition = {"_target_": "DenseNet", "spatial_dims": 2, **NETWORK_ARGUMENTS[network]}
    network_definition |= {"in_channels": channels, "out_channels": class_count}
    transforms: list[dict[str, Any]] = [
        {
            "_target_": "LoadImaged",
            "keys": "image",
            "image_only": True,
            "reader": {
                "_target_": "scripts.bundle_reader.RadiographReader",
                "size": "@image_size",
                "accept_non_chest": "@accept_non_chest",
            },
        },
        {"_target_": "EnsureChannelFirstd", "keys": "image", "channel_dim": "no_channel"},
        {"_target_": "ScaleIntensityRanged", "keys": "image", "a_min": 0, "a_max": 255, "b_min": 0.0, "b_max": 1.0},
    ]
    if channels == 3:
        transforms.append({"_target_": "RepeatChanneld", "keys": "image", "repeats": 3})
    if normalize:
        transforms.append(
            {
                "_target_": "NormalizeIntensityd",
                "keys": "image",
                "subtrahend": batch.mean.flatten().tolist(),
                "divisor": batch.std.flatten().tolist(),
                "channel_wise": True,
            }
        )
    statistics = "ImageNet's mean and standard deviation" + (" (their channel means)" if channels == 1 else "")
    config = {
        "dataset_dir": "images",
        "image_size": size,
        "accept_non_chest": False,  # True scores DICOMs of another modality or body part (a model for chest films)
        "inputs": "$scripts.bundle_reader.screened_inputs(@dataset_dir, @image_size, @accept_non_chest, "
        "@csv_columns['readable'])",
        "datalist": "$@inputs['datalist']",
        "rows": "$@inputs['rows']",
        "preprocessing": {"_target_": "Compose", "transforms": transforms},
        "dataset": {"_target_": "Dataset", "data": "@datalist", "transform": "@preprocessing"},
        "dataloader": {
            "_target_": "DataLoader",
            "dataset": "@dataset",
            "batch_size": BATCH_SIZE,
            "shuffle": False,
            "num_workers": 0,
        },
        "network_def": network_definition,
        "network": "$@network_def.to(@device)",
        "weights": "$torch.load(@bundle_root + '/models/model.pt', map_location=@device, weights_only=True)",
        "batches": "@dataloader",
        "postprocessing": {"_target_": "Activations", "sigmoid": True},
        "statuses": "$@inputs['statuses']",  # a file that cannot be scored is a row with its reason
        "initialize": ["$@network.load_state_dict(@weights)", "$@network.eval()"],
    }
    return BundleParts(
        input_key="image",
        input_format={
            "type": "image",
            "format": "magnitude",
            "modality": "XR",
            "num_channels": channels,
            "spatial_shape": [size, size],
            "dtype": "float32",
            "value_range": [],  # normalised: see the preprocessing record
            "is_patch_data": False,
            "channel_def": {str(index): "grayscale radiograph" for index in range(channels)},
        },
        input_produced_by=(
            f"a PNG/JPEG/DICOM chest X-ray decoded to 8-bit grayscale (DICOM: modality LUT, VOI window, MONOCHROME1 "
            f"inverted) and resized to {size} x {size} (Pillow, bilinear; scripts/grayscale.py, scripts/dicom.py), "
            "scaled to [0, 1]"
            + (", replicated to 3 channels" if channels == 3 else "")
            + (f", normalised with {statistics}" if normalize else "")
        ),
        task=f"Multi-label classification of frontal chest X-rays into {class_count} findings",
        data_type="png/jpeg/dicom",
        config=config,
        scripts=(Path(grayscale.__file__), Path(dicom.__file__), Path(bundle_reader.__file__)),
        packages=("pillow", "pydicom"),
        usage="--dataset_dir <a folder of PNG/JPEG/DICOM images>",
    )
