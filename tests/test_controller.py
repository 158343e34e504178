"""SurgicalAggregatorShareable's control flow, with simulated sites in place of FLARE's transport.

Only the transport (send/wait), persistence and logging are replaced; handshake, slicing,
aggregation, rejection, min_clients, best-model selection and early stopping are the real code.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from surgical_aggregation.core.head import initial_head_rows
from surgical_aggregation.evaluation.run_summary import summary_lines
from surgical_aggregation.flare.protocol import (
    META_CLASS_NAMES,
    META_PREPROCESSING,
    TASK_PUBLISH,
    TASK_REFUSED,
    TASK_TRAIN,
    TASK_VALIDATE,
)

from fake_sites import FAILS, Behaviour, FakeSite, Harness, messages, shifted
from helpers import TOY_HEAD, rows_by_name, toy_state


def test_union_slices_and_aggregation(tmp_path):
    a = FakeSite("site-a", ["Mass", "Effusion"], [0.5, 0.4, 0.3])
    b = FakeSite("site-b", ["Pleural Effusion", "Hernia"], [0.6, 0.5, 0.4])
    harness = Harness([b, a], tmp_path, num_rounds=2)
    harness.run()
    assert [r["round"] for r in harness.history] == [-1, 0, 1]  # one entry per global model (-1: before training)
    final = harness.saved[-1]
    # union in name order, whoever brought which class; "Effusion" is "Pleural Effusion"
    assert final.meta[META_CLASS_NAMES] == ["Hernia", "Mass", "Pleural Effusion"]
    # every task carried exactly the site's rows, in its order, with its own spelling
    assert all(classes == ["Mass", "Effusion"] for classes, _ in a.received)
    assert all(params["head.weight"].shape == (2, 4) for _, params in a.received)
    # round 1: each site sent its round-1 slice + 0.02; shared rows are the mean of both, others the owner's
    round_1 = {site.name: rows_by_name(site.received[1][1], site.classes) for site in (a, b)}
    result = rows_by_name(final.params, final.meta[META_CLASS_NAMES])
    np.testing.assert_allclose(result["Mass"], round_1["site-a"]["Mass"] + 0.02, atol=1e-6)
    shared = (round_1["site-a"]["Effusion"] + round_1["site-b"]["Pleural Effusion"]) / 2 + 0.02
    np.testing.assert_allclose(result["Pleural Effusion"], shared, atol=1e-6)
    assert (tmp_path / "round_history.json").is_file() and (tmp_path / "training_curves.png").is_file()


@pytest.mark.parametrize(("interval", "drawn_at"), [(3600.0, [2, 4]), (0.0, [2, 3, 4, 4])])
def test_the_curves_are_redrawn_at_most_every_interval_and_always_at_the_end(tmp_path, monkeypatch, interval, drawn_at):
    """Drawing the curves costs ~0.3 s: after a round they are redrawn only when CURVES_REDRAW_SECONDS have passed
    since the last drawing; the job's end always draws them, from the whole history (here: 4 entries)."""
    from surgical_aggregation.flare import controller, results

    drawn = []
    draw = results.plot_training_curves
    monkeypatch.setattr(
        results, "plot_training_curves", lambda history, path: drawn.append(len(history)) or draw(history, path)
    )
    monkeypatch.setattr(controller, "CURVES_REDRAW_SECONDS", interval)
    sites = [FakeSite("site-a", ["Mass"], [0.5, 0.4, 0.3]), FakeSite("site-b", ["Edema"], [0.5, 0.4, 0.3])]
    Harness(sites, tmp_path, num_rounds=3).run()
    assert drawn == drawn_at  # entries: -1 (unvalidated until round 0 reports), 0, 1, 2
    assert (tmp_path / "training_curves.png").stat().st_size > 10_000


def test_a_class_outside_the_built_in_vocabulary_joins_as_its_own_class(tmp_path):
    sites = [FakeSite("site-a", ["Mass"], [0.5]), FakeSite("site-b", ["Tumour", "Edema"], [0.5])]
    harness = Harness(sites, tmp_path, num_rounds=1)
    harness.run()
    assert harness.saved[-1].meta[META_CLASS_NAMES] == ["Edema", "Mass", "Tumour"]
    assert messages(harness, "error") == ""


