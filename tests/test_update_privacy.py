"""FLARE's privacy filters on a site's training results (``flare.update_privacy``): what the server receives.

Each test runs FLARE's own filter classes the way a FLARE client does: the ``train`` task's Shareable through
``KeepReceivedModel`` (task data filter), the site's result through ``UpdatePrivacy`` (task result filter), one
FLContext for the task; the result is read back as the server reads it (``FLModelUtils.from_shareable``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.apis.workspace import Workspace
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.filters.exclude_vars import ExcludeVars
from nvflare.app_common.filters.percentile_privacy import PercentilePrivacy
from nvflare.app_common.filters.svt_privacy import SVTPrivacy
from nvflare.app_common.utils.fl_model_utils import FLModelUtils
from nvflare.private.fed.app.fl_conf import create_privacy_manager

from surgical_aggregation.core.update_entries import apply_entries, head_row_entry, update_entries
from surgical_aggregation.flare.deploy import privacy_policy
from surgical_aggregation.flare.protocol import META_CLASS_NAMES, META_NUM_SAMPLES
from surgical_aggregation.flare.recipe import write_job
from surgical_aggregation.flare.update_privacy import (
    KeepReceivedModel,
    UpdatePrivacy,
    UpdatePrivacyError,
    privacy_filter_config,
    read_privacy_filter,
)

RECEIVED_CLASSES = ["Effusion", "Hernia"]
SENT_CLASSES = ["Hernia", "Effusion"]  # another order: rows are matched by name


def received_model() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "features.conv0.weight": rng.normal(size=(4, 3)).astype(np.float32),
        "features.norm0.running_var": rng.uniform(0.5, 1.5, size=3).astype(np.float32),
        "features.norm0.num_batches_tracked": np.array(7, dtype=np.int64),
        "class_layers.out.weight": rng.normal(size=(2, 3)).astype(np.float32),
        "class_layers.out.bias": rng.normal(size=2).astype(np.float32),
    }


def trained_model(received: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The site's result: every floating value moved, rows in SENT_CLASSES order."""
    rng = np.random.default_rng(1)
    sent = {key: value + rng.normal(scale=0.05, size=value.shape).astype(value.dtype) for key, value in
            received.items() if value.dtype.kind == "f"}  # fmt: skip
    sent["features.norm0.num_batches_tracked"] = np.array(9, dtype=np.int64)
    order = [RECEIVED_CLASSES.index(name) for name in SENT_CLASSES]
    sent["class_layers.out.weight"] = sent["class_layers.out.weight"][order]
    sent["class_layers.out.bias"] = sent["class_layers.out.bias"][order]
    return sent


def as_server_receives(privacy_filter, received, sent, keep_received: bool = True) -> FLModel:
    """The site's result after the filter pair, read as the server reads it (``privacy_filter``: FLARE's filter, or an
    ``UpdatePrivacy`` that wraps one, to run it again)."""
    fl_ctx = FLContext()
    task = FLModelUtils.to_shareable(FLModel(params=received, meta={META_CLASS_NAMES: RECEIVED_CLASSES}))
    if keep_received:
        KeepReceivedModel().process(task, fl_ctx)
    result = FLModel(
        params={key: value.copy() for key, value in sent.items()},
        metrics={"val_loss": 0.5},
        meta={META_CLASS_NAMES: SENT_CLASSES, META_NUM_SAMPLES: 10},
    )
    wrapper = privacy_filter if isinstance(privacy_filter, UpdatePrivacy) else UpdatePrivacy(privacy_filter)
    return FLModelUtils.from_shareable(wrapper.process(FLModelUtils.to_shareable(result), fl_ctx))


def rows(state: dict[str, np.ndarray], classes: list[str]) -> dict[str, np.ndarray]:
    """Each class's head row (weights then bias) by name."""
    return {name: np.append(state["class_layers.out.weight"][i], state["class_layers.out.bias"][i])
            for i, name in enumerate(classes)}  # fmt: skip


def test_entries_name_the_backbone_and_each_row_and_round_trip_exactly():
    received = received_model()
    sent = trained_model(received)
    changes = update_entries(sent, SENT_CLASSES, received, RECEIVED_CLASSES)
    assert sorted(changes) == sorted(
        ["features.conv0.weight", "features.norm0.running_var", "class_layers.out/Effusion", "class_layers.out/Hernia"]
    )
    assert changes[head_row_entry("Hernia")].shape == (4,)  # 3 weights and the bias: never a lone scalar
    expected = rows(sent, SENT_CLASSES)["Hernia"].astype(np.float64) - rows(received, RECEIVED_CLASSES)["Hernia"]
    np.testing.assert_array_equal(changes["class_layers.out/Hernia"], expected)
    rebuilt = apply_entries(sent, SENT_CLASSES, received, RECEIVED_CLASSES, changes)
    for key, value in sent.items():
        assert rebuilt[key].dtype == value.dtype
        np.testing.assert_array_equal(rebuilt[key], value)  # exactly as trained
    unchanged = apply_entries(sent, SENT_CLASSES, received, RECEIVED_CLASSES, {})
    np.testing.assert_array_equal(unchanged["features.conv0.weight"], received["features.conv0.weight"])
    assert rows(unchanged, SENT_CLASSES)["Effusion"].tolist() == rows(received, RECEIVED_CLASSES)["Effusion"].tolist()
    assert int(unchanged["features.norm0.num_batches_tracked"]) == 9  # a counter is sent as it is


