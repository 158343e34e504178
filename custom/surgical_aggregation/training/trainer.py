"""One site's local training (no FLARE): load a global slice by class name, warm up the head, train, validate.

The FLARE client script and the non-federated baselines both drive this class; the model comes from
the site's modality (images: DenseNet121, reports: the MLP), rows are placed by name (``core.head``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..core.devices import autocast_dtype, resolve_device, resolve_workers
from ..core.head import NAMED_HEAD, place_rows
from ..core.methods import SiteMethod, check_batchnorm, prior_vector
from .checkpoint import ARCHITECTURE_KEY, PREPROCESSING_KEY, load_checkpoint, save_checkpoint
from .config import SiteConfig
from .loops import (
    BatchNormReadings,
    Evaluation,
    GraphedStep,
    freeze_batchnorm,
    make_loader,
    place_model,
    predict,
    set_backbone_trainable,
    train_epoch,
    train_mode,
)
from .parallel import FitRequest, RankGroup, check_gpus
from .privacy import (
    refuse_made_up_patients,
    refuse_what_dp_sgd_cannot_bound,
    sampling_groups,
)
from .privacy_accounting import PrivacyLedger
from .privacy_ledger import LedgerFile
from .site_data import SiteData
from .trainer_privacy import PrivateTraining

logger = logging.getLogger(__name__)
Tracker = Callable[[str, float, int], None]  # (tag, value, step), e.g. a TensorBoard writer's add_scalar
TRAIN_EPOCH_LOSS = "train/epoch_loss"  # tracked per local epoch (warm-up included), step = epochs so far


def evaluation_metrics(evaluation: Evaluation, prefix: str = "val") -> dict[str, float]:
    """Flat metric dict: ``<prefix>_loss``, ``<prefix>_mean_auroc``, ``<prefix>_auroc/<class>`` (defined ones)."""
    metrics = {
        f"{prefix}_loss": evaluation.loss,
        f"{prefix}_loss_se": evaluation.loss_se,
        f"{prefix}_mean_auroc": evaluation.mean_auroc,
    }
    metrics.update({f"{prefix}_auroc/{name}": v for name, v in evaluation.per_class_auroc.items() if not math.isnan(v)})
    return {key: float(value) for key, value in metrics.items() if not math.isnan(value)}


def make_optimizer(
    config: SiteConfig, parameters, learning_rate: float, device: torch.device | None = None
) -> torch.optim.Optimizer:
    """The config's optimizer over the trainable parameters; Adam/AdamW fused into one kernel on a GPU."""
    trainable = [p for p in parameters if p.requires_grad]
    if config.optimizer == "sgd":
        return torch.optim.SGD(trainable, lr=learning_rate, momentum=0.9, weight_decay=config.weight_decay)
    optimizer = torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam
    fused = device is not None and device.type == "cuda"
    return optimizer(trainable, lr=learning_rate, weight_decay=config.weight_decay, fused=fused or None)


@dataclass
class FitReport:
    warmup_losses: list[float] = field(default_factory=list)
    train_losses: list[float] = field(default_factory=list)
    samples: int = 0
    seconds: float = 0.0
    # DP-SGD: epsilon spent so far (at delta), the budget, noise, steps, and whether the site stopped training
    privacy: dict[str, Any] | None = None


EVALUATION_BATCHES_ON_GPU = 4
PRIVACY_LEDGER_KEY = "privacy_ledger"  # without a ledger file, the local model file's meta: the DP-SGD steps so far


