"""Blind surgical aggregation (no FLARE): the server adds encrypted vectors and learns no class name, no row, no
weight and no single site's backbone; each site decrypts the sums and takes its own classes' means.

The sites share a key and the consortium's class list (canonical names); the server holds neither. A site packs its
update into one vector of whole ciphertexts (:class:`BlindLayout`):

* the backbone part: the entries the strategy averages, in the layout's order, times the site's aggregation weight
  ``w``, then ``w`` itself;
* one slot of ``features + 2`` values per listed class, each starting a ciphertext of its own, the classes in the
  order of an HMAC of their names under the key: the row (weight and bias) times ``w``, then ``w``. The slots of
  classes the site does not label hold zeros, so every site's vector has the same length whatever its classes.

The sites encrypt it under the job's CKKS secret key (:class:`BlindCipher`; a fresh key pair every job, made by one
site and wrapped for the others under the consortium's wrapping key: :class:`JobKey`); the server holds the public
part only and adds ciphertexts. A site is sent the summed backbone part and the summed ciphertexts of the slots it names
by position (its own: the server cannot map a position to a name). An honest site asks for its own slots only, and
learns no more of the others' classes than surgical aggregation tells it; the server cannot tell which slots are a
site's, so a curious site that asks for every position reads every class's sum (docs/blind.md: limits). A site
decrypts what it is sent: the backbone's sum over the summed weight is the weighted mean, and for each of its
classes the slot's row sum over its weight sum is the mean over the sites that label it, which is what
:class:`~surgical_aggregation.core.aggregation.SurgicalAggregator` gives (to CKKS precision). A slot whose summed
weight is zero (no site sent the class this round) leaves the site's row as it was, as the plain aggregation keeps a
row nobody sent.

Why a list and not a hash of each name into a slot space: two names on one slot would mix their rows, and keeping
that improbable for a union of U classes takes a space of about U^2 slots of ``features + 2`` values each (for
U = 199, millions of slots: more than the backbone). With the list, slots are exactly the listed classes; a class
outside it is refused when packed (the consortium extends its list for a new finding).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from .errors import UserError
from .head import NAMED_HEAD, HeadSpec, StateDict, cast_like, to_numpy

# CKKS for sums only (no multiplication, no rotation). N = 8192 gives 4096 values a ciphertext and 128-bit security
# up to log q = 218 bits (the Homomorphic Encryption Standard's table; here 180). Two data primes of 60 bits hold
# values times the scale 2^96 (a constant vector of 2^22 encodes, of 2^23 not), and make CKKS's own error so small
# (``NOISE_UNITS`` over the scale) that flooding it (below) costs no accuracy a model of real sites can show.
POLY_MODULUS_DEGREE = 8192
COEFFICIENT_MODULI = (60, 60, 60)  # the last is SEAL's special prime: the ciphertexts live modulo the first two
SCALE_BITS = 96
# Noise flooding (Li, Micciancio, Schultz, Sorrell, CRYPTO 2022): every decrypted value gets a Gaussian of standard
# deviation E * 2^(s/2) * sqrt(64 t) (their bound for t decryptions at s bits of statistical security; TenSEAL's SEAL
# has no such mode, so it is added here), so that a published decryption no longer tells its error, from which
# Li and Micciancio (EUROCRYPT 2021) recover the secret key. E bounds the Euclidean norm of CKKS's error over a
# ciphertext's values on a sum of fresh ciphertexts: ``NOISE_UNITS`` in the encoding's integer units, 18 times the
# measured 2^19.8 on a sum of 100 encryptions of zero (``tests/test_blind.py`` holds it under 2^21); the norm grows
# as the square root of the sites, so at 2^21 for 100 the bound holds to 6,400 sites (MOST_SITES caps a job at 100).
NOISE_UNITS = 2**24
STATISTICAL_SECURITY_BITS = 30
# t: the distinct ciphertexts one job's sites decrypt. A site's noise is a function of the ciphertext (below), so
# decrypting one again (to validate, to train, to publish) tells nothing new; per round it decrypts the candidate's
# sums and each leave-one-out candidate's, about 1,737 ciphertexts each (a DenseNet121 and 20 classes): 100 sites
# over 1,900 rounds.
DECRYPTIONS = 2**35
FLOODING_SD = NOISE_UNITS / 2.0**SCALE_BITS * 2.0 ** (STATISTICAL_SECURITY_BITS / 2) * math.sqrt(64 * DECRYPTIONS)
VALUES_PER_CIPHERTEXT = POLY_MODULUS_DEGREE // 2
LARGEST_VALUE = 2.0**17  # a sum beyond it would not decode: 5 bits below the measured limit
MOST_SITES = 100  # the sum of this many sites' largest packed values stays below LARGEST_VALUE
WEIGHT_UNIT = 10_000  # with weighting "samples", a site's weight is its images in units of this many
KEY_BYTES = 32
SMALLEST_WEIGHT = 1e-4  # one image: an aggregation weight below it is refused
EMPTY_WEIGHT = 1e-6  # a summed weight below it is no site's: far above the flooding (1e-11), below SMALLEST_WEIGHT


class BlindAggregationError(UserError, ValueError):
    """A blind update that cannot be packed or unpacked as asked, or sites' secret that cannot be read; the message
    says which class, file or field, and why."""


def check_secret(key: bytes, classes: Sequence[str]) -> None:
    """A key long enough, and a class list naming each class once."""
    if len(key) < KEY_BYTES:
        raise BlindAggregationError(f"the sites' key must have at least {KEY_BYTES} bytes, got {len(key)}")
    if not classes or len(set(classes)) != len(classes) or not all(isinstance(name, str) for name in classes):
        raise BlindAggregationError(f"the consortium's class list must name each class once, got {list(classes)}")


def _keyed_order(key: bytes, name: str) -> bytes:
    return hmac.new(key, name.encode("utf-8"), hashlib.sha256).digest()


@dataclass(frozen=True)
class BlindLayout:
    """Where each value of a site's update goes in the vector every site encrypts (module docstring)."""

    key: bytes  # the sites' shared key: the server must not hold it
    classes: tuple[str, ...]  # the consortium's class list, canonical names: the sites', never the server's
    backbone: tuple[tuple[str, tuple[int, ...]], ...]  # the averaged entries and their shapes, in order
    features: int
    head: HeadSpec = NAMED_HEAD

    @classmethod
    def of(
        cls,
        state: StateDict,
        averaged_keys: Sequence[str],
        key: bytes,
        classes: Sequence[str],
        head: HeadSpec = NAMED_HEAD,
    ) -> BlindLayout:
        check_secret(key, classes)
        # floating entries only: an integer counter (BatchNorm's num_batches_tracked, which DenseNet's BatchNorm with
        # its fixed momentum never reads) grows past what the cipher encodes; each site keeps its own
        floating = [name for name in averaged_keys if np.issubdtype(to_numpy(state[name]).dtype, np.floating)]
        backbone = tuple((name, tuple(to_numpy(state[name]).shape)) for name in floating)
        return cls(key, tuple(classes), backbone, int(to_numpy(state[head.weight_key]).shape[1]), head)

    @cached_property
    def _slots(self) -> dict[str, int]:
        ordered = sorted(self.classes, key=lambda name: _keyed_order(self.key, name))
        return {name: slot for slot, name in enumerate(ordered)}

    @cached_property
    def backbone_size(self) -> int:
        return sum(math.prod(shape) for _, shape in self.backbone)

    @property
    def slot_width(self) -> int:
        return self.features + 2  # the weight row, the bias, w

    @cached_property
    def backbone_parts(self) -> int:
        """Ciphertexts of the backbone part (its entries and the summed weight)."""
        return math.ceil((self.backbone_size + 1) / VALUES_PER_CIPHERTEXT)

    @property
    def parts_per_slot(self) -> int:
        return math.ceil(self.slot_width / VALUES_PER_CIPHERTEXT)

    @property
    def parts(self) -> int:
        """Ciphertexts of a site's whole vector: the same for every site of the consortium."""
        return self.backbone_parts + len(self.classes) * self.parts_per_slot

    @property
    def size(self) -> int:
        return self.parts * VALUES_PER_CIPHERTEXT

    def slot(self, name: str) -> int:
        if name not in self._slots:
            raise BlindAggregationError(
                f"class {name!r} is not in the consortium's list of {len(self.classes)} classes: blind aggregation "
                "sums listed classes only (extend the list, in every site's blind settings, for a new finding)"
            )
        return self._slots[name]

    def _first_part(self, name: str) -> int:
        return self.backbone_parts + self.slot(name) * self.parts_per_slot

    def parts_for(self, class_names: Sequence[str]) -> list[int]:
        """The ciphertexts a site of these classes is sent back: the backbone part and its own slots."""
        slots = [self._first_part(name) + offset for name in class_names for offset in range(self.parts_per_slot)]
        return list(range(self.backbone_parts)) + sorted(slots)

    def pack(self, state: StateDict, class_names: Sequence[str], weight: float) -> np.ndarray:
        """A site's update as the vector it encrypts: ``state``'s averaged entries and its head rows (in
        ``class_names`` order, canonical names), each times ``weight``."""
        if not weight >= SMALLEST_WEIGHT:
            raise BlindAggregationError(f"the aggregation weight must be at least {SMALLEST_WEIGHT}, got {weight}")
        if len(set(class_names)) != len(class_names):
            raise BlindAggregationError(f"a site's class names must be unique, got {list(class_names)}")
        vector = np.zeros(self.size, dtype=np.float64)
        position = 0
        for key, shape in self.backbone:
            values = to_numpy(state[key]).astype(np.float64).ravel()
            if values.shape != (math.prod(shape),):
                raise BlindAggregationError(f"{key!r} has shape {to_numpy(state[key]).shape}, the layout's is {shape}")
            vector[position : position + values.size] = values * weight
            position += values.size
        vector[position] = weight
        rows, biases = to_numpy(state[self.head.weight_key]), to_numpy(state[self.head.bias_key])
        if rows.shape != (len(class_names), self.features):
            raise BlindAggregationError(f"the head has shape {rows.shape}, expected ({len(class_names)}, features)")
        for index, name in enumerate(class_names):
            start = self._first_part(name) * VALUES_PER_CIPHERTEXT
            vector[start : start + self.features] = rows[index] * weight
            vector[start + self.features] = biases[index] * weight
            vector[start + self.features + 1] = weight
        largest = float(np.abs(vector).max(initial=0.0))
        if largest * MOST_SITES > LARGEST_VALUE:  # room for the sum over the most sites
            raise BlindAggregationError(
                f"a packed value of {largest:.3g} leaves no room below the cipher's {LARGEST_VALUE:.3g} for the sum: "
                "scale the aggregation weights down"
            )
        return vector

    def _values(self, sums: Mapping[int, np.ndarray], first: int, count: int) -> np.ndarray:
        """``count`` values from the decrypted ciphertexts ``sums`` (part -> values), from part ``first`` on."""
        parts = range(first, first + math.ceil(count / VALUES_PER_CIPHERTEXT))
        missing = [part for part in parts if part not in sums]
        if missing:
            raise BlindAggregationError(f"ciphertexts {missing} of the sum were not received")
        return np.concatenate([np.asarray(sums[part], dtype=np.float64) for part in parts])[:count]

    def unpack(self, sums: Mapping[int, np.ndarray], class_names: Sequence[str], template: StateDict) -> dict[str, Any]:
        """From the decrypted sums of every site's vector (part -> values: the parts :meth:`parts_for` names),
        ``template`` (the model the site holds) with the averaged backbone entries and the rows of ``class_names``
        (in that order) replaced by their means; a row whose slot no site filled stays as it is."""
        state = dict(template)
        backbone = self._values(sums, 0, self.backbone_size + 1)
        total_weight = float(backbone[self.backbone_size])
        if not total_weight > EMPTY_WEIGHT:
            raise BlindAggregationError(f"the summed weight is {total_weight:.3g}: no site's update is in this sum")
        position = 0
        for key, shape in self.backbone:
            size = math.prod(shape)
            state[key] = cast_like(template[key], (backbone[position : position + size] / total_weight).reshape(shape))
            position += size
        rows = to_numpy(template[self.head.weight_key]).astype(np.float64).copy()
        biases = to_numpy(template[self.head.bias_key]).astype(np.float64).copy()
        if rows.shape != (len(class_names), self.features):
            raise BlindAggregationError(f"the head has shape {rows.shape}, expected ({len(class_names)}, features)")
        for index, name in enumerate(class_names):
            values = self._values(sums, self._first_part(name), self.slot_width)
            row_weight = float(values[self.features + 1])
            if row_weight > EMPTY_WEIGHT:
                rows[index] = values[: self.features] / row_weight
                biases[index] = values[self.features] / row_weight
        state[self.head.weight_key] = cast_like(template[self.head.weight_key], rows)
        state[self.head.bias_key] = cast_like(template[self.head.bias_key], biases)
        return state