def test_a_closed_vocabulary_refuses_a_site_bringing_another_class_and_goes_on(tmp_path):
    accepted = ["mass", "Effusion", "Edema"]  # read through the aliases: "Effusion" is "Pleural Effusion"
    sites = [FakeSite("site-a", ["Mass"], [0.5]), FakeSite("site-b", ["Edema"], [0.5])]
    refused = FakeSite("site-c", ["Edema", "Tumour"], [0.5])
    harness = Harness([*sites, refused], tmp_path, num_rounds=1, min_clients=2, accepted_classes=accepted)
    harness.run()
    assert (
        "handshake with site-c failed, leaving it out: site site-c's class names: class 'Tumour' (from 'Tumour') "
        "is not one of the job's accepted classes: Mass, Pleural Effusion, Edema"
    ) in messages(harness, "error")
    assert harness.saved[-1].meta[META_CLASS_NAMES] == ["Edema", "Mass"]
    assert [task for task, _, _ in refused.tasks] == [TASK_REFUSED]  # told why, then nothing more
    assert refused.outcomes == [
        {
            "task": "describe",
            "status": "refused",
            "reason": "site site-c's class names: class 'Tumour' (from 'Tumour') is not one of the job's accepted "
            "classes: Mass, Pleural Effusion, Edema",
        }
    ]
    with pytest.raises(RuntimeError, match=r"only 1 site\(s\) answered the handshake"):
        Harness([sites[0], refused], tmp_path / "two", num_rounds=1, accepted_classes=accepted).run()


def test_the_job_aliases_make_two_spellings_one_row(tmp_path):
    a = FakeSite("site-a", ["TB", "Mass"], [0.5, 0.4])
    b = FakeSite("site-b", ["tuberculosis"], [0.6, 0.5])
    harness = Harness([a, b], tmp_path, num_rounds=1, label_aliases={"TB": "Tuberculosis"})
    harness.run()
    final = harness.saved[-1]
    assert final.meta[META_CLASS_NAMES] == ["Mass", "Tuberculosis"]
    sent = {site.name: rows_by_name(site.received[0][1], site.classes) for site in (a, b)}
    shared = (sent["site-a"]["TB"] + sent["site-b"]["tuberculosis"]) / 2 + 0.01  # each sent its slice + 0.01
    np.testing.assert_allclose(
        rows_by_name(final.params, final.meta[META_CLASS_NAMES])["Tuberculosis"], shared, atol=1e-6
    )


def test_broken_update_is_rejected_and_the_round_continues(tmp_path):
    def nan_in_round_1(round_number, params):
        sent = shifted(params, 0.01)
        if round_number == 1:
            sent["backbone.conv.weight"][0, 0, 0, 0] = math.nan
        return sent

    sites = [
        FakeSite("site-a", ["Mass"], [0.5]),
        FakeSite("site-b", ["Mass", "Edema"], [0.5]),
        FakeSite("site-c", ["Edema"], [0.5], nan_in_round_1),
    ]
    harness = Harness(sites, tmp_path, num_rounds=2, min_clients=2)
    harness.run()
    assert "contribution from 'site-c' rejected: 'backbone.conv.weight' has 1 non-finite" in messages(harness, "error")
    round_1 = next(entry for entry in harness.history if entry["round"] == 1)["aggregation"]
    assert round_1["accepted"] == ["site-a", "site-b"] and "site-c" in round_1["rejected"]
    final = harness.saved[-1].params
    assert torch.isfinite(final["backbone.conv.weight"]).all()
    # Edema's row now comes from site-b alone
    sent_b = rows_by_name(shifted(sites[1].received[1][1], 0.02), sites[1].classes)
    union = harness.saved[-1].meta[META_CLASS_NAMES]
    np.testing.assert_allclose(rows_by_name(final, union)["Edema"], sent_b["Edema"], atol=1e-6)


def test_too_few_valid_contributions_keep_the_last_good_model(tmp_path):
    def silent_after_round_0(round_number, params):
        return shifted(params, 0.01) if round_number == 0 else None  # drops out

    sites = [FakeSite("site-a", ["Mass"], [0.5]), FakeSite("site-b", ["Edema"], [0.5], silent_after_round_0)]
    harness = Harness(sites, tmp_path, num_rounds=2, min_clients=2)
    harness.run()
    assert "round 1: no result from ['site-b']" in messages(harness, "warning")
    assert "keeping the last good global model" in messages(harness, "warning")
    assert [model.current_round for model in harness.saved] == [0]  # round 1 made no model: round 0's stays
    assert harness._federation.latest.round == 0 and harness.history[-1]["aggregation"]["trained_from"] == 0


