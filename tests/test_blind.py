"""Blind surgical aggregation (core.blind): sums of encrypted, name-keyed slots give every site what surgical
aggregation gives it, the server's context cannot decrypt, and what the server receives names no class."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from surgical_aggregation.core.aggregation import Contribution, SurgicalAggregator
from surgical_aggregation.core.blind import (
    FLOODING_SD,
    MOST_SITES,
    NOISE_UNITS,
    SCALE_BITS,
    BlindAggregationError,
    BlindCipher,
    BlindLayout,
    BlindSecret,
    blind_weight,
    keyed_gaussian,
    new_sites_key,
    split_job_key,
)
from surgical_aggregation.core.head import NAMED_HEAD
from surgical_aggregation.core.strategies import strategy

FEATURES = 6
SITES = {
    "site-a": ["Atelectasis", "Effusion", "Mass"],
    "site-b": ["Effusion", "Pneumonia"],
    "site-c": ["Mass", "Effusion", "Hernia", "Edema"],
}
SAMPLES = {"site-a": 1200, "site-b": 300, "site-c": 4500}
CONSORTIUM = ["Atelectasis", "Cardiomegaly", "Edema", "Effusion", "Hernia", "Mass", "Nodule", "Pneumonia"]


def _state(classes: list[str], seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "features.conv0.weight": torch.randn(4, 1, 3, 3, generator=generator),
        "features.norm0.weight": torch.rand(4, generator=generator) + 0.5,
        "features.norm0.running_mean": torch.randn(4, generator=generator),
        "features.norm0.num_batches_tracked": torch.tensor(7 + seed),
        NAMED_HEAD.weight_key: torch.randn(len(classes), FEATURES, generator=generator),
        NAMED_HEAD.bias_key: torch.randn(len(classes), generator=generator),
    }


@pytest.fixture(scope="module")
def cipher() -> BlindCipher:
    return BlindCipher.for_sites()


@pytest.mark.parametrize("backbone_strategy", ["fedavg", "fedbn_plus"])
@pytest.mark.parametrize("weighting", ["uniform", "samples"])
def test_blind_sums_give_each_site_what_surgical_aggregation_gives_it(cipher, backbone_strategy, weighting):
    states = {site: _state(classes, seed) for seed, (site, classes) in enumerate(SITES.items())}
    union = sorted({name for classes in SITES.values() for name in classes})
    global_state = _state(union, 99)
    plain = SurgicalAggregator(global_state, union, backbone_strategy, weighting)
    for site, classes in SITES.items():
        plain.add(Contribution(site, states[site], classes, SAMPLES[site]))
    expected = plain.finalize()

    averaged = strategy(backbone_strategy).shared_keys(global_state, NAMED_HEAD.keys)
    layout = BlindLayout.of(global_state, averaged, new_sites_key(), CONSORTIUM)
    server = BlindCipher.from_bytes(cipher.public_bytes())
    sent = [
        cipher.encrypt(layout.pack(states[site], classes, blind_weight(SAMPLES[site], weighting)))
        for site, classes in SITES.items()
    ]
    summed = server.add(sent)
    for site, classes in SITES.items():
        sent_back = {part: summed[part] for part in layout.parts_for(classes)}
        received = layout.unpack(cipher.decrypt(sent_back), classes, states[site])
        encrypted = [name for name, _ in layout.backbone]
        assert encrypted == [key for key in averaged if not key.endswith("num_batches_tracked")]  # floats only
        for key in encrypted:
            assert torch.allclose(received[key].double(), expected.state[key].double(), atol=1e-6), key
            assert received[key].dtype == states[site][key].dtype
        rows = [expected.class_names.index(name) for name in classes]
        for key in NAMED_HEAD.keys:
            assert torch.allclose(received[key], expected.state[key][rows], atol=1e-6), (site, key)
        for key in set(states[site]) - set(encrypted) - set(NAMED_HEAD.keys):  # not averaged: the site's own
            assert torch.equal(received[key], states[site][key])


def test_the_server_context_holds_no_secret_key_and_cannot_decrypt(cipher):
    server = BlindCipher.from_bytes(cipher.public_bytes())
    assert cipher.holds_secret_key and not server.holds_secret_key
    encrypted = cipher.encrypt(np.arange(10.0))
    with pytest.raises(BlindAggregationError, match="only the sites decrypt"):
        server.decrypt(encrypted)
    summed = cipher.decrypt(dict(enumerate(server.add([encrypted, encrypted]))))
    assert np.allclose(summed[0][:10], 2 * np.arange(10.0), atol=1e-6)


def test_cks_error_on_a_sum_of_the_most_sites_stays_well_inside_the_bound_the_flooding_is_set_for(cipher):
    """E of the flooding bound: the Euclidean norm of CKKS's error on a sum of MOST_SITES encryptions of zero (the
    error alone, over one ciphertext's values, in the encoding's integer units) is below an eighth of NOISE_UNITS
    (measured: 2^19.8 of 2^24)."""
    server = BlindCipher.from_bytes(cipher.public_bytes())
    summed = server.add([cipher.encrypt(np.zeros(4096)) for _ in range(MOST_SITES)])
    (error,) = cipher._exact(dict(enumerate(summed))).values()
    assert 0 < np.linalg.norm(error) * 2.0**SCALE_BITS < NOISE_UNITS / 8


def test_every_decryption_is_flooded_at_the_bounds_scale_and_the_flooding_is_what_a_published_model_carries(cipher):
    """Each decrypted value carries a Gaussian of FLOODING_SD (measured over 8,192 values: its standard deviation
    within 5 %), hiding CKKS's error, which is far smaller. The same ciphertext decrypted again gets the same noise
    (nothing to average), another site (another cipher of the same key) independent noise. A model unpacked from a
    sum differs from the one the exact decryption gives by the flooding over the summed weight. Without the flooding
    each of these differences is CKKS's error alone and the test fails."""
    vector = np.linspace(-3.0, 3.0, 8192)
    encrypted = dict(enumerate(cipher.encrypt(vector)))
    exact = np.concatenate(list(cipher._exact(encrypted).values()))
    assert np.abs(exact - vector).max() < FLOODING_SD / 1e3  # double rounding of values up to 3: about 1e-15
    first, again = (np.concatenate(list(cipher.decrypt(encrypted).values())) for _ in range(2))
    assert np.std(first - exact) == pytest.approx(FLOODING_SD, rel=0.05)
    assert abs(np.mean(first - exact)) < 4 * FLOODING_SD / np.sqrt(vector.size)
    np.testing.assert_array_equal(again, first)
    other_site = np.concatenate(list(BlindCipher.from_bytes(cipher.to_bytes()).decrypt(encrypted).values()))
    assert np.std(other_site - first) == pytest.approx(FLOODING_SD * np.sqrt(2), rel=0.05)

    state = {key: value.double() for key, value in _state(["Mass"], 0).items()}
    layout = BlindLayout.of(state, ["features.conv0.weight"], new_sites_key(), CONSORTIUM)
    weight = 1e-3
    sums = dict(enumerate(cipher.encrypt(layout.pack(state, ["Mass"], weight))))
    parts = {part: sums[part] for part in layout.parts_for(["Mass"])}
    published = layout.unpack(cipher.decrypt(parts), ["Mass"], state)
    exactly = layout.unpack(cipher._exact(parts), ["Mass"], state)
    keys = ("features.conv0.weight", NAMED_HEAD.weight_key)
    differences = np.concatenate([(published[key] - exactly[key]).numpy().ravel() for key in keys])
    means = np.concatenate([exactly[key].numpy().ravel() for key in keys])
    # a mean is a flooded sum over a flooded weight: to first order x + (n_sum - x n_weight) / weight, each value's
    # difference of standard deviation FLOODING_SD / weight * sqrt(1 + x^2) (correlated through the weight's noise)
    standardised = np.abs(differences) / (FLOODING_SD / weight * np.sqrt(1 + means**2))
    assert standardised.max() > 0.05 and standardised.max() < 7


