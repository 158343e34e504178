from __future__ import annotations

import re

import pytest
import torch

from surgical_aggregation.core.head import split_backbone_head
from surgical_aggregation.images.model import NamedDenseNet, imagenet_to_monai_keys, load_pretrained_backbone
from surgical_aggregation.training.checkpoint import load_checkpoint, save_checkpoint
from surgical_aggregation.training.loops import freeze_batchnorm, set_backbone_trainable, train_mode

CLASSES = ["Atelectasis", "Effusion", "Hernia"]


def test_head_rows_carry_the_class_names_given_which_must_be_distinct():
    model = NamedDenseNet(CLASSES)  # named by its caller's vocabulary: a model renames nothing
    assert model.class_names == ["Atelectasis", "Effusion", "Hernia"]
    backbone, head = split_backbone_head(model.state_dict())
    assert head["class_layers.out.weight"].shape == (3, 1024)
    assert head["class_layers.out.bias"].shape == (3,)
    assert len(backbone) == 725
    assert model(torch.zeros(2, 1, 32, 32)).shape == (2, 3)
    with pytest.raises(ValueError, match=r"class names must be distinct, \['Hernia'\] appear more than once"):
        NamedDenseNet(["Hernia", "Mass", "Hernia"])
    with pytest.raises(ValueError, match="a model needs at least one class name"):
        NamedDenseNet([])


def test_checkpoint_round_trip_keeps_names_and_weights(tmp_path):
    model = NamedDenseNet(CLASSES, in_channels=3)
    preprocessing = {"in_channels": 3}  # the channels once, in the preprocessing the modality builds from
    path = save_checkpoint(
        tmp_path / "m.pt", model.state_dict(), model.class_names, preprocessing=preprocessing, round=4
    )
    loaded = load_checkpoint(path)
    assert loaded.class_names == model.class_names
    assert loaded.meta == {"preprocessing": {"in_channels": 3}, "round": 4}
    assert set(torch.load(path, weights_only=True)) == {"model", "class_names", "meta"}
    rebuilt = loaded.build_model()
    assert rebuilt.in_channels == 3
    for key, value in model.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[key], value)
    assert not (tmp_path / "m.pt.tmp").exists()


def test_a_model_file_of_the_first_versions_keeps_its_channels(tmp_path):
    model = NamedDenseNet(CLASSES, in_channels=3)  # its file held "in_channels" at the top level, no preprocessing
    legacy = {"model": model.state_dict(), "class_names": CLASSES, "in_channels": 3, "meta": {"round": 2}}
    torch.save(legacy, tmp_path / "old.pt")
    loaded = load_checkpoint(tmp_path / "old.pt")
    assert loaded.preprocessing == {"in_channels": 3} and loaded.build_model().in_channels == 3


def test_checkpoint_with_mismatched_names_is_refused(tmp_path):
    model = NamedDenseNet(CLASSES)
    torch.save({"model": model.state_dict(), "class_names": ["Mass"]}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match=r"bad.pt: head has 3 rows but 1 class names"):
        load_checkpoint(tmp_path / "bad.pt")
    with pytest.raises(FileNotFoundError, match="model file not found"):
        load_checkpoint(tmp_path / "missing.pt")


def _bn_snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items() if "norm" in k}


def test_frozen_batchnorm_does_not_move_during_training():
    torch.manual_seed(0)
    model = NamedDenseNet(CLASSES)
    freeze_batchnorm(model)
    train_mode(model, frozen_batchnorm=True)
    assert all(not m.training for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    before = _bn_snapshot(model)
    conv_before = model.features.conv0.weight.clone()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(torch.randn(4, 1, 32, 32)).sum().backward()
    optimizer.step()
    after = _bn_snapshot(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not torch.equal(conv_before, model.features.conv0.weight)


def test_backbone_freeze_for_head_warm_up():
    model = NamedDenseNet(CLASSES)
    set_backbone_trainable(model, False)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"class_layers.out.weight", "class_layers.out.bias"}
    freeze_batchnorm(model)
    set_backbone_trainable(model, True, frozen_batchnorm=True)
    bn_params = {
        f"{n}.{p}" for n, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d) for p in ("weight", "bias")
    }
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {name for name, _ in model.named_parameters()} - bn_params


def _torchvision_style(state: dict) -> dict:
    """MONAI keys -> the old torchvision DenseNet121 checkpoint keys ("norm.1" style), plus a classifier."""
    renamed = {}
    for key, value in state.items():
        if key.startswith("class_layers") or key.endswith("num_batches_tracked"):
            continue
        key = re.sub(r"\.layers\.(norm|relu|conv)([12])\.", r".\1.\2.", key)
        renamed[key] = value
    renamed["classifier.weight"] = torch.randn(1000, 1024)
    renamed["classifier.bias"] = torch.randn(1000)
    return renamed