def test_best_model_by_mean_validation_loss_and_early_stopping(tmp_path):
    # The sites validate each round's model at the end of that round (losses[r + 1]); the initial model is judged by
    # the figures of round 0's training task (losses[0]).
    sites = [
        FakeSite("site-a", ["Mass"], [0.9, 0.5, 0.3, 0.35, 0.34, 0.36, 0.6]),
        FakeSite("site-b", ["Edema"], [0.9, 0.7, 0.5, 0.55, 0.56, 0.54, 0.6]),
    ]
    harness = Harness(sites, tmp_path, num_rounds=7, patience=3, min_delta=1e-3)
    harness.run()
    # global of round 0: 0.6, round 1: 0.4 (best), rounds 2-4: 0.45 -> three without improvement -> stop
    judged = [(r["round"], r["validation"]["mean_val_loss"]) for r in harness.history if "validation" in r]
    assert [j[0] for j in judged] == [-1, 0, 1, 2, 3, 4]  # -1: before training (never best)
    assert [j[1] for j in judged] == pytest.approx([0.9, 0.6, 0.4, 0.45, 0.45, 0.45])
    assert harness.best_rounds() == [0, 1]
    assert harness._federation.best.round == 1
    assert max(r["round"] for r in harness.history) == 4  # stopped at once: rounds 5 and 6 never ran
    assert "early stop: 3 validated rounds without improvement" in messages(harness, "info")


def test_the_server_asks_each_site_to_warm_up_its_head_once(tmp_path):
    sites = [FakeSite("site-a", ["Mass"], [0.5, 0.4, 0.3]), FakeSite("site-b", ["Edema"], [0.6, 0.5, 0.4])]
    Harness(sites, tmp_path, num_rounds=3).run()
    assert [site.warmups for site in sites] == [[True, False, False], [True, False, False]]


# --- class-set privacy, publication, continuing federations, resuming after a crash -----------------


def test_before_publication_each_site_only_ever_receives_its_own_rows(tmp_path):
    a = FakeSite("site-a", ["Mass", "Effusion"], [0.9, 0.3, 0.5, 0.6])  # the best model is round 0's, not the last
    b = FakeSite("site-b", ["Pleural Effusion", "Hernia"], [0.9, 0.3, 0.5, 0.6])
    harness = Harness([a, b], tmp_path, num_rounds=3)
    harness.run()
    for site in (a, b):
        before_publication, publication = site.tasks[:-1], site.tasks[-1]
        assert [task for task, _, _ in before_publication] == [TASK_TRAIN, TASK_VALIDATE] * 3
        for _, names, params in before_publication:  # training, and the validation of each round's model
            assert names == site.classes  # its own classes, in its own spelling and order
            assert params["head.weight"].shape == (2, 4)
        task, names, params = publication
        assert task == TASK_PUBLISH and names == ["Hernia", "Mass", "Pleural Effusion"]
        assert params["head.weight"].shape == (3, 4)
    best = harness._federation.best
    assert best.round == 0
    np.testing.assert_array_equal(np.asarray(a.tasks[-1][2]["head.weight"]), np.asarray(best.state["head.weight"]))
    # the server's models as FLARE's cross-site evaluation reports them: latest and best, as validated in their round
    assert sorted((owner, site) for owner, site, _ in harness.validation_results) == [
        ("SRV_FL_global_model.pt", "site-a"),
        ("SRV_FL_global_model.pt", "site-b"),
        ("SRV_best_FL_global_model.pt", "site-a"),
        ("SRV_best_FL_global_model.pt", "site-b"),
    ]


def test_publication_can_leave_out_the_classes_one_site_labels(tmp_path):
    a = FakeSite("site-a", ["Mass", "Effusion"], [0.5, 0.4])  # Effusion: Pleural Effusion, which site-b labels too
    b = FakeSite("site-b", ["Pleural Effusion", "Hernia"], [0.5, 0.4])
    harness = Harness([a, b], tmp_path, num_rounds=1, min_sites_per_published_class=2)
    harness.run()
    best = harness._federation.best
    shared = rows_by_name(best.state, best.class_names, TOY_HEAD)["Pleural Effusion"]
    for site in (a, b):
        task, names, params = site.tasks[-1]
        assert task == TASK_PUBLISH and names == ["Pleural Effusion"]  # neither site learns the other's own class
        np.testing.assert_array_equal(rows_by_name(params, names, TOY_HEAD)["Pleural Effusion"], shared)
    assert "left out of the publication: 2 class(es) labelled by fewer than 2 sites" in messages(harness, "info")
    assert best.class_names == ["Hernia", "Mass", "Pleural Effusion"]  # the server keeps the whole union
    with pytest.raises(ValueError, match="min_sites_per_published_class must be a positive integer, got 0"):
        Harness([a, b], tmp_path, min_sites_per_published_class=0)