def test_the_flooding_noise_is_standard_normal_keyed_and_a_function_of_the_ciphertext():
    key, other = b"k" * 32, b"o" * 32
    draws = keyed_gaussian(key, b"ciphertext", 200_001)
    assert draws.shape == (200_001,)
    assert abs(draws.mean()) < 0.01 and draws.std() == pytest.approx(1.0, abs=0.01)
    assert np.mean(np.abs(draws) > 1.959964) == pytest.approx(0.05, abs=0.003)  # a normal's two-sided 5 % tail
    np.testing.assert_array_equal(keyed_gaussian(key, b"ciphertext", 7), draws[:7])  # a prefix of the same stream
    assert abs(np.corrcoef(draws[:10_000], keyed_gaussian(key, b"ciphertexu", 10_000))[0, 1]) < 0.05
    assert abs(np.corrcoef(draws[:10_000], keyed_gaussian(other, b"ciphertext", 10_000))[0, 1]) < 0.05


def test_what_the_server_receives_names_no_class_and_has_one_size_for_every_site(cipher):
    global_state = _state(["Mass"], 0)
    layout = BlindLayout.of(global_state, ["features.conv0.weight"], new_sites_key(), CONSORTIUM)
    sizes = set()
    for seed, classes in enumerate(SITES.values()):
        sent = cipher.encrypt(layout.pack(_state(classes, seed), classes, 1.0))
        sizes.add((len(sent), tuple(len(part) for part in sent)))
        payload = b"".join(sent) + cipher.public_bytes()
        for name in [name for names in SITES.values() for name in names]:
            assert name.encode() not in payload
    assert len({count for count, _ in sizes}) == 1  # as many ciphertexts from a site of 2 classes as of 4