class BlindCipher:
    """CKKS over TenSEAL: the sites' context (with the secret key: encrypt, decrypt) or the server's (the public
    part only: add). A vector travels as one serialized ciphertext per ``VALUES_PER_CIPHERTEXT`` values."""

    def __init__(self, context: Any) -> None:
        self._context = context
        self._flooding_key = os.urandom(KEY_BYTES)  # this site's, this process's: never leaves it

    @classmethod
    def for_sites(cls) -> BlindCipher:
        """A new context with a secret key, made once for a consortium and given to every site, never the server."""
        import tenseal

        context = tenseal.context(
            tenseal.SCHEME_TYPE.CKKS,
            poly_modulus_degree=POLY_MODULUS_DEGREE,
            coeff_mod_bit_sizes=list(COEFFICIENT_MODULI),
        )
        context.global_scale = 2.0**SCALE_BITS
        return cls(context)

    @classmethod
    def from_bytes(cls, data: bytes) -> BlindCipher:
        import tenseal

        return cls(tenseal.context_from(data))

    def to_bytes(self) -> bytes:
        """This context as it is (the sites': with the secret key)."""
        return self._context.serialize(save_secret_key=True)

    def public_bytes(self) -> bytes:
        """The context without its secret key: what the server gets."""
        return self._context.serialize(save_secret_key=False)

    @property
    def holds_secret_key(self) -> bool:
        return bool(self._context.is_private())

    def encrypt(self, vector: np.ndarray) -> list[bytes]:
        import tenseal

        return [
            tenseal.ckks_vector(self._context, vector[start : start + VALUES_PER_CIPHERTEXT].tolist()).serialize()
            for start in range(0, len(vector), VALUES_PER_CIPHERTEXT)
        ]

    def add(self, encrypted: Sequence[Sequence[bytes]]) -> list[bytes]:
        """The sum of several sites' encrypted vectors, ciphertext by ciphertext (no key needed)."""
        import tenseal

        lengths = {len(parts) for parts in encrypted}
        if len(lengths) != 1:
            raise BlindAggregationError(
                f"the encrypted vectors have different numbers of ciphertexts: {sorted(lengths)}"
            )
        sums = []
        for parts in zip(*encrypted, strict=True):
            total = tenseal.ckks_vector_from(self._context, parts[0])
            for part in parts[1:]:
                total += tenseal.ckks_vector_from(self._context, part)
            sums.append(total.serialize())
        return sums

    def ciphertext_problem(self, data: bytes) -> str | None:
        """Why ``data`` is not one ciphertext of this context's parameters (None: it is). What a server can check of a
        value it cannot read: that it parses, holds one ciphertext's values and has the consortium's scale (so that
        the sum can be computed)."""
        import tenseal

        try:
            vector = tenseal.ckks_vector_from(self._context, data)
        except Exception as error:  # TenSEAL raises plain exceptions of several kinds on bytes it cannot parse
            return f"not a ciphertext of the consortium's parameters ({type(error).__name__})"
        if vector.size() != VALUES_PER_CIPHERTEXT:  # every site pads its vector to whole ciphertexts
            return f"it holds {vector.size()} values, every ciphertext of an update {VALUES_PER_CIPHERTEXT}"
        scales = {ciphertext.scale for ciphertext in vector.data.ciphertext()}
        if scales != {2.0**SCALE_BITS}:  # ciphertexts of another scale cannot be added (TenSEAL raises)
            found = ", ".join(f"2^{math.log2(scale):.0f}" for scale in sorted(scales))
            return f"its scale is {found}, the consortium's 2^{SCALE_BITS}"
        return None

    def decrypt(self, encrypted: Mapping[int, bytes]) -> dict[int, np.ndarray]:
        """Each ciphertext (part -> serialized ciphertext) decrypted and flooded: part -> its values, each with a
        Gaussian of :data:`FLOODING_SD` added. The noise is drawn from SHAKE-256 of this cipher's own random key and
        the ciphertext, so the same ciphertext decrypted again gets the same noise (averaging repeated decryptions
        gains nothing) and another site's or another ciphertext's is independent. No caller gets a decryption
        without it."""
        return {
            part: values + keyed_gaussian(self._flooding_key, encrypted[part], values.size) * FLOODING_SD
            for part, values in self._exact(encrypted).items()
        }

    def _exact(self, encrypted: Mapping[int, bytes]) -> dict[int, np.ndarray]:
        """The decryptions as CKKS gives them (their error tells the key: only tests measure it)."""
        import tenseal

        if not self.holds_secret_key:
            raise BlindAggregationError("this context has no secret key: only the sites decrypt")
        return {
            part: np.asarray(tenseal.ckks_vector_from(self._context, data).decrypt(), dtype=np.float64)
            for part, data in encrypted.items()
        }