def test_the_servers_bundle_export_gets_the_site_counts_and_the_publication_minimum(tmp_path, monkeypatch):
    from surgical_aggregation.deployment import bundle
    from surgical_aggregation.deployment.bundle import ExportedBundle

    calls = []

    def export(model, out, **options):
        calls.append((model, out, options))
        return ExportedBundle(out, [], {})

    monkeypatch.setattr(bundle, "export_bundle", export)
    a = FakeSite("site-a", ["Mass", "Effusion"], [0.5, 0.4])
    b = FakeSite("site-b", ["Pleural Effusion", "Hernia"], [0.5, 0.4])
    Harness([a, b], tmp_path, num_rounds=1, export_bundle=True, min_sites_per_published_class=2).run()
    [(model, out, options)] = calls
    assert model.name == "FL_global_model.pt" and out.name == "monai_bundle"  # the toy harness saves no best file
    assert options["sites_labelling"] == {"Mass": 1, "Pleural Effusion": 2, "Hernia": 1}
    assert options["min_sites"] == 2 and options["overwrite"]


def test_a_dp_site_reports_its_epsilon_by_round_and_the_federation_goes_on_once_its_budget_is_spent(tmp_path):
    a = FakeSite("site-a", ["Mass"], [0.5, 0.4, 0.3])
    b = FakeSite("site-b", ["Mass", "Edema"], [0.5, 0.4, 0.3])
    c = FakeSite("site-c", ["Edema"], [0.5, 0.4, 0.3])
    spent = {0: 1.5, 1: 1.9, 2: 1.9}
    c.privacy = lambda round_number: {
        "epsilon": spent[round_number], "delta": 1e-5, "budget": 2.0, "stopped": round_number >= 2, "steps": 10,
        "unit": "patient",
    }  # fmt: skip
    b.privacy = lambda round_number: {
        "epsilon": "a lot",
        "delta": 1e-5,
        "budget": 2.0,
        "stopped": False,
        "unit": "patient",
    }  # not numbers; fmt: skip
    harness = Harness([a, b, c], tmp_path, num_rounds=3, min_clients=2)
    harness.run()
    rounds = {entry["round"]: entry["aggregation"] for entry in harness._federation.history if "aggregation" in entry}
    assert rounds[0]["privacy"] == {
        "site-c": {"epsilon": 1.5, "delta": 1e-5, "budget": 2.0, "unit": "patient", "stopped": False}
    }
    assert rounds[1]["privacy"]["site-c"]["epsilon"] == 1.9
    assert rounds[2]["privacy"]["site-c"]["stopped"] and "site-c" not in rounds[2]["accepted"]
    assert rounds[2]["budget_spent"]["site-c"].startswith(
        "its differential-privacy budget is spent (epsilon 1.900 per patient of"
    )
    assert rounds[2]["accepted"] == ["site-a", "site-b"]  # the others go on
    assert "privacy report" in rounds[0]["rejected_metrics"]["site-b"][0]  # a report that is not numbers is dropped
    assert "site-b" not in rounds[0]["privacy"] and "site-b" in rounds[0]["accepted"]
    assert c.outcomes[-1]["status"] == "budget_spent"
    assert "site-c sent no update: its differential-privacy budget is spent" in messages(harness, "warning")


def test_publication_can_be_turned_off(tmp_path):
    sites = [FakeSite("site-a", ["Mass"], [0.5, 0.4]), FakeSite("site-b", ["Edema"], [0.5, 0.4])]
    Harness(sites, tmp_path, num_rounds=1, publish_global_model=False).run()
    assert all(TASK_PUBLISH not in [task for task, _, _ in site.tasks] for site in sites)


def test_a_federation_continues_from_an_earlier_global_model(tmp_path):
    earlier = toy_state(2, seed=5)  # learned rows of Mass and Edema
    a = FakeSite("site-a", ["Mass", "Hernia"], [0.5, 0.4])  # Hernia: a class nobody had
    b = FakeSite("site-b", ["Edema"], [0.5, 0.4])
    harness = Harness([a, b], tmp_path, initial=(earlier, ["Mass", "Edema"]), num_rounds=1)
    harness.run()
    assert harness.saved[-1].meta[META_CLASS_NAMES] == ["Mass", "Edema", "Hernia"]  # existing first, new appended
    learned = rows_by_name(earlier, ["Mass", "Edema"])
    np.testing.assert_array_equal(rows_by_name(a.received[0][1], a.classes)["Mass"], learned["Mass"])
    np.testing.assert_array_equal(rows_by_name(b.received[0][1], b.classes)["Edema"], learned["Edema"])
    hernia = rows_by_name(a.received[0][1], a.classes)["Hernia"]
    fresh_weight, fresh_bias = initial_head_rows(["Hernia"], 4)
    np.testing.assert_allclose(hernia, np.append(fresh_weight[0], fresh_bias[0]), atol=1e-7)
    # a site warms its head up only when one of its classes starts from scratch
    assert (a.warmups, b.warmups) == ([True], [False])