class SiteTrainer(PrivateTraining):
    """Local model, loaders and loops of one site.

    ``class_names`` are the site's own classes (its labels, in its order). The model's head rows,
    ``head_classes``, are the same except under methods that train the whole union head
    (vanilla FL, partial loss), where they follow the server's union; the site's labels are then
    widened to the union by the method's policy for the classes it does not label.
    """

    def __init__(
        self,
        config: SiteConfig,
        data: SiteData,
        site_name: str = "site",
        log: logging.Logger = logger,
        tracker: Tracker | None = None,
        group: RankGroup | None = None,
    ) -> None:
        """``group``: a helper's place in the site's training group (``gpus`` > 1); rank 0 starts its group
        at its first fit."""
        self.config = config
        self.vocabulary = config.vocabulary  # how this site reads the class names of the models it receives
        self.data = data
        self.site_name = site_name
        self.log = log
        self.tracker = tracker
        self.group = group
        if config.cpu_threads:
            torch.set_num_threads(config.cpu_threads)
        torch.manual_seed(config.seed)
        self.device = group.device if group is not None else resolve_device(config.device)
        if group is None:
            check_gpus(config.gpus, self.device, config.device, f"site {site_name}")
        self.autocast = autocast_dtype(self.device, config.amp)
        self.scaler = torch.amp.GradScaler("cuda") if self.autocast == torch.float16 else None
        self.workers = resolve_workers(config.workers, self.device)
        self.modality = config.modality
        self.preprocessing = self.modality.preprocessing(config)
        self.site_method = SiteMethod()
        self._prior: torch.Tensor | None = None
        self._penalty: Callable[[], torch.Tensor] | None = None
        self._graphs: dict[tuple[str, bool], GraphedStep] = {}  # a phase's captured step, kept across rounds
        self._graphed: GraphedStep | None = None  # the phase's now
        self._graph_failed = False
        self.head_classes: list[str] = []
        self._set_head(data.class_names)
        self.val_loader = make_loader(data.val, self.evaluation_batch_size, False, self.workers)
        self.epochs_done = 0  # step counter for training curves
        self.ledger = PrivacyLedger(config.differential_privacy.accountant)
        self.ledger_file: LedgerFile | None = None  # None: the ledger lives in this process (and the local model file)
        privacy = config.differential_privacy
        if privacy.enabled:
            refuse_made_up_patients(getattr(data.train, "table", None), privacy, f"site {site_name}")
            self._sampling_groups = sampling_groups(
                self._training_patients(), len(data.train), privacy.unit, f"site {site_name}"
            )
        # the delta of this site's budget: the config's, or 1 / (10 x the units it protects)
        self.delta = privacy.resolved_delta(self._privacy_units(), f"site {site_name}") if privacy.enabled else None

    @property
    def class_names(self) -> list[str]:
        return list(self.data.class_names)

    @property
    def evaluation_batch_size(self) -> int:
        """Validation's batch: on a GPU four training batches (no gradients to keep: fewer, fuller launches), on a
        CPU the training batch."""
        return self.config.batch_size * (EVALUATION_BATCHES_ON_GPU if self.device.type == "cuda" else 1)

    def _new_model(self, classes: Sequence[str]) -> torch.nn.Module:
        return self.modality.build_model(classes, self.preprocessing)

    def _set_head(self, classes: Sequence[str]) -> None:
        """(Re)build the model and training loader when the head's classes change."""
        classes = list(classes)
        if classes == self.head_classes:
            return
        self.head_classes = classes
        self._graphs.clear()  # they replay the old model's tensors
        self.model = place_model(self._new_model(classes), self.device)
        # the compiled step shares the model's parameters; state is always read from the model itself
        self.training_model = torch.compile(self.model) if self.config.compile == "on" else self.model
        self._rebuild_train_loader()

    def _rebuild_train_loader(self) -> None:
        train = self.data.train
        if self.head_classes != self.class_names:
            train = train.relabelled(self.head_classes, self.site_method.missing_labels)
        self.train_loader = make_loader(train, self.config.batch_size, True, self.workers, self.config.seed)

    def set_method(self, site_method: SiteMethod) -> None:
        """The method's site-side settings (sent by the server with every training task)."""
        relabel = site_method.missing_labels != self.site_method.missing_labels
        self.site_method = site_method
        if relabel:
            self._rebuild_train_loader()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {key: value.detach().cpu() for key, value in self.model.state_dict().items()}

    def save(self, path: str | Path) -> None:
        """Keep the local model on disk: FLARE may restart the site's process between tasks."""
        meta = {ARCHITECTURE_KEY: self.modality.architecture, PREPROCESSING_KEY: self.preprocessing}
        if self.config.differential_privacy.enabled and self.ledger_file is None:
            meta[PRIVACY_LEDGER_KEY] = self.ledger.to_dict()
        save_checkpoint(path, self.state_dict(), self.head_classes, **meta, epochs_done=self.epochs_done)

    def restore(self, path: str | Path) -> bool:
        """Reload a model saved by :meth:`save` whose head covers this site's classes; False when there is none."""
        path = Path(path)
        if not path.is_file():
            return False
        checkpoint = load_checkpoint(path)
        if not set(self.class_names) <= set(checkpoint.class_names):
            self.log.warning(
                "%s: ignoring %s, saved for other classes %s", self.site_name, path, checkpoint.class_names
            )
            return False
        self._set_head(checkpoint.class_names)
        self.model.load_state_dict(checkpoint.state)
        self.epochs_done = int(checkpoint.meta.get("epochs_done", 0))
        if self.ledger_file is None:
            accountant = self.config.differential_privacy.accountant
            self.ledger = PrivacyLedger.from_dict(checkpoint.meta.get(PRIVACY_LEDGER_KEY), accountant)
        return True

    def _kept_locally(self) -> frozenset[str]:
        """Entries the site_method keeps at the site once it has trained: personal heads, FedBN's BatchNorm."""
        if not self.epochs_done:
            return frozenset()
        keep: set[str] = set()
        if self.site_method.keeps_head:
            keep.update(NAMED_HEAD.keys)
        keep.update(self.site_method.strategy.kept_at_site(self.model.state_dict()))
        return frozenset(keep)

    def load_global(self, state: Mapping[str, Any], class_names: Sequence[str]) -> None:
        """Load a global model slice; it must hold rows for every class of this site.

        Under a union-head method the model's head becomes the union ``class_names``: the site's own classes first,
        in its order, then the others in the server's (rows are matched by name either way, and with identical class
        sets the computation is then exactly surgical aggregation's); otherwise it stays the site's own classes.
        """
        canonical = [self.vocabulary.canonical(name) for name in class_names]
        if self.site_method.trains_union_head:  # its own classes first, in its order: with every class shared (psi = 0)
            own = [name for name in self.class_names if name in canonical]  # the head is surgical aggregation's
            self._set_head([*own, *(name for name in canonical if name not in own)])
        placed, present = place_rows(self.model.state_dict(), self.head_classes, state, canonical, self._kept_locally())
        missing = [name for name in self.head_classes if name not in present]
        if missing:
            raise ValueError(f"the received model has no head rows for this site's classes {missing}")
        self.model.load_state_dict(placed)

    def fit(self, round_number: int, warmup: bool) -> FitReport:
        """Head warm-up (backbone frozen) when asked, then the local epochs.

        Whether to warm up is the caller's decision (the server's, in a federation: it knows which
        sites have). The method decides BatchNorm (frozen for FedBN+), FedSLD's loss weights and
        FedProx's proximal term (towards the model as loaded from the server).
        """
        config = self.config
        check_batchnorm(self.site_method, self.model.state_dict(), f"site {self.site_name}")
        private = config.differential_privacy.enabled
        if private:
            refuse_what_dp_sgd_cannot_bound(
                self.model, self.site_method, config.gpus, config.compile, f"site {self.site_name}"
            )
            plan = self._spend_budget(warmup)
            if plan["stopped"]:
                self.log.warning(
                    "%s round %d: NOT training: this round's %d DP-SGD steps would spend epsilon %.3f per %s, over "
                    "the site's budget of %.3f (delta %g); %.3f spent so far",
                    self.site_name, round_number, plan["round_steps"], plan["would_spend"], plan["unit"],
                    plan["budget"], plan["delta"], plan["epsilon"],
                )  # fmt: skip
                return FitReport(privacy=self._privacy_report(stopped=True))
            if warmup:
                self._start_biases_at_prior()
        group = self._training_group()
        if group is not None:
            if group.rank == 0:
                request = FitRequest(round_number, warmup, self.site_method, self.head_classes, self.epochs_done)
                group.announce(request)
            group.broadcast_state(self.model)  # the helpers start from the model rank 0 loaded
        frozen_bn = self.site_method.freezes_batchnorm
        freeze_batchnorm(self.model, frozen_bn)
        self._prior = prior_vector(self.site_method.label_prior, self.head_classes)
        self._penalty = self._proximal_term() if self.site_method.proximal_mu > 0 else None
        report = FitReport()
        graphs = self._graphs_usable(private, group)
        if warmup and config.warmup_epochs > 0:
            set_backbone_trainable(self.model, False, frozen_bn)
            optimizer = self._optimizer("warm-up", config.warmup_learning_rate, frozen_bn, graphs)
            with self._steps_on(group, frozen_bn), self._private_steps(optimizer, private) as optimizer:
                for epoch in range(config.warmup_epochs):
                    phase = f"round {round_number} head warm-up"
                    result = self._epoch(optimizer, phase, epoch, config.warmup_epochs)
                    report.warmup_losses.append(result.loss)
                    report.seconds += result.seconds
            set_backbone_trainable(self.model, True, frozen_bn)
        optimizer = self._optimizer("training", config.learning_rate, frozen_bn, graphs)
        with self._steps_on(group, frozen_bn), self._private_steps(optimizer, private) as optimizer:
            for epoch in range(config.local_epochs):
                result = self._epoch(optimizer, f"round {round_number} training", epoch, config.local_epochs)
                report.train_losses.append(result.loss)
                report.samples = result.samples
                report.seconds += result.seconds
        if private:  # Poisson batches vary in size: count the items an epoch is expected to see (at most the units)
            rate, steps = self._epoch_plan()
            report.samples = min(self._privacy_units(), round(rate * self._privacy_units() * steps))
            report.privacy = self._privacy_report(stopped=False)
            self.log.info(
                "%s round %d: DP-SGD epsilon spent so far %.4f per %s of %.4f (delta %g, noise multiplier %.4f, "
                "%d steps)",
                self.site_name, round_number, report.privacy["epsilon"], report.privacy["unit"],
                report.privacy["budget"], report.privacy["delta"], report.privacy["noise_multiplier"],
                report.privacy["steps"],
            )  # fmt: skip
        return report

    # --- the training step as a CUDA graph (training.loops.GraphedStep) ------------------------------------------

    def _graphs_usable(self, private: bool, group: RankGroup | None) -> bool:
        """A GPU step is captured where the replay is exactly the eager step: plain BCE (no FedSLD weights, no
        FedProx term), bf16 without a loss scaler, one process, no DP-SGD, no torch.compile, Adam or AdamW."""
        method = self.site_method
        return (
            self.config.cuda_graphs == "auto"
            and self.device.type == "cuda"
            and self.scaler is None
            and not private
            and group is None
            and self.config.compile == "off"
            and method.label_prior is None
            and method.proximal_mu == 0
            and self.config.optimizer in ("adam", "adamw")
        )

    def _optimizer(self, phase: str, learning_rate: float, frozen_bn: bool, graphs: bool) -> torch.optim.Optimizer:
        """The phase's optimizer: a new one, or the phase's captured step's (captured at its first use, with the
        trainable parameters and BatchNorm mode set as the phase trains), started afresh."""
        self._graphed = None
        if not graphs:
            return make_optimizer(self.config, self.model.parameters(), learning_rate, self.device)
        key = (phase, frozen_bn)
        if key not in self._graphs and not self._graph_failed:
            train_mode(self.model, frozen_bn)
            probe = self.modality.probe_input(self.preprocessing).to(self.device)
            inputs = probe[:1].expand(self.config.batch_size, *probe.shape[1:]).contiguous()
            if inputs.dim() == 4:
                inputs = inputs.contiguous(memory_format=torch.channels_last)
            target = torch.zeros(self.config.batch_size, len(self.head_classes), device=self.device)
            optimizer_type = torch.optim.AdamW if self.config.optimizer == "adamw" else torch.optim.Adam
            try:
                self._graphs[key] = GraphedStep(
                    self.model, optimizer_type, learning_rate, self.config.weight_decay, inputs, target, self.autocast
                )
            except RuntimeError as error:  # a GPU or build that cannot capture: train as before, and say so once
                self._graph_failed = True
                self.log.warning(
                    "%s: CUDA graph capture failed (%s); every step launches its kernels", self.site_name, error
                )
        if key not in self._graphs:
            return make_optimizer(self.config, self.model.parameters(), learning_rate, self.device)
        self._graphed = self._graphs[key]
        self._graphed.reset()
        return self._graphed.optimizer

    def _training_group(self) -> RankGroup | None:
        """The site's training group (``gpus`` > 1), started at the first fit; None for one process."""
        if self.group is None and self.config.gpus > 1:
            spec = {
                "site": self.site_name,
                "config": self.config.to_dict(),
                "job_aliases": self.config.job_aliases,  # the helpers read the site's labels as rank 0 does
            }
            self.group = RankGroup.start(self.config.gpus, self.device, spec, self.log)
        return self.group

    @contextmanager
    def _steps_on(self, group: RankGroup | None, frozen_batchnorm: bool) -> Iterator[None]:
        """A phase's training steps: through DDP over the group (its trainable parameters as now), or as usual."""
        if group is None:
            yield
            return
        single = self.training_model
        self.training_model = group.parallel(self.model, batchnorm_trained=not frozen_batchnorm)
        try:
            yield
        finally:
            self.training_model = single

    def close(self) -> None:
        """Rank 0: end the training group's helpers (they also leave by themselves when this process ends)."""
        if self.group is not None and self.group.rank == 0:
            self.group.close()
            self.group = None

    def apply(self, request: FitRequest) -> None:
        """A helper: take the state of the fit rank 0 announced (the weights follow by broadcast)."""
        self.set_method(request.site_method)
        self._set_head(request.head_classes)
        self.epochs_done = request.epochs_done

    def _proximal_term(self) -> Callable[[], torch.Tensor]:
        """FedProx: mu/2 * ||w - w_global||^2 over the trainable parameters."""
        mu = self.site_method.proximal_mu
        anchors = [(p, p.detach().clone()) for p in self.model.parameters()]

        def penalty() -> torch.Tensor:
            terms = [((p - anchor) ** 2).sum() for p, anchor in anchors if p.requires_grad]
            return 0.5 * mu * torch.stack(terms).sum()

        return penalty

    def _reseed(self) -> None:
        """Shuffling and augmentation seeded by (seed, epochs so far): reproducible, different every
        epoch, and unaffected by FLARE restarting the site's process between rounds."""
        seed = self.config.seed * 1_000_003 + self.epochs_done
        self.train_loader.generator.manual_seed(seed)
        self.train_loader.dataset.reseed(seed)

    def _epoch(self, optimizer: torch.optim.Optimizer, phase: str, epoch: int, epochs: int):
        self._reseed()
        result = train_epoch(
            self.training_model,
            self.train_loader,
            optimizer,
            self.device,
            autocast=self.autocast,
            scaler=self.scaler,
            max_steps=self.config.max_batches_per_epoch,
            description=f"{self.site_name} {phase}",
            class_prior=self._prior,
            penalty=self._penalty,
            frozen_batchnorm=self.site_method.freezes_batchnorm,
            log=self.log,
            shard=None if self.group is None else self.group.shard,
            graphed=self._graphed,
            per_item_loss=self.config.differential_privacy.enabled,
        )
        self.epochs_done += 1
        self.log.info(
            "%s %s epoch %d/%d: loss %.4f on %d %s in %.1f s (%.1f/s)",
            self.site_name,
            phase,
            epoch + 1,
            epochs,
            result.loss,
            result.samples,
            self.modality.sample_noun,
            result.seconds,
            result.samples / max(result.seconds, 1e-9),
        )
        if not self.config.differential_privacy.enabled:  # the training split's un-noised loss stays in the site's log
            self._track(TRAIN_EPOCH_LOSS, result.loss)
        return result

    def _track(self, tag: str, value: float) -> None:
        if self.tracker is not None and not math.isnan(value):
            self.tracker(tag, value, self.epochs_done)

    def validate(self) -> Evaluation:
        """The local model on this site's validation split, over the site's own classes."""
        return self._evaluate(self.model, self.head_classes, self.class_names)

    def evaluate_state(self, state: Mapping[str, Any], class_names: Sequence[str]) -> Evaluation:
        """Any model (the union global model, another site's model) on this site's validation split,
        over the classes both have, picked by name. The local model is left untouched."""
        model = place_model(self._new_model(self.class_names), self.device)
        placed, present = place_rows(
            model.state_dict(), self.class_names, state, class_names, normalize_name=self.vocabulary.canonical
        )
        if not present:
            raise ValueError(f"the model's classes {list(class_names)} share none with this site's {self.class_names}")
        model.load_state_dict(placed)
        return self._evaluate(model, self.class_names, present)

    def _evaluate(self, model: torch.nn.Module, model_classes: Sequence[str], classes: Sequence[str]) -> Evaluation:
        """``model`` (head rows ``model_classes``) on the validation split, over ``classes`` (own ones)."""
        with BatchNormReadings(model) as readings:
            probabilities, labels, mask = predict(
                model,
                self.val_loader,
                self.device,
                self.autocast,
                description=f"{self.site_name} validation",
                log=self.log,
            )
        own = self.class_names
        probabilities = probabilities[:, [list(model_classes).index(name) for name in classes]]
        columns = [own.index(name) for name in classes]
        labels, mask = labels[:, columns], mask[:, columns]
        evaluation = Evaluation.of(labels, probabilities, classes, mask)
        evaluation.batchnorm_divergences = readings.divergences()
        return evaluation