def keyed_gaussian(key: bytes, message: bytes, count: int) -> np.ndarray:
    """``count`` standard normal values, a deterministic function of ``key`` and ``message`` that cannot be told
    from independent draws without the key: Box-Muller over 53-bit uniforms in (0, 1] read from SHAKE-256 of the key
    and the message's BLAKE2b digest (a cryptographic generator: zero-padded slots show the noise itself, and a
    generator whose state its outputs reveal would give the error back)."""
    pairs = (count + 1) // 2
    digest = hashlib.blake2b(message, digest_size=32).digest()
    stream = hashlib.shake_256(b"surgical-aggregation flooding" + key + digest).digest(16 * pairs)
    words = np.frombuffer(stream, dtype=np.uint64).reshape(pairs, 2)
    uniform = ((words >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53
    radius = np.sqrt(-2.0 * np.log(uniform[:, 0]))
    angle = 2.0 * math.pi * uniform[:, 1]
    return np.column_stack([radius * np.cos(angle), radius * np.sin(angle)]).ravel()[:count]  # one stream: prefixes


PUBLIC_CONTEXT = "public_context"  # the handshake's param: the consortium's CKKS context without its secret key
PART_PREFIX = "ciphertext/"  # a ciphertext's name among a task's params: the prefix, then its part number


def parts_as_params(parts: Mapping[int, bytes]) -> dict[str, np.ndarray]:
    """Ciphertexts as FLARE params: named by part number, each its bytes as a uint8 array (FLARE streams arrays)."""
    return {f"{PART_PREFIX}{part:06d}": np.frombuffer(data, dtype=np.uint8) for part, data in sorted(parts.items())}


def params_as_parts(params: Mapping[str, Any], where: str) -> dict[int, bytes]:
    """The ciphertexts of :func:`parts_as_params`' params; anything else is refused, ``where`` naming the sender."""
    parts = {}
    for name, value in params.items():
        number = name[len(PART_PREFIX) :] if isinstance(name, str) and name.startswith(PART_PREFIX) else ""
        if not number.isdigit():
            raise BlindAggregationError(f"{where}: {name!r} is not a ciphertext ({PART_PREFIX}<part>)")
        array = np.asarray(value)
        if array.dtype != np.uint8 or array.ndim != 1:
            raise BlindAggregationError(f"{where}: {name!r} is {array.dtype} of shape {array.shape}, not bytes")
        parts[int(number)] = array.tobytes()
    return parts


def new_sites_key() -> bytes:
    """A fresh key for the slots, from the operating system's entropy."""
    return os.urandom(KEY_BYTES)


def blind_weight(num_samples: int, weighting: str) -> float:
    """A site's aggregation weight: 1, or its images in units of :data:`WEIGHT_UNIT` (``samples``; any common unit
    leaves the means as they are, and this one keeps the packed values of a site of up to about a million images
    within the cipher's range; the flooding of a decryption, 1e-11 over the summed weight, is far below a float32
    weight's rounding for sites of a few hundred images or more)."""
    return 1.0 if weighting == "uniform" else num_samples / WEIGHT_UNIT


SECRET_FORMAT = 3  # 3: a wrapping key in place of one CKKS context for every job (a fresh one per job)
JOB_KEY_PARAMS = ("job_key/context", "job_key/nonce", "job_key/public")  # the wrapped job key in a task's params
CONSORTIUM_LABEL = b"surgical-aggregation blind consortium"  # what the wrapping key's public fingerprint is a MAC of
NONCE_BYTES = 12  # AES-GCM's


@dataclass(frozen=True)
class JobKey:
    """One job's CKKS context: made by one site at the job's handshake (:meth:`BlindSecret.new_job_key`), its secret
    context encrypted under the consortium's wrapping key (AES-GCM, bound to the job and to the public context it
    goes with), relayed by the server to every site with each task, opened by each site
    (:meth:`BlindSecret.open_job_key`). Every job has its own key pair: the ciphertexts and decryptions of one job
    say nothing of another's key (Li and Micciancio's key recovery needs both under one key)."""

    cipher: BlindCipher  # with the secret key
    public: bytes  # the public context, as the server adds under it
    wrapped: bytes  # the secret context, encrypted under the wrapping key
    nonce: bytes

    def as_params(self) -> dict[str, np.ndarray]:
        """The wrapped key as a task's params (bytes as uint8 arrays: FLARE streams arrays)."""
        values = (self.wrapped, self.nonce, self.public)
        return {name: np.frombuffer(value, dtype=np.uint8) for name, value in zip(JOB_KEY_PARAMS, values, strict=True)}

    @property
    def fingerprint(self) -> str:
        """The public context's SHA-256 (the server's records name the job's key by it)."""
        return hashlib.sha256(self.public).hexdigest()


def split_job_key(params: Mapping[str, Any]) -> tuple[dict[str, bytes] | None, dict[str, Any]]:
    """(the job key's entries of a task's ``params`` as bytes, or None without them; the other params)."""
    rest = {name: value for name, value in params.items() if name not in JOB_KEY_PARAMS}
    if not all(name in params for name in JOB_KEY_PARAMS):
        return None, rest
    return {name: np.asarray(params[name], dtype=np.uint8).tobytes() for name in JOB_KEY_PARAMS}, rest


def _job_binding(job: str, public: bytes) -> bytes:
    """What a wrapped job key is bound to (AES-GCM's associated data): the job, and the public context it goes with."""
    return b"job:" + job.encode("utf-8") + b"\npublic:" + hashlib.sha256(public).digest()


@dataclass(frozen=True)
class BlindSecret:
    """What every site of a blind federation holds and the server must not: the slots' key, the consortium's class
    list and the wrapping key under which each job's fresh CKKS key travels (:class:`JobKey`). One site makes it
    (:meth:`new`) and hands the file to the others over a channel the coordinator does not run; each keeps it in its
    workspace's ``local/``, never in a job (a job folder travels through the server). As JSON text here
    (:meth:`to_json`, :meth:`from_json`): the core does no I/O."""

    key: bytes
    classes: tuple[str, ...]
    wrapping_key: bytes

    @classmethod
    def new(cls, classes: Sequence[str]) -> BlindSecret:
        key = new_sites_key()
        check_secret(key, classes)
        return cls(key, tuple(classes), new_sites_key())

    @property
    def fingerprint(self) -> str:
        """A MAC of a fixed text under the wrapping key: the same at every site of the consortium, another for any
        other secret (the server compares the sites' to refuse one of another consortium; it reveals no key)."""
        return hmac.new(self.wrapping_key, CONSORTIUM_LABEL, hashlib.sha256).hexdigest()

    def _aead(self):
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        return AESGCM(hmac.new(self.wrapping_key, b"job key wrapping", hashlib.sha256).digest())

    def new_job_key(self, job: str) -> JobKey:
        """A fresh CKKS key pair for ``job``, its secret context wrapped for the other sites."""
        cipher = BlindCipher.for_sites()
        public = cipher.public_bytes()
        nonce = os.urandom(NONCE_BYTES)
        wrapped = self._aead().encrypt(nonce, cipher.to_bytes(), _job_binding(job, public))
        return JobKey(cipher, public, wrapped, nonce)

    def open_job_key(self, entries: Mapping[str, bytes], job: str, where: str) -> JobKey:
        """The job key a task carries (:func:`split_job_key`'s entries), opened with the wrapping key; refused when it
        was not wrapped by a site of this consortium for this job and this public context (``where`` names the
        sender)."""
        from cryptography.exceptions import InvalidTag

        wrapped, nonce, public = (entries[name] for name in JOB_KEY_PARAMS)
        try:
            context = self._aead().decrypt(nonce, wrapped, _job_binding(job, public))
        except (InvalidTag, ValueError):
            raise BlindAggregationError(
                f"{where}: the job's key was not made by a site of this consortium for job {job!r} (another "
                "consortium's secret, another job's key, or a key the sender changed): refused"
            ) from None
        cipher = BlindCipher.from_bytes(context)
        if not cipher.holds_secret_key:
            raise BlindAggregationError(f"{where}: the job's key holds no secret key")
        return JobKey(cipher, public, wrapped, nonce)

    def layout_for(self, state: StateDict, averaged_keys: Sequence[str]) -> BlindLayout:
        return BlindLayout.of(state, averaged_keys, self.key, self.classes)

    def to_json(self) -> str:
        """The secret as JSON text (whoever stores it keeps the file readable by its owner only)."""
        values = {
            "format": SECRET_FORMAT,
            "key": self.key.hex(),
            "classes": list(self.classes),
            "wrapping_key": self.wrapping_key.hex(),
        }
        return json.dumps(values)

    @classmethod
    def from_json(cls, text: str, where: str) -> BlindSecret:
        """The secret from :meth:`to_json`'s text; ``where`` (its file) names it in every error."""
        try:
            values = json.loads(text)
        except ValueError as error:
            raise BlindAggregationError(f"{where}: not JSON ({error})") from None
        found = values.get("format") if isinstance(values, dict) else None
        if found != SECRET_FORMAT:
            raise BlindAggregationError(
                f"{where}: format {found!r}; this bundle reads blind secrets of format {SECRET_FORMAT} (make a new "
                "one with surgical-aggregation blind-secret)"
            )
        try:
            key = bytes.fromhex(values["key"])
            wrapping_key = bytes.fromhex(values["wrapping_key"])
            classes = tuple(values["classes"])
        except (ValueError, KeyError, TypeError) as error:
            raise BlindAggregationError(f"{where}: not a blind secret ({type(error).__name__}: {error})") from None
        try:
            check_secret(key, classes)
        except BlindAggregationError as error:
            raise BlindAggregationError(f"{where}: {error}") from None
        if len(wrapping_key) < KEY_BYTES:
            raise BlindAggregationError(f"{where}: its wrapping key has {len(wrapping_key)} bytes, not {KEY_BYTES}")
        return cls(key, classes, wrapping_key)