def test_a_crashed_federation_resumes_from_its_last_completed_round(tmp_path):
    def crash_in_round_2(round_number, params):
        if round_number == 2:
            raise ConnectionError("the server went down")
        return shifted(params, 0.01)

    losses = [0.9, 0.5, 0.4, 0.45, 0.3]
    sites = [FakeSite("site-a", ["Mass"], losses), FakeSite("site-b", ["Edema"], losses, crash_in_round_2)]
    with pytest.raises(ConnectionError):
        Harness(sites, tmp_path, num_rounds=4).run()
    after_round_1 = Harness(sites, tmp_path, num_rounds=4)._state_location()
    assert after_round_1.is_file()

    again = [FakeSite("site-a", ["Mass"], losses), FakeSite("site-b", ["Edema"], losses)]
    harness = Harness(again, tmp_path, num_rounds=4)
    harness.run()
    assert "resuming the federation saved by job" in messages(harness, "info")
    assert [entry["round"] for entry in harness.history] == [-1, 0, 1, 2, 3]  # each model once
    assert all("aggregation" in entry for entry in harness.history[1:])
    assert [site.warmups for site in again] == [[False, False], [False, False]]  # warmed up before the crash
    assert again[0].received[0][1]["head.weight"].shape == (1, 4)  # resumed with the union, at round 2
    assert harness.saved[0].current_round == 2
    assert harness._federation.best.round == 3 and harness._federation.finished

    # a finished federation is not resumed: the next job of that name starts afresh
    fresh = [FakeSite("site-a", ["Mass"], losses), FakeSite("site-b", ["Edema"], losses)]
    restarted = Harness(fresh, tmp_path, num_rounds=1)
    restarted.run()
    assert [entry["round"] for entry in restarted.history] == [-1, 0] and fresh[0].warmups == [True]


def test_an_unfinished_federation_is_not_continued_with_another_method(tmp_path):
    def crash(round_number, params):
        raise ConnectionError("the server went down")

    with pytest.raises(ConnectionError):
        Harness([FakeSite("site-a", ["Mass"], [0.5], crash)], tmp_path, num_rounds=2, min_clients=1).run()
    with pytest.raises(RuntimeError, match=r"ran with .*'method': 'surgical'.*with resume \"never\" to start afresh"):
        Harness([FakeSite("site-a", ["Mass"], [0.5])], tmp_path, num_rounds=2, min_clients=1, method="personal").run()


# --- sites that are broken, hostile, dead or slow: one test per case the server must survive -------------------


class RenamingSite(FakeSite):
    def __init__(self, name, classes, losses, sent_names):
        super().__init__(name, classes, losses)
        self.sent_names = sent_names

    def answer(self, task, data):
        answer = super().answer(task, data)
        if task == TASK_TRAIN and answer is not None:
            answer.meta[META_CLASS_NAMES] = self.sent_names
        return answer


def test_a_row_for_a_class_the_site_never_declared_is_rejected(tmp_path):
    liar = RenamingSite("site-a", ["Mass", "Pneumothorax"], [0.5, 0.4], ["Mass", "Fracture"])
    honest = FakeSite("site-b", ["Fracture", "Mass"], [0.5, 0.4])
    harness = Harness([liar, honest], tmp_path, num_rounds=1, min_clients=1)
    harness.run()
    reason = harness.history[1]["aggregation"]["rejected"]["site-a"]
    assert reason == "rows for classes it did not declare: ['Fracture']"
    final = rows_by_name(harness.saved[-1].params, harness.saved[-1].meta[META_CLASS_NAMES])
    sent_by_honest = rows_by_name(shifted(honest.received[0][1], 0.01), honest.classes)
    np.testing.assert_allclose(final["Fracture"], sent_by_honest["Fracture"], atol=1e-6)  # site-b's row alone
    assert liar.outcomes[-1] == {"task": TASK_TRAIN, "round": 0, "status": "rejected", "reason": reason}


def test_a_row_for_a_class_no_site_has_does_not_grow_the_union(tmp_path):
    grower = RenamingSite("site-a", ["Mass"], [0.5, 0.4], ["Pneumomediastinum"])
    harness = Harness([grower, FakeSite("site-b", ["Edema"], [0.5, 0.4])], tmp_path, num_rounds=1, min_clients=1)
    harness.run()
    assert harness.saved[-1].meta[META_CLASS_NAMES] == ["Edema", "Mass"]  # the union grows only at the handshake
    assert "did not declare: ['Pneumomediastinum']" in harness.history[1]["aggregation"]["rejected"]["site-a"]


