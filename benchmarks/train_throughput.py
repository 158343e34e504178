"""Training and validation images/s of the site trainer, against the ceiling of the same model on this device.

Not a test: in one process and one run it measures
  (a) the ceiling: DenseNet121 training steps on synthetic tensors already on the device (the site trainer's
      precision and memory format; on a GPU the whole step captured as one CUDA graph, on a CPU plain eager);
  (b) the site trainer's training epoch on cached images (the embedded NIH-style data, generated at the size
      asked), loader, batched augmentation and all: as configured (on a GPU its step replayed as a CUDA graph,
      ``cuda_graphs: auto``), and (b') with every step launched kernel by kernel (``cuda_graphs: off``);
  (c) its validation (the same images, no augmentation).
Each is repeated; the table gives the median and best images/s, and (b)/(a) from the medians. The JSON
has the same numbers.

    python benchmarks/train_throughput.py --size 64 --batch 32 --batches 10            # CPU, under a minute
    python benchmarks/train_throughput.py --size 224 --batch 64 --batches 50 --out gpu.json   # a GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from surgical_aggregation.core.devices import autocast_dtype, resolve_device
from surgical_aggregation.core.labels import NIH_LABELS
from surgical_aggregation.experiments.grid_run import machine
from surgical_aggregation.images.model import NamedDenseNet
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.loops import masked_bce_with_logits, place_model
from surgical_aggregation.training.profiles import DEMO
from surgical_aggregation.training.site_data import prepare_site_data
from surgical_aggregation.training.trainer import SiteTrainer, make_optimizer


def _repeat(measure: Callable[[], tuple[int, float]], repeats: int) -> dict[str, float]:
    """images/s of ``measure()`` (images, seconds), median and best over ``repeats`` runs."""
    rates = [images / seconds for images, seconds in (measure() for _ in range(repeats))]
    return {"median": statistics.median(rates), "best": max(rates)}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ceiling(config, device: torch.device, steps: int, repeats: int) -> dict[str, float]:
    """(a): the training step alone, on tensors that are already on the device."""
    classes = list(NIH_LABELS)
    model = place_model(NamedDenseNet(classes), device)
    if device.type == "cuda":  # graph capture needs the optimizer's step count on the device
        optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate, fused=True, capturable=True)
    else:
        optimizer = make_optimizer(config, model.parameters(), config.learning_rate, device)
    dtype = autocast_dtype(device, config.amp)
    images = config.settings
    shape = (config.batch_size, images.in_channels, images.image_size, images.image_size)
    memory = torch.channels_last if device.type == "cuda" else torch.contiguous_format
    inputs = torch.randn(shape, device=device).contiguous(memory_format=memory)
    target = (torch.rand(config.batch_size, len(classes), device=device) > 0.9).float()
    mask = torch.ones_like(target)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=device.type != "cuda")  # a CUDA graph needs the same gradient tensors
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None, cache_enabled=False):
            loss = masked_bce_with_logits(model(inputs), target, mask)
        loss.backward()
        optimizer.step()
        return loss

    run = step
    if device.type == "cuda":  # the whole step as one CUDA graph (after warm-up on a side stream)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        run = graph.replay
    else:
        step()

    def measure() -> tuple[int, float]:
        _synchronize(device)
        started = time.perf_counter()
        for _ in range(steps):
            run()
        _synchronize(device)
        return steps * config.batch_size, time.perf_counter() - started

    return _repeat(measure, repeats)


def site_trainer(config, steps: int, repeats: int) -> tuple[dict[str, float], dict[str, float], int]:
    """(b) and (c): the site trainer's epoch (capped at ``steps`` batches) and its validation."""
    trainer = SiteTrainer(config, prepare_site_data(config), f"benchmark (cuda_graphs {config.cuda_graphs})")
    trainer.fit(0, warmup=False)  # first epoch: loader workers, cuDNN autotuning, allocator

    def train() -> tuple[int, float]:
        report = trainer.fit(0, warmup=False)
        _synchronize(trainer.device)
        return report.samples, report.seconds

    def validate() -> tuple[int, float]:
        started = time.perf_counter()
        evaluation = trainer.validate()
        return evaluation.samples, time.perf_counter() - started

    return _repeat(train, repeats), _repeat(validate, repeats), trainer.workers


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64, help="image side (the papers: 224)")
    parser.add_argument("--batch", type=int, default=32, help="batch size (the papers: 64)")
    parser.add_argument("--batches", type=int, default=10, help="batches per measured epoch")
    parser.add_argument("--patients", type=int, default=None, help="embedded patients (default: enough images)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", default="auto", help="the site config's workers (default auto)")
    parser.add_argument("--compile", choices=("off", "on"), default="off")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=None, help="JSON file for the results")
    args = parser.parse_args(argv)

    device = resolve_device(args.device)
    patients = args.patients or max(60, (args.batch * args.batches * 10) // 14)  # ~2.3 images per patient
    workers = args.workers if args.workers == "auto" else int(args.workers)
    with tempfile.TemporaryDirectory(prefix="throughput-") as cache:
        values = DEMO.site_config(
            {"kind": "nih", "split_fractions": [0.7, 0.3, 0.0]},
            embedded={"patients": patients, "image_size": args.size},
            image_size=args.size,
            batch_size=args.batch,
            max_batches_per_epoch=args.batches,
            workers=workers,
            compile=args.compile,
            device=args.device,
            cache_dir=cache,
        )
        values["data"]["split_fractions"] = [0.7, 0.3, 0.0]
        config = site_config_from_dict(values, where="benchmark")
        started = time.perf_counter()
        ceiling_rates = ceiling(config, device, args.batches, args.repeats)
        train_rates, validation_rates, loader_workers = site_trainer(config, args.batches, args.repeats)
        eager_config = dataclasses.replace(config, cuda_graphs="off")
        eager_rates = site_trainer(eager_config, args.batches, args.repeats)[0] if device.type == "cuda" else None
        seconds = time.perf_counter() - started

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    results = {
        "device": name,
        "machine": machine(),
        "image_size": args.size,
        "batch_size": args.batch,
        "batches": args.batches,
        "repeats": args.repeats,
        "precision": str(autocast_dtype(device, config.amp) or torch.float32).replace("torch.", ""),
        "loader_workers": loader_workers,
        "compile": args.compile,
        "ceiling_images_per_s": ceiling_rates,
        "train_images_per_s": train_rates,
        "train_eager_images_per_s": eager_rates,
        "validation_images_per_s": validation_rates,
        "train_over_ceiling": train_rates["median"] / ceiling_rates["median"],
        "seconds": round(seconds, 1),
    }
    print(f"{name}, {args.size} px, batch {args.batch}, {results['precision']}, {loader_workers} loader workers")
    print(f"{'':<42}{'median img/s':>14}{'best img/s':>12}")
    rows = [
        ("(a) ceiling: the step on device tensors", ceiling_rates),
        ("(b) site trainer: training epoch", train_rates),
        ("(b') the same, every step launched eagerly", eager_rates),
        ("(c) site trainer: validation", validation_rates),
    ]
    for label, rates in rows:
        if rates is not None:
            print(f"{label:<42}{rates['median']:>14.1f}{rates['best']:>12.1f}")
    print(f"(b)/(a) = {results['train_over_ceiling']:.2f}; {seconds:.0f} s in all")
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