def test_imagenet_weights_map_onto_monai_keys_and_one_channel_sums_rgb(tmp_path):
    rgb = NamedDenseNet(CLASSES, in_channels=3).state_dict()
    checkpoint = _torchvision_style(rgb)
    assert "features.denseblock1.denselayer1.norm.1.weight" in checkpoint
    torch.save(checkpoint, tmp_path / "densenet121-a639ec97.pth")
    assert set(imagenet_to_monai_keys(checkpoint)) == {
        k for k in rgb if not k.startswith("class_layers") and not k.endswith("num_batches_tracked")
    }

    gray = NamedDenseNet(CLASSES, in_channels=1)
    head_before = gray.class_layers.out.weight.clone()
    loaded = load_pretrained_backbone(gray, tmp_path / "densenet121-a639ec97.pth")
    state = gray.state_dict()
    assert len(loaded) == 725 - 121  # every backbone tensor but the BatchNorm counters
    assert torch.allclose(state["features.conv0.weight"], rgb["features.conv0.weight"].sum(dim=1, keepdim=True))
    key = "features.denseblock3.denselayer7.layers.conv2.weight"
    assert torch.equal(state[key], rgb[key])
    assert torch.equal(gray.class_layers.out.weight, head_before)

    color = NamedDenseNet(CLASSES, in_channels=3)
    load_pretrained_backbone(color, tmp_path / "densenet121-a639ec97.pth")
    assert torch.equal(color.state_dict()["features.conv0.weight"], rgb["features.conv0.weight"])


def test_pretrained_file_errors_name_the_file(tmp_path):
    model = NamedDenseNet(CLASSES)
    with pytest.raises(FileNotFoundError, match="pretrained weights file not found"):
        load_pretrained_backbone(model, tmp_path / "nope.pth")
    torch.save({"features.conv0.weight": torch.zeros(64, 3, 7, 7)}, tmp_path / "partial.pth")
    with pytest.raises(ValueError, match=r"partial.pth: \d+ backbone keys missing"):
        load_pretrained_backbone(model, tmp_path / "partial.pth")


def test_the_smoke_network_is_a_small_densenet_its_model_files_rebuild_and_nothing_else_takes(tmp_path):
    """A site config's ``network``: DenseNet121 unless it names the smoke network, which its preprocessing then
    records (so a model file, the server and every site build the same one); ImageNet weights fit DenseNet121 only,
    and a name the bundle does not know is refused naming the field."""
    from surgical_aggregation.core.errors import ModelFileError, SiteConfigError
    from surgical_aggregation.images.names import SMOKE_DENSENET
    from surgical_aggregation.training.config import site_config_from_dict

    def config(**fields):
        return site_config_from_dict({"data": {"kind": "nih"}, **fields}, "site.json")

    papers, smoke = config(), config(network=SMOKE_DENSENET)
    assert papers.modality.preprocessing(papers) == {"image_size": 224, "in_channels": 1, "imagenet_normalize": True}
    preprocessing = smoke.modality.preprocessing(smoke)
    assert preprocessing == {
        "image_size": 224,
        "in_channels": 1,
        "imagenet_normalize": True,
        "network": "densenet-smoke",
    }
    model = smoke.modality.build_model(CLASSES, preprocessing)
    _, head = split_backbone_head(model.state_dict())
    assert head["class_layers.out.weight"].shape == (3, 32)
    assert sum(value.numel() for key, value in model.named_parameters() if not key.startswith("class_layers")) == 26992
    assert model(torch.zeros(2, 1, 32, 32)).shape == (2, 3)
    rebuilt = load_checkpoint(
        save_checkpoint(tmp_path / "m.pt", model.state_dict(), CLASSES, preprocessing=preprocessing)
    ).build_model()
    assert rebuilt.network == SMOKE_DENSENET and rebuilt.state_dict().keys() == model.state_dict().keys()
    with pytest.raises(ModelFileError, match=r"m.pt: ImageNet weights fit DenseNet121, not the densenet-smoke network"):
        load_pretrained_backbone(model, tmp_path / "m.pt")
    with pytest.raises(SiteConfigError, match=r"site.json: network must be one of \['densenet121', 'densenet-smoke'\]"):
        config(network="resnet50").modality.check(config(network="resnet50"), "site.json")