def test_an_update_out_of_proportion_is_rejected(tmp_path):
    def scaled(factor):
        return lambda round_number, params: {
            key: value * factor if value.is_floating_point() else value for key, value in shifted(params, 0).items()
        }

    honest = [FakeSite("site-a", ["Mass"], [0.5, 0.4]), FakeSite("site-b", ["Mass"], [0.5, 0.4])]
    harness = Harness([*honest, FakeSite("site-c", ["Mass"], [0.5, 0.4], scaled(1e30))], tmp_path, num_rounds=2)
    harness.run()
    for entry in harness.history[1:]:
        assert entry["aggregation"]["accepted"] == ["site-a", "site-b"]
        reason = entry["aggregation"]["rejected"]["site-c"]
        assert reason.startswith("its update of the backbone weights is 1e+30 times their size; this federation ")
    assert float(np.abs(np.asarray(harness.saved[-1].params["head.weight"])).max()) < 10
    # with the bound off (research), a update ten times the weights' size is taken
    off = Harness(
        [FakeSite("site-a", ["Mass"], [0.5]), FakeSite("site-c", ["Mass"], [0.5], scaled(10.0))],
        tmp_path / "off",
        num_rounds=1,
        update_bound=None,
    )
    off.run()
    assert off.history[1]["aggregation"]["accepted"] == ["site-a", "site-c"]


def test_a_forged_validation_loss_does_not_steer_model_selection(tmp_path):
    forger = FakeSite("site-b", ["Edema"], [0.6, 0.6, 0.6])
    forger.metrics_override = forger.validation_override = {"val_loss": -1e9}
    honest = FakeSite("site-a", ["Mass"], [0.9, 0.3, 0.5])  # round 0's model is the best by honest losses
    harness = Harness([honest, forger], tmp_path, num_rounds=3, min_clients=1)
    harness.run()
    rejected = harness.history[1]["aggregation"]["rejected_metrics"]["site-b"]
    assert rejected == ["val_loss = -1e+09 is outside [0, 100]"]
    assert harness.history[1]["rejected_validation_metrics"]["site-b"] == rejected
    assert harness.history[1]["validation"]["judged_by"]["sites"] == ["site-a"]  # only checked metrics judge it
    assert harness._federation.best.round == 0 and harness.best_rounds() == [0]


def test_a_forged_validation_that_is_not_a_number_is_dropped_and_named(tmp_path):
    forger = FakeSite("site-b", ["Edema"], [0.6, 0.6, 0.6])
    forger.validation_override = {"val_loss": -1e9, "val_mean_auroc": "high"}
    honest = FakeSite("site-a", ["Mass"], [0.9, 0.3, 0.5])
    harness = Harness([honest, forger], tmp_path, num_rounds=3, min_clients=1)
    harness.run()
    final = harness.history[-1]
    assert final["rejected_validation_metrics"] == {
        "site-b": ["val_loss = -1e+09 is outside [0, 100]", "val_mean_auroc is not a number: 'high'"]
    }
    assert final["validation"]["judged_by"]["sites"] == ["site-a"] and final["validation"]["judged_val_loss"] == 0.5
    assert harness._federation.best.round == 0  # site-a's 0.3 stays the lowest


def test_a_metric_that_is_not_a_number_is_rejected_and_the_run_goes_on(tmp_path):
    wordy = FakeSite("site-b", ["Edema"], [0.6, 0.5])
    wordy.metrics_override = {"val_loss": "0.5", "val_mean_auroc": float("nan")}
    harness = Harness([FakeSite("site-a", ["Mass"], [0.6, 0.5]), wordy], tmp_path, num_rounds=2)
    harness.run()
    problems = harness.history[1]["aggregation"]["rejected_metrics"]["site-b"]
    assert problems == ["val_loss is not a number: '0.5'", "val_mean_auroc is not finite: nan"]
    assert harness.history[1]["aggregation"]["accepted"] == ["site-a", "site-b"]  # the weights are fine
    assert harness.history[-1]["validation"]["sites"]  # the final validation ran
    assert wordy.outcomes[0]["status"] == "aggregated" and wordy.outcomes[0]["rejected_metrics"] == problems