def test_exclude_vars_sends_the_named_parts_as_received_and_the_rest_as_trained():
    received = received_model()
    sent = trained_model(received)
    model = as_server_receives(ExcludeVars(exclude_vars=r"/Hernia$|^features\.conv0"), received, sent)
    params = model.params
    np.testing.assert_array_equal(params["features.conv0.weight"], received["features.conv0.weight"])
    np.testing.assert_array_equal(params["features.norm0.running_var"], sent["features.norm0.running_var"])
    got, before, after = rows(params, SENT_CLASSES), rows(received, RECEIVED_CLASSES), rows(sent, SENT_CLASSES)
    np.testing.assert_array_equal(got["Hernia"], before["Hernia"])
    np.testing.assert_array_equal(got["Effusion"], after["Effusion"])
    assert model.meta[META_CLASS_NAMES] == SENT_CLASSES and model.meta[META_NUM_SAMPLES] == 10
    assert model.metrics == {"val_loss": 0.5}


def test_percentile_privacy_zeroes_the_small_changes_and_clips_the_rest_to_gamma():
    received = received_model()
    sent = trained_model(received)
    gamma = 0.03
    model = as_server_receives(PercentilePrivacy(percentile=50, gamma=gamma), received, sent)
    changes = update_entries(sent, SENT_CLASSES, received, RECEIVED_CLASSES)
    cutoff = np.percentile(np.concatenate([np.abs(change.ravel()) for change in changes.values()]), 50)
    expected = {name: np.clip(np.where(np.abs(change) < cutoff, 0.0, change), -gamma, gamma)
                for name, change in changes.items()}  # fmt: skip
    got = update_entries(model.params, SENT_CLASSES, received, RECEIVED_CLASSES)
    for name, change in expected.items():
        np.testing.assert_allclose(got[name], change, atol=1e-6)
        assert np.all(np.abs(got[name]) <= gamma + 1e-6)
    sent_as_received = sum(int(np.sum(got[name] == 0)) for name in got)
    assert sent_as_received == sum(change.size for change in changes.values()) // 2  # half below the median
    assert int(model.params["features.norm0.num_batches_tracked"]) == 9


def test_svt_privacy_sends_a_noised_fraction_of_the_update_biases_included_and_reports_its_epsilon(monkeypatch):
    received = received_model()
    sent = trained_model(received)
    total = sum(change.size for change in update_entries(sent, SENT_CLASSES, received, RECEIVED_CLASSES).values())
    np.random.seed(3)
    svt = UpdatePrivacy(SVTPrivacy(fraction=0.1, epsilon=1.0, noise_var=0.5, gamma=1.0, tau=0.0))
    logged = []
    monkeypatch.setattr(svt, "log_info", lambda fl_ctx, message, *args, **kwargs: logged.append(message))
    model = as_server_receives(svt, received, sent)
    got = update_entries(model.params, SENT_CLASSES, received, RECEIVED_CLASSES)
    moved = sum(int(np.sum(change != 0)) for change in got.values())
    n_upload = math.ceil(total * 0.1)
    assert 1 <= moved <= n_upload  # every other value, the row biases too, arrives as received
    trained = update_entries(sent, SENT_CLASSES, received, RECEIVED_CLASSES)
    assert all(not np.array_equal(got[name], trained[name]) for name in trained)  # nothing leaves as trained
    budget = model.meta["svt_privacy_budget"]
    assert budget["n_upload"] == n_upload
    assert budget["epsilon_total"] == pytest.approx(1.0 + n_upload * 0.5)  # threshold + query + release
    assert model.meta["svt_privacy_accountant"]["epsilon_total"] == pytest.approx(budget["epsilon_total"])
    again = as_server_receives(svt, received, sent)  # the next round, in the same job: FLARE sums the epsilons
    assert again.meta["svt_privacy_accountant"]["epsilon_total"] == pytest.approx(2 * budget["epsilon_total"])
    spent = f"SVT epsilon spent by this filter so far {2 * budget['epsilon_total']:.4g} per update"  # in the site's log
    assert spent in logged[-1]


