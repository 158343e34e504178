"""What blind surgical aggregation costs a round (core.blind): bytes a site sends and seconds to pack and encrypt, to
add at the server, and to decrypt and unpack, against plain surgical aggregation of the same updates.

    python benchmarks/blind_cost.py --sites 2 7 --classes 20 199 --out blind_cost.json

Not a test. DenseNet121 as the bundle builds it (1 input channel), every backbone entry averaged (``fedavg``); each
site labels a random half of the consortium's classes (at least one), its entries the initial model's moved by
noise. Plain: each site sends its float32 state (backbone and its rows) and the server runs ``SurgicalAggregator``.
Blind: each
site packs and encrypts its vector (the CKKS parameters of ``core.blind``), the server adds the ciphertexts with
the public context, and each site is sent the summed backbone and its own classes' slots, which it decrypts and
unpacks. Seconds are for one site (the mean over sites) or for the server; bytes are one site's upload and download.
The largest difference between a site's blind and plain result is printed too.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from surgical_aggregation.core.aggregation import Contribution, SurgicalAggregator
from surgical_aggregation.core.blind import BlindCipher, BlindLayout, new_sites_key
from surgical_aggregation.core.head import NAMED_HEAD, extend_head
from surgical_aggregation.core.strategies import strategy
from surgical_aggregation.experiments.summary import rewrite_marked_block
from surgical_aggregation.training.checkpoint import initial_global_state


def site_state(template: dict, classes: list[str], generator: torch.Generator) -> dict[str, torch.Tensor]:
    state = {}
    for key, value in template.items():
        if key in NAMED_HEAD.keys:
            continue
        if not value.is_floating_point():
            state[key] = value.clone()
        elif key.endswith("running_var"):  # a variance stays positive
            state[key] = value * (1 + 0.1 * torch.rand(value.shape, generator=generator))
        else:  # a trained site's entries: near the global model's
            state[key] = value + 0.01 * torch.randn(value.shape, generator=generator)
    features = template[NAMED_HEAD.weight_key].shape[1]
    state[NAMED_HEAD.weight_key] = torch.randn(len(classes), features, generator=generator)
    state[NAMED_HEAD.bias_key] = torch.randn(len(classes), generator=generator)
    return state


def measure(sites: int, classes: int, cipher: BlindCipher, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    consortium = [f"Finding {index:03d}" for index in range(classes)]
    base = initial_global_state("densenet121", {"image_size": 64, "in_channels": 1, "imagenet_normalize": True}, 0)
    global_state, _ = extend_head(base, [], consortium)
    site_classes = {
        f"site-{index}": sorted(rng.choice(consortium, size=max(1, classes // 2), replace=False).tolist())
        for index in range(sites)
    }
    states = {site: site_state(global_state, names, generator) for site, names in site_classes.items()}
    averaged = strategy("fedavg").shared_keys(global_state, NAMED_HEAD.keys)

    started = time.perf_counter()
    plain = SurgicalAggregator(global_state, consortium, "fedavg", "uniform")
    for site, names in site_classes.items():
        plain.add(Contribution(site, states[site], names, 100))
    expected = plain.finalize()
    plain_seconds = time.perf_counter() - started
    plain_bytes = float(np.mean([sum(value.numel() * 4 for value in states[site].values()) for site in states]))

    layout = BlindLayout.of(global_state, averaged, new_sites_key(), consortium)
    server = BlindCipher.from_bytes(cipher.public_bytes())
    encrypt_seconds, sent = [], []
    for site, names in site_classes.items():
        started = time.perf_counter()
        sent.append(cipher.encrypt(layout.pack(states[site], names, 1.0)))
        encrypt_seconds.append(time.perf_counter() - started)
    started = time.perf_counter()
    summed = server.add(sent)
    add_seconds = time.perf_counter() - started
    decrypt_seconds, received_bytes, error = [], [], 0.0
    for site, names in site_classes.items():
        sent_back = {part: summed[part] for part in layout.parts_for(names)}
        received_bytes.append(sum(len(data) for data in sent_back.values()))
        started = time.perf_counter()
        received = layout.unpack(cipher.decrypt(sent_back), names, states[site])
        decrypt_seconds.append(time.perf_counter() - started)
        rows = [expected.class_names.index(name) for name in names]
        for key, _ in layout.backbone:  # the encrypted entries (integer counters stay at each site)
            error = max(error, float((received[key].double() - expected.state[key].double()).abs().max()))
        for key in NAMED_HEAD.keys:
            error = max(error, float((received[key].double() - expected.state[key][rows].double()).abs().max()))
    return {
        "sites": sites,
        "classes": classes,
        "values_per_site": layout.size,
        "plain_bytes_per_site": plain_bytes,
        "blind_bytes_per_site": float(np.mean([sum(len(part) for part in parts) for parts in sent])),
        "plain_server_seconds": plain_seconds,
        "blind_bytes_received_per_site": float(np.mean(received_bytes)),
        "blind_site_encrypt_seconds": float(np.mean(encrypt_seconds)),
        "blind_server_add_seconds": add_seconds,
        "blind_site_decrypt_seconds": float(np.mean(decrypt_seconds)),
        "largest_difference": error,
    }


MARKER = "blind-cost"


def table(rows: list[dict]) -> list[str]:
    """The cost table of docs/blind.md."""
    lines = [
        "| sites | classes | a site sends: blind | plain | a site receives: blind | a site encrypts | the server adds "
        "| a site decrypts | plain aggregation (server) | largest difference |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        lines.append(
            f"| {row['sites']} | {row['classes']} | {row['blind_bytes_per_site'] / 1e6:.0f} MB "
            f"| {row['plain_bytes_per_site'] / 1e6:.0f} MB | {row['blind_bytes_received_per_site'] / 1e6:.0f} MB "
            f"| {row['blind_site_encrypt_seconds']:.1f} s | {row['blind_server_add_seconds']:.1f} s "
            f"| {row['blind_site_decrypt_seconds']:.1f} s | {row['plain_server_seconds']:.2f} s "
            f"| {row['largest_difference']:.1e} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, nargs="+", default=[2, 7])
    parser.add_argument("--classes", type=int, nargs="+", default=[20, 199])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--table-only", action="store_true", help="only redraw the table of --out")
    parser.add_argument("--write-doc", type=Path, help=f"rewrite the table between <!-- {MARKER} --> markers")
    args = parser.parse_args()
    if args.table_only:
        rows = json.loads(args.out.read_text())
        _write(rows, args.write_doc)
        return
    cipher = BlindCipher.for_sites()
    rows = []
    for sites in args.sites:
        for classes in args.classes:
            rows.append(measure(sites, classes, cipher))
            row = rows[-1]
            print(
                f"{sites} sites, {classes} classes: {row['values_per_site']:,} values; a site sends "
                f"{row['blind_bytes_per_site'] / 1e6:.0f} MB blind (and receives "
                f"{row['blind_bytes_received_per_site'] / 1e6:.0f} MB), "
                f"{row['plain_bytes_per_site'] / 1e6:.0f} MB plain; "
                f"a site encrypts in {row['blind_site_encrypt_seconds']:.1f} s and decrypts in "
                f"{row['blind_site_decrypt_seconds']:.1f} s; the server adds in "
                f"{row['blind_server_add_seconds']:.1f} s "
                f"(plain aggregation {row['plain_server_seconds']:.1f} s); largest difference "
                f"{row['largest_difference']:.1e}",
                flush=True,
            )
    args.out.write_text(json.dumps(rows, indent=1))
    _write(rows, args.write_doc)


def _write(rows: list[dict], doc: Path | None) -> None:
    lines = table(rows)
    print("\n".join(lines))
    if doc is not None:
        text = doc.read_text()
        doc.write_text(rewrite_marked_block(text, f"<!-- {MARKER} -->", f"<!-- /{MARKER} -->", "\n".join(lines)))


if __name__ == "__main__":
    main()