def test_a_site_is_sent_the_backbone_and_its_own_slots_only(cipher):
    """What the server sends a site back: the backbone's ciphertexts and those of its own classes' slots, so it learns
    no row, and not even the summed weight, of a class it does not label; a slot nobody filled keeps its row."""
    global_state = _state(["Mass"], 0)
    layout = BlindLayout.of(global_state, ["features.conv0.weight"], new_sites_key(), CONSORTIUM)
    assert layout.parts_per_slot == 1 and layout.parts == layout.backbone_parts + len(CONSORTIUM)
    own = layout.parts_for(["Mass", "Edema"])
    assert own == [0, *sorted(layout.backbone_parts + layout.slot(name) for name in ["Mass", "Edema"])]
    others = set(range(layout.parts)) - set(own)
    assert len(others) == len(CONSORTIUM) - 2
    # one site sends Mass only: its Edema row (the template's) stays as it is, Mass's becomes the sent one
    sender = _state(["Mass"], 1)
    summed = dict(enumerate(cipher.encrypt(layout.pack(sender, ["Mass"], 2.0))))
    template = _state(["Mass", "Edema"], 2)
    received = layout.unpack(cipher.decrypt({part: summed[part] for part in own}), ["Mass", "Edema"], template)
    assert torch.allclose(received[NAMED_HEAD.weight_key][0], sender[NAMED_HEAD.weight_key][0], atol=1e-6)
    assert torch.equal(received[NAMED_HEAD.weight_key][1], template[NAMED_HEAD.weight_key][1])
    assert torch.equal(received[NAMED_HEAD.bias_key][1], template[NAMED_HEAD.bias_key][1])
    with pytest.raises(BlindAggregationError, match=r"ciphertexts \[\d+\] of the sum were not received"):
        layout.unpack(cipher.decrypt({0: summed[0]}), ["Mass"], _state(["Mass"], 3))


def test_a_class_outside_the_consortiums_list_is_refused_when_packed():
    layout = BlindLayout.of(_state(["Mass"], 0), [], new_sites_key(), CONSORTIUM)
    with pytest.raises(BlindAggregationError, match="'Fibrosis' is not in the consortium's list of 8 classes"):
        layout.pack(_state(["Mass", "Fibrosis"], 0), ["Mass", "Fibrosis"], 1.0)
    with pytest.raises(BlindAggregationError, match="must name each class once"):
        BlindLayout.of(_state(["Mass"], 0), [], new_sites_key(), ["Mass", "Mass"])


def test_the_slots_depend_on_the_sites_key():
    global_state = _state(["Mass"], 0)
    names = [f"Finding {n}" for n in range(50)]
    first, second = (BlindLayout.of(global_state, [], new_sites_key(), names) for _ in range(2))
    assert sorted(first.slot(name) for name in names) == list(range(50))  # one slot per listed class
    assert [first.slot(name) for name in names] != [second.slot(name) for name in names]
    with pytest.raises(BlindAggregationError, match="at least 32 bytes"):
        BlindLayout.of(global_state, [], b"short", names)


def test_a_weight_that_would_overflow_the_sum_is_refused():
    global_state = _state(["Mass"], 0)
    layout = BlindLayout.of(global_state, [], new_sites_key(), CONSORTIUM)
    with pytest.raises(BlindAggregationError, match="scale the aggregation weights down"):
        layout.pack(global_state, ["Mass"], 1e6)