def test_the_filter_fails_closed_without_the_received_model_or_with_a_row_it_did_not_receive():
    received = received_model()
    sent = trained_model(received)
    with pytest.raises(UpdatePrivacyError, match="KeepReceivedModel is not among the task data filters"):
        as_server_receives(PercentilePrivacy(), received, sent, keep_received=False)
    submit_model = Shareable()  # FLARE's site-to-site evaluation asks for the local model with no model in the task
    fl_ctx = FLContext()
    KeepReceivedModel().process(submit_model, fl_ctx)
    local_model = FLModelUtils.to_shareable(FLModel(params=sent, meta={META_CLASS_NAMES: SENT_CLASSES}))
    with pytest.raises(UpdatePrivacyError, match="site-to-site evaluation sends the local model whole"):
        UpdatePrivacy(ExcludeVars(exclude_vars="^features")).process(local_model, fl_ctx)
    fl_ctx = FLContext()
    task = FLModelUtils.to_shareable(FLModel(params=received, meta={META_CLASS_NAMES: ["Effusion", "Hernia "]}))
    KeepReceivedModel().process(task, fl_ctx)
    result = FLModelUtils.to_shareable(FLModel(params=sent, meta={META_CLASS_NAMES: SENT_CLASSES}))
    with pytest.raises(UpdatePrivacyError, match=r"head rows \['Hernia'\] were not in the model this site received"):
        UpdatePrivacy(PercentilePrivacy()).process(result, fl_ctx)


def test_a_result_without_weights_passes_and_other_filters_are_refused():
    stopped = FLModelUtils.to_shareable(FLModel(params={}, metrics={"val_loss": 0.4}, meta={META_CLASS_NAMES: []}))
    out = FLModelUtils.from_shareable(UpdatePrivacy(PercentilePrivacy()).process(stopped, FLContext()))
    assert out.params == {} and out.metrics == {"val_loss": 0.4}
    with pytest.raises(UpdatePrivacyError, match="filters of model updates"):
        UpdatePrivacy(KeepReceivedModel())
    assert privacy_filter_config({"path": "svt", "args": {"epsilon": 1}})["path"].endswith("SVTPrivacy")
    for wrong, message in (({"args": {}}, "a privacy filter is"), ({"path": "percentile", "gamma": 1}, "fields")):
        with pytest.raises(UpdatePrivacyError, match=message):
            privacy_filter_config(wrong)


def test_a_sites_privacy_json_scope_builds_the_pair_in_flares_own_parser(tmp_path):
    """``flare.deploy.privacy_policy`` as FLARE's client reads ``local/privacy.json``: the received model kept on the
    way in, PercentilePrivacy with its args on the way out."""
    (tmp_path / "local").mkdir()
    (tmp_path / "startup").mkdir()
    policy = privacy_policy({"path": "percentile", "args": {"percentile": 20, "gamma": 0.05}})
    (tmp_path / "local" / "privacy.json").write_text(json.dumps(policy))
    scope = create_privacy_manager(Workspace(str(tmp_path), "site-a"), names_only=False).get_scope(None)
    assert [type(f).__name__ for f in scope.task_data_filters["in"]] == ["KeepReceivedModel"]
    (result_filter,) = scope.task_result_filters["out"]
    assert isinstance(result_filter, UpdatePrivacy)
    wrapped = result_filter.wrapped
    assert isinstance(wrapped, PercentilePrivacy) and (wrapped.percentile, wrapped.gamma) == (20, 0.05)
    assert privacy_policy()["scopes"][0]["task_result_filters"] == []  # the default filters nothing
    with pytest.raises(UpdatePrivacyError, match="with args"):  # refused before a site's policy is written
        privacy_policy({"path": "svt", "args": {"epsilon_budget": 1}})


def test_the_guides_privacy_json_is_the_one_privacy_policy_writes():
    guide = (Path(__file__).resolve().parents[1] / "provisioning" / "README.md").read_text()
    example = privacy_policy({"path": "percentile", "args": {"percentile": 10, "gamma": 0.01}})
    assert f"```json\n{json.dumps(example, indent=2)}\n```" in guide


def test_the_jobs_update_privacy_option_puts_the_pair_on_every_sites_train_task(tmp_path):
    from surgical_aggregation.cli import main
    from surgical_aggregation.flare.recipe import report_labeling_recipe

    config = tmp_path / "filter.json"
    config.write_text(json.dumps({"path": "exclude_vars", "args": {"exclude_vars": "^class_layers"}}))
    assert main(["write-job", "--name", "report_labeling", "--out", str(tmp_path / "job"),
                 "--privacy-filter", str(config)]) == 0  # fmt: skip
    for site in report_labeling_recipe().sites:
        client = json.loads((tmp_path / "job" / f"app_{site}" / "config" / "config_fed_client.json").read_text())
        (data,) = client["task_data_filters"]
        (result,) = client["task_result_filters"]
        assert set(data["tasks"]) == set(result["tasks"]) == {"train", "submit_model"}  # FedJob keeps them as a set
        assert data["filters"][0]["path"].endswith("KeepReceivedModel")
        wrapped = result["filters"][0]["args"]["privacy_filter"]
        assert wrapped["path"] == "nvflare.app_common.filters.exclude_vars.ExcludeVars"
        assert wrapped["args"]["exclude_vars"] == "^class_layers"
    with pytest.raises(UpdatePrivacyError, match=r"privacy filter nvflare\S+PercentilePrivacy with args"):
        write_job(report_labeling_recipe(update_privacy={"path": "percentile", "args": {"cutoff": 1}}), tmp_path / "x")
    config.write_text("{not json")
    with pytest.raises(UpdatePrivacyError, match=f"privacy filter file {config}: not JSON"):
        read_privacy_filter(config)