def test_a_dead_site_is_not_waited_for_and_may_come_back(tmp_path):
    def dies_in_round_1(round_number, params):
        if round_number == 1:
            harness.dead.add("site-b")
            return None  # no answer: its task stands
        return shifted(params, 0.01)

    def brings_b_back_in_round_3(round_number, params):
        if round_number == 3:
            harness.dead.clear()  # FLARE sees site-b again (its next heartbeat)
        return shifted(params, 0.01)

    sites = [
        FakeSite("site-a", ["Mass"], [0.5, 0.4, 0.3, 0.3], brings_b_back_in_round_3),
        FakeSite("site-b", ["Edema"], [0.5, 0.4, 0.3, 0.3], dies_in_round_1),
    ]
    harness = Harness(sites, tmp_path, num_rounds=4, min_clients=1)
    harness.run()
    assert harness.cancelled == 1  # round 1 stopped waiting once only the dead site was awaited
    assert "['site-b'] disconnected: not waiting for their answers" in messages(harness, "warning")
    assert "site-b is disconnected: no train task for it" in messages(harness, "warning")  # round 2
    assert [entry["aggregation"]["accepted"] for entry in harness.history[1:]] == [
        ["site-a", "site-b"],
        ["site-a"],
        ["site-a"],
        ["site-a", "site-b"],
    ]
    assert sites[1].training_rounds == [0, 1, 3]  # no task while it was disconnected


def test_partial_loss_sites_that_leave_the_rows_they_do_not_label_alone_are_accepted_every_round(tmp_path):
    def own_row_moved(site: FakeSite) -> Behaviour:
        def train(round_number: int, params: dict) -> dict:
            union = site.received[-1][0]  # partial loss: the site trains the union head, masked to its labels
            sent = {key: torch.as_tensor(value).clone() for key, value in params.items()}
            for key in TOY_HEAD.keys:
                sent[key][union.index(site.classes[0])] += 0.01 * (1 + round_number)
            sent["backbone.conv.weight"] += 0.01
            return sent

        return train

    labels = {"site-a": "Mass", "site-b": "Edema", "site-c": "Nodule"}  # each site leaves 2 of 3 rows alone
    sites = [FakeSite(name, [label], [0.5, 0.4, 0.3, 0.2]) for name, label in labels.items()]
    for site in sites:
        site.behaviour, site.trains_received_rows = own_row_moved(site), True
    harness = Harness(sites, tmp_path, num_rounds=4, method="partial_loss")
    harness.run()
    assert [entry["aggregation"]["accepted"] for entry in harness.history[1:]] == [list(labels)] * 4
    assert all(entry["aggregation"]["update_sizes"]["site-a"]["head rows"] > 0 for entry in harness.history[2:])


def test_a_failed_task_is_recorded_and_the_round_goes_on(tmp_path):
    def job_process_killed_in_round_1(round_number, params):
        return FAILS if round_number == 1 else shifted(params, 0.01)  # FLARE: EXECUTION_EXCEPTION, no result

    failing = FakeSite("site-b", ["Edema"], [0.5, 0.4, 0.3], job_process_killed_in_round_1)
    harness = Harness([FakeSite("site-a", ["Mass"], [0.5, 0.4, 0.3]), failing], tmp_path, num_rounds=3, min_clients=1)
    harness.run()
    assert [entry["aggregation"]["failed"] for entry in harness.history[1:]] == [
        {},
        {"site-b": "EXECUTION_EXCEPTION"},
        {},
    ]
    assert (
        harness.history[2]["aggregation"]["accepted"] == ["site-a"]
        and harness.history[2]["aggregation"]["missing"] == []
    )
    assert "round 1: the training task of site-b failed (EXECUTION_EXCEPTION)" in messages(harness, "error")
    assert failing.outcomes[1] == {
        "task": TASK_TRAIN,
        "round": 1,
        "status": "failed",
        "reason": "its training task failed (EXECUTION_EXCEPTION)",
    }
    assert harness.history[3]["aggregation"]["accepted"] == ["site-a", "site-b"]  # back in the next round


def test_a_late_result_is_told_to_the_site_as_not_aggregated(tmp_path):
    def late_in_round_0(round_number, params):
        return None if round_number == 0 else shifted(params, 0.01)  # FLARE dropped its late result

    late = FakeSite("site-b", ["Edema"], [0.5, 0.4], late_in_round_0)
    Harness([FakeSite("site-a", ["Mass"], [0.5, 0.4]), late], tmp_path, num_rounds=2, min_clients=1).run()
    assert late.outcomes[0] == {
        "task": TASK_TRAIN,
        "round": 0,
        "status": "not_received",
        "reason": "no result arrived in time; a late result is dropped",
    }
    assert late.outcomes[1] == {"task": TASK_TRAIN, "round": 1, "status": "aggregated"}