def test_the_sites_secret_survives_its_text():
    secret = BlindSecret.new(CONSORTIUM)
    again = BlindSecret.from_json(secret.to_json(), "blind_secret.json")
    assert (again.key, again.classes, again.wrapping_key) == (secret.key, tuple(CONSORTIUM), secret.wrapping_key)
    assert again.fingerprint == secret.fingerprint != BlindSecret.new(CONSORTIUM).fingerprint
    slots = [secret.layout_for(_state(["Mass"], 0), []).slot(name) for name in CONSORTIUM]
    assert [again.layout_for(_state(["Mass"], 0), []).slot(name) for name in CONSORTIUM] == slots
    job_key = secret.new_job_key("job-1")  # one site's offer; another site opens it with its copy of the secret
    opened = again.open_job_key(split_job_key(job_key.as_params())[0], "job-1", "the server's task")
    assert not BlindCipher.from_bytes(opened.public).holds_secret_key and opened.cipher.holds_secret_key
    decrypted = opened.cipher.decrypt(dict(enumerate(job_key.cipher.encrypt(np.arange(5.0)))))
    assert np.allclose(decrypted[0], np.arange(5.0), atol=1e-6)


def test_every_job_has_its_own_key_and_a_key_is_opened_only_for_its_job_its_context_and_its_consortium():
    """Two jobs (or two sites' offers) never share a CKKS key; a wrapped key replayed into another job, paired with
    another public context, or wrapped under another consortium's secret is refused, naming why."""
    secret = BlindSecret.new(CONSORTIUM)
    first, second = secret.new_job_key("job-1"), secret.new_job_key("job-2")
    assert first.public != second.public and first.fingerprint != second.fingerprint
    assert first.cipher.to_bytes() != second.cipher.to_bytes()
    ciphertext = first.cipher.encrypt(np.arange(5.0))
    other = second.cipher.decrypt(dict(enumerate(ciphertext)))[0][:5]
    assert not np.allclose(other, np.arange(5.0), atol=1.0)  # the second job's key reads nothing of the first's
    entries = split_job_key(first.as_params())[0]
    context = entries["job_key/context"]
    changed = context[:-1] + bytes([context[-1] ^ 1])  # a fixed last byte left it unchanged once in 256 runs
    refusals = [
        (secret, entries, "job-2"),  # replayed into another job
        (secret, {**entries, "job_key/public": second.public}, "job-1"),  # another public context
        (BlindSecret.new(CONSORTIUM), entries, "job-1"),  # another consortium
        (secret, {**entries, "job_key/context": changed}, "job-1"),
    ]
    for holder, given, job in refusals:
        with pytest.raises(BlindAggregationError, match="the job's key was not made by a site of this consortium"):
            holder.open_job_key(given, job, "the server's task")


def test_text_that_is_not_the_sites_secret_is_refused_naming_its_file():
    good = json.loads(BlindSecret.new(CONSORTIUM).to_json())
    cases = [
        ("not json", "not JSON"),
        ([], "format None"),
        ({**good, "format": 2}, "format 2; this bundle reads blind secrets of format 3"),
        ({**good, "key": "zz"}, "not a blind secret"),
        ({**good, "key": "00" * 8}, "at least 32 bytes"),
        ({**good, "classes": ["Mass", "Mass"]}, "each class once"),
        ({**good, "wrapping_key": "00" * 8}, "its wrapping key has 8 bytes, not 32"),
        ({key: value for key, value in good.items() if key != "wrapping_key"}, "not a blind secret"),
    ]
    for content, message in cases:
        text = content if isinstance(content, str) else json.dumps(content)
        with pytest.raises(BlindAggregationError, match=f"^local/blind_secret.json: .*{message}"):
            BlindSecret.from_json(text, "local/blind_secret.json")


def test_no_code_but_the_flooded_decryption_reads_a_decryption_exactly():
    """``BlindCipher._exact`` (CKKS's decryption with its error, which tells the key) is called by ``decrypt`` alone:
    every site path (``flare.blind_site``: the model it trains from, validates and publishes) goes through the
    flooding."""
    package = Path(__file__).resolve().parents[1] / "custom" / "surgical_aggregation"
    callers = {
        path.relative_to(package).as_posix(): path.read_text().count("._exact(")
        for path in package.rglob("*.py")
        if "._exact(" in path.read_text()
    }
    assert callers == {"core/blind.py": 1}
    assert "self._exact(encrypted)" in inspect.getsource(BlindCipher.decrypt)
