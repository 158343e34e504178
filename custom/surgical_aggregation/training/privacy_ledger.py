"""A site's privacy ledger on disk (:class:`LedgerFile`), across jobs, resumed runs and continued federations;
:mod:`.privacy` says what the budget covers, :mod:`.privacy_accounting` what each step spends."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import PrivacyLedgerError, SiteConfigError
from .privacy import DifferentialPrivacy
from .privacy_accounting import PrivacyLedger

LEDGER_FILE = "privacy_ledger.json"  # in the site workspace's local/ folder, beside the site's config
SPENT_FILE = "privacy_spent.json"  # in each job's app folder: the steps it recorded, checked against the ledger
LEDGER_FORMAT = "surgical-aggregation privacy ledger 2"
LEDGER_ENTRY_FIELDS = ("site", "fingerprint", "unit", "accountant", "delta", "history", "patients", "images")
# what a job's record holds a digest of: every field that decides the epsilon an entry's steps spend
DIGESTED_FIELDS = ("site", "fingerprint", "unit", "accountant", "delta")


def data_fingerprint(patients: Sequence[str]) -> str:
    """A training split's fingerprint: its set of patient ids, hashed (the ledger's key, with the site)."""
    digest = hashlib.sha256("\n".join(sorted({str(patient) for patient in patients})).encode())
    return digest.hexdigest()[:32]


def _write_atomically(path: Path, values: Mapping[str, Any]) -> None:
    """The whole file or the old one, never half: a temporary file beside it, synced, then renamed over it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "w") as handle:
        json.dump(values, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def entry_digest(entry: Mapping[str, Any] | None, items: int) -> str:
    """SHA-256 of a ledger entry's first ``items`` history items and the fields that decide what they spend
    (:data:`DIGESTED_FIELDS`): a job records it, and a later job refuses a ledger whose entry no longer gives it."""
    if entry is None or items > len(entry.get("history", [])):
        return ""
    canonical = {name: entry[name] for name in DIGESTED_FIELDS}
    canonical["history"] = [[float(noise), float(rate), int(steps)] for noise, rate, steps in entry["history"][:items]]
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()


class LedgerFile:
    """A site's privacy ledger on disk (``<site workspace>/local/privacy_ledger.json``), shared by every job of the
    site: entries keyed by (site, fingerprint of the training patients, unit), each with its steps and the salted
    hashes of its patients, so that training data sharing patients with an earlier entry inherits that entry's steps
    (a re-split does not start a new budget). A job records the steps it reserved in its own app folder
    (``privacy_spent.json``); ``earlier_spent`` are those records of this site's earlier jobs: a ledger missing
    steps one of them recorded is refused.
    """

    def __init__(
        self,
        path: Path,
        site: str,
        patients: Sequence[str],
        settings: DifferentialPrivacy,
        spent_file: Path | None = None,
        earlier_spent: Sequence[Path] = (),
        delta: float | None = None,
        contents: Sequence[str] = (),
    ) -> None:
        """``delta``: the budget's (the trainer's resolved one); ``contents``: a digest of each training item's decoded
        pixels (or embedding), so that the same images exported under new patient ids share the ledger's steps."""
        self.path, self.site, self.settings = Path(path), site, settings
        self.patients = sorted({str(patient) for patient in patients})
        self.contents = sorted(set(contents))
        self.fingerprint = data_fingerprint(self.patients)
        self.spent_file, self.earlier_spent = spent_file, list(earlier_spent)
        self.delta = delta

    def _refuse(self, problem: str) -> PrivacyLedgerError:
        return PrivacyLedgerError(
            f"privacy ledger {self.path}: {problem}; refusing to train rather than reset the site's privacy budget "
            "(restore the ledger from a backup)"
        )

    def _read(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"format": LEDGER_FORMAT, "salt": os.urandom(16).hex(), "entries": []}
        try:
            values = json.loads(self.path.read_text())
            if values.get("format") != LEDGER_FORMAT:
                raise ValueError(f"format is {values.get('format')!r}, not {LEDGER_FORMAT!r}")
            for entry in values["entries"]:
                missing = [name for name in LEDGER_ENTRY_FIELDS if name not in entry]
                if missing:
                    raise KeyError(f"an entry lacks {missing}")
                PrivacyLedger.from_dict(entry, entry["accountant"])
            bytes.fromhex(values["salt"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise self._refuse(f"cannot be read ({type(error).__name__}: {error})") from None
        return values

    def _digests(self, salt: str, values: Sequence[str] | None = None) -> list[str]:
        """This data's patients (or ``values``) as the ledger keeps them: salted hashes, not ids."""
        return [hashlib.sha256(f"{salt}{value}".encode()).hexdigest()[:16] for value in values or self.patients]

    def _key(self, entry: Mapping[str, Any]) -> tuple[str, str, str]:
        return entry["site"], entry["fingerprint"], entry["unit"]

    def _ledger(self, values: Mapping[str, Any]) -> PrivacyLedger:
        """This data's ledger: its own entry's steps, and those of this site's entries sharing a patient (by id or by
        an image's content) with it."""
        mine = set(self._digests(values["salt"]))
        images = set(self._digests(values["salt"], self.contents)) if self.contents else set()
        key = (self.site, self.fingerprint, self.settings.unit)
        ledger = PrivacyLedger(self.settings.accountant)
        for entry in values["entries"]:
            if self._key(entry) == key:
                ledger = PrivacyLedger.from_dict(entry, self.settings.accountant)
                if self.delta is not None and not math.isclose(entry["delta"], self.delta, rel_tol=1e-9):
                    raise SiteConfigError(
                        f"differential_privacy.delta resolves to {self.delta:.3g} for this data, but its budget was "
                        f"set at delta {entry['delta']:.3g} (ledger {self.path}): a budget keeps its delta (a larger "
                        "one would make the same steps look cheaper); set delta to that value"
                    )
        for entry in values["entries"]:  # the file is one site workspace's: any entry, whatever name it was kept under
            shares_patients = not mine.isdisjoint(entry["patients"]) or not images.isdisjoint(entry["images"])
            if self._key(entry) == key or not shares_patients:
                continue
            if entry["unit"] != self.settings.unit:
                raise SiteConfigError(
                    f"differential_privacy.unit is {self.settings.unit!r}, but patients of this training split spent "
                    f"budget per {entry['unit']} (ledger {self.path}): keep unit {entry['unit']!r} for this data"
                )
            if self.delta is not None and self.delta > entry["delta"] * (1 + 1e-9):
                raise SiteConfigError(
                    f"differential_privacy.delta resolves to {self.delta:.3g} for this data, but patients of this "
                    f"training split spent budget set at delta {entry['delta']:.3g} (ledger {self.path}): their steps "
                    "would look cheaper at a larger delta; set delta to at most that value"
                )
            ledger.inherited.extend(PrivacyLedger.from_dict(entry, entry["accountant"]).history)
        self._check_job_records(values)
        return ledger

    def _check_job_records(self, values: Mapping[str, Any]) -> None:
        """Every step a job of this workspace recorded (this job's too) is in the ledger as it recorded it: an entry
        with the record's fingerprint and unit whose history begins with the items the job saw, unchanged (their
        digest: noise multipliers, sample rates, steps, and the entry's delta, unit and accountant). A ledger missing,
        rolled back, with an entry removed, or with any recorded number edited is refused, whatever data this job
        trains on."""
        entries = {(entry["fingerprint"], entry["unit"]): entry for entry in values["entries"]}
        records = [*self.earlier_spent, *([self.spent_file] if self.spent_file else [])]
        for spent in records:
            if not spent.is_file():
                continue
            try:
                record = json.loads(spent.read_text())
                key, steps = (record["fingerprint"], record["unit"]), int(record["steps"])
                items, digest = int(record["items"]), str(record["digest"])
            except (OSError, ValueError, KeyError, TypeError) as error:
                raise self._refuse(f"the job record {spent} cannot be read ({error})") from None
            entry = entries.get(key)
            held = PrivacyLedger.from_dict(entry, entry["accountant"]).steps if entry else 0
            if steps > held:
                state = "is missing" if not self.path.exists() else f"holds {held} DP-SGD steps for that data"
                raise self._refuse(f"{state}, but job record {spent} says {steps} were taken")
            if entry_digest(entry, items) != digest:
                raise self._refuse(
                    f"its entry for that data is not what job record {spent} recorded: a noise multiplier, sample "
                    "rate, step count, delta, unit or accountant of the steps it saw was changed"
                )

    def read(self) -> PrivacyLedger:
        """This data's ledger as the file has it now."""
        return self._ledger(self._read())

    @contextlib.contextmanager
    def transaction(self) -> Iterator[PrivacyLedger]:
        """This data's ledger, read under the file's lock (jobs of one site may run at once); what the caller
        records in it is written atomically (ledger, then this job's record) when the block ends without error."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(f".{self.path.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            values = self._read()
            ledger = self._ledger(values)
            yield ledger
            key = (self.site, self.fingerprint, self.settings.unit)
            earlier = next((old for old in values["entries"] if self._key(old) == key), None)
            entry = {
                "site": self.site,
                "fingerprint": self.fingerprint,
                "unit": self.settings.unit,
                "delta": earlier["delta"] if earlier else self.delta,
                **ledger.to_dict(),
                "patients": sorted(self._digests(values["salt"])),
                "images": sorted(self._digests(values["salt"], self.contents)) if self.contents else [],
            }
            values["entries"] = [old for old in values["entries"] if self._key(old) != key] + [entry]
            _write_atomically(self.path, values)
            if self.spent_file is not None:
                record = {"site": self.site, "fingerprint": self.fingerprint, "unit": self.settings.unit}
                items = len(entry["history"])
                record |= {"steps": ledger.steps, "items": items, "digest": entry_digest(entry, items)}
                _write_atomically(self.spent_file, {**record, "ledger": str(self.path)})