def test_a_federation_that_never_made_progress_fails_and_names_the_sites(tmp_path):
    def unreadable_images(round_number, params):
        return FAILS  # the site raises UnreadableImagesError every round

    sites = [FakeSite("site-a", ["Mass"], [0.5]), FakeSite("site-b", ["Edema"], [0.5], unreadable_images)]
    harness = Harness(sites, tmp_path, num_rounds=2, min_clients=2)
    with pytest.raises(RuntimeError, match=r"made no progress: in 2 round\(s\) none aggregated 2 valid"):
        harness.run()
    assert [entry["aggregation"]["failed"] for entry in harness.history[1:]] == [{"site-b": "EXECUTION_EXCEPTION"}] * 2
    assert harness.history[1]["aggregation"]["accepted"] == ["site-a"]
    assert harness.best_rounds() == []  # no model is labelled best
    assert "site-b: its training task failed (EXECUTION_EXCEPTION)" in messages(harness, "error")
    assert "site-a: its result was valid, but no round had 2 valid contributions" in messages(harness, "error")
    assert all(TASK_PUBLISH not in [task for task, _, _ in site.tasks] for site in sites)  # nothing published
    assert harness._federation.finished  # a corrected job starts afresh


def test_one_preprocessing_per_federation(tmp_path):
    small = FakeSite("site-b", ["Edema"], [0.5, 0.4])
    small.preprocessing = {**small.preprocessing, "image_size": 32}
    sites = [FakeSite("site-a", ["Mass"], [0.5, 0.4]), small]
    harness = Harness(sites, tmp_path, num_rounds=1, min_clients=1)
    harness.run()
    assert (
        "handshake with site-b refused: it preprocesses its data otherwise: image_size 32 (the federation's: 64)"
        in (messages(harness, "error"))
    )
    assert harness.saved[-1].meta[META_PREPROCESSING]["image_size"] == 64
    assert [task for task, _, _ in small.tasks] == [TASK_REFUSED]
    assert small.outcomes[0]["reason"].endswith('set "image_size": 64 in its site config')
    # a site on the smoke network, in a federation of DenseNet121 (whose preprocessing names no network)
    smoke = FakeSite("site-c", ["Edema"], [0.5, 0.4])
    smoke.preprocessing = {**smoke.preprocessing, "image_size": 32, "network": "densenet-smoke"}
    mixed = Harness([FakeSite("site-a", ["Mass"], [0.5, 0.4]), smoke], tmp_path / "mixed", num_rounds=1, min_clients=1)
    mixed.run()
    assert smoke.outcomes[0]["reason"].endswith(
        "image_size 32 (the federation's: 64), network 'densenet-smoke' (the federation's: None); one preprocessing "
        'per federation, so the model can be used on every site\'s data: set "image_size": 64 and leave out "network" '
        "in its site config"
    )
    # a job may set the federation's preprocessing: then a site that differs from it is refused, by name
    decided = Harness(
        [FakeSite("site-a", ["Mass"], [0.5, 0.4]), FakeSite("site-b", ["Edema"], [0.5, 0.4])],
        tmp_path / "job",
        num_rounds=1,
        min_clients=1,
        preprocessing={"image_size": 128, "in_channels": 1, "imagenet_normalize": True},
    )
    with pytest.raises(RuntimeError, match=r"only 0 site\(s\) answered the handshake"):
        decided.run()


def test_a_site_that_never_answers_the_handshake_is_named_and_the_job_goes_on_without_it(tmp_path):
    """A site whose process never started (FLARE's simulator can lose one at its start) or that is down gives no
    answer at all, and one whose handshake raised answers with an error: the log names each, as what it is, and the
    job goes on with the others where ``min_clients`` allows."""
    silent, failing = FakeSite("site-b", ["Edema"], [0.5, 0.4]), FakeSite("site-c", ["Nodule"], [0.5, 0.4])
    silent.answer = lambda task, data: None
    failing.answer = lambda task, data: FAILS
    sites = [FakeSite("site-a", ["Mass"], [0.5, 0.4]), silent, failing]
    harness = Harness(sites, tmp_path, num_rounds=1, min_clients=1)
    harness.run()
    assert messages(harness, "error") == (
        f"site-b did not answer the describe task within {harness.handshake_timeout} s: it takes no part in this job\n"
        "site-c answered the describe task with an error (EXECUTION_EXCEPTION): its log names the cause; it takes no "
        "part in this job"
    )
    assert [entry["aggregation"]["accepted"] for entry in harness.history if "aggregation" in entry] == [["site-a"]]


def test_the_history_and_summary_say_what_the_federation_started_from(tmp_path):
    sites = [FakeSite("site-a", ["Mass"], [0.5, 0.4]), FakeSite("site-b", ["Edema"], [0.5, 0.4])]
    harness = Harness(sites, tmp_path, num_rounds=1)
    harness.run()
    started = {"origin": "given by the job's persistor", "backbone_strategy": "fedavg"}  # the harness's own model
    assert harness.history[0]["initial_model"] == started
    assert "  started from        given by the job's persistor; backbone strategy fedavg" in summary_lines(
        harness.history, {}
    )
