"""The ``flash`` fleet: device profiles drawn from measured smartphone data (numpy only).

The data are FLASH's (Yang et al., "Characterizing Impacts of Heterogeneity in Federated
Learning upon Large-Scale Smartphone Data", WWW 2021; PKU-Chengxu/FLASH, BSD-2), copied
unchanged into ``flash_data/`` beside this module:

* compute: ``real2benchmark.json`` maps the device strings of the 136k-phone population to
  AI-Benchmark phone models and ``benchmark2score.json`` gives each model's AI score. The
  mix is the 162 device strings mapped to a model (115 models, matched case-insensitively:
  the two files spell "Asus ZenFone" and "Asus Zenfone"), each string once: the file lists
  the distinct strings without their counts. The 610 ``"unknown"`` strings are left out,
  i.e. phones without a benchmark are taken to follow the mapped phones' distribution.
  A device's speed is its model's score over the reference score, the median of the mix
  (3686): speed 1 is the median phone, so ``device-reference-gflops`` is that phone's
  GFLOP/s; speeds span 511 / 3686 = 0.14 to 31725 / 3686 = 8.6;
* network: ``speed_distri.json`` holds 19 users' mean and standard deviation of download
  and upload bandwidth (kbit/s; means 2370-17333 down, 431-6635 up).

Partition p draws, from ``default_rng([seed, p, FLASH_TAG])``, a standard normal z (its
place in the mix) and a user (uniform over the 19). Its phone is the one at quantile
u = Phi(z) of the mix sorted by score; with ``correlation`` c > 0 and the partitions'
sizes known, u = Phi(c Phi^-1(q_p) + sqrt(1 - c^2) z), q_p = (rank + 1/2) / N the
partition's rank by size among the N known partitions (ties by partition id): a Gaussian
copula between data size and device speed, c = 1 giving the largest partition the fastest
phone. Without sizes (c = 0, or a partition whose size is not known) the profile does not
depend on the number of partitions.

Per round t, ``default_rng([seed, t, p, FLASH_ROUND_TAG])`` draws three standard normals:
the speed is the phone's times exp(``speed_noise`` z_0) (a log-normal factor of median 1:
the benchmark is the device's typical speed; 0 = constant), and each bandwidth is
log-normal with the user's measured mean m and standard deviation s (sigma^2 =
ln(1 + s^2 / m^2), mu = ln m - sigma^2 / 2): positive, and with the measured mean and spread
exactly, where FLASH's normal redrawn below 0 raises the mean of a user whose spread is
close to its mean. :meth:`FlashFleet.profile` is the partition's mean profile (the
benchmark speed, the user's mean bandwidths): what the server plans with and what
``device_profiles.csv`` lists; :meth:`FlashFleet.round_profile` the round's draw.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from statistics import NormalDist

import numpy as np

from .devices import DeviceProfile, Fleet

__all__ = ["FLASH", "FLASH_DATA", "FLASH_ROUND_TAG", "FLASH_TAG", "FlashFleet",
           "FlashPopulation", "bandwidth_draw", "load_population"]

FLASH = "flash"  # the device-profiles value
FLASH_DATA = Path(__file__).with_name("flash_data")
FLASH_TAG = 0xF1A  # rng stream of a partition's phone and network user
FLASH_ROUND_TAG = 0xF1B  # rng stream of the per-round speed noise and bandwidths
UNKNOWN = "unknown"  # real2benchmark.json's value for a device without a benchmark
_NORMAL = NormalDist()


@dataclass(frozen=True)
class FlashPopulation:
    """The measured data as the fleet draws from it.

    ``devices`` are the mapped device strings sorted by score (then by name), ``models``
    their AI-Benchmark models and ``scores`` those models' AI scores; ``reference`` the
    median score of the mix (speed 1); ``users`` the network users (sorted ids) with their
    ``down`` and ``up`` (mean, std) in kbit/s.
    """

    devices: tuple[str, ...]
    models: tuple[str, ...]
    scores: tuple[float, ...]
    reference: float
    users: tuple[str, ...]
    down: tuple[tuple[float, float], ...]
    up: tuple[tuple[float, float], ...]
    unknown: int = 0  # device strings without a benchmark (left out of the mix)

    def speed(self, index: int) -> float:
        """The speed of the ``index``-th device of the mix: its score / the reference."""
        return self.scores[index] / self.reference


def load_population(folder: str | Path = FLASH_DATA) -> FlashPopulation:
    """Read ``real2benchmark.json``, ``benchmark2score.json`` and ``speed_distri.json`` from
    ``folder`` (default: the copy in the package), checked: an error names the file, the
    entry and what it must be."""
    folder = Path(folder)
    if folder == FLASH_DATA:
        return _packaged()
    return _read(folder)


@lru_cache(maxsize=1)
def _packaged() -> FlashPopulation:
    return _read(FLASH_DATA)


def _read(folder: Path) -> FlashPopulation:
    real = _json_object(folder / "real2benchmark.json")
    scores = _json_object(folder / "benchmark2score.json")
    users = _json_object(folder / "speed_distri.json")
    by_name = {str(name).lower(): value for name, value in scores.items()}
    mix = []
    unknown = 0
    for device, model in real.items():
        if not isinstance(model, str):
            raise ValueError(f"{folder / 'real2benchmark.json'}: device {device!r} maps to "
                             f"{model!r}; each device maps to a benchmark model name or "
                             f"{UNKNOWN!r}")
        if model == UNKNOWN:
            unknown += 1
            continue
        score = by_name.get(model.lower())
        if score is None:
            raise ValueError(f"{folder / 'real2benchmark.json'}: device {device!r} maps to "
                             f"{model!r}, which benchmark2score.json does not list; add its "
                             f"score or map the device to {UNKNOWN!r}")
        if not (_is_number(score) and math.isfinite(score) and score > 0):
            raise ValueError(f"{folder / 'benchmark2score.json'}: the score of {model!r} must "
                             f"be a finite number > 0, got {score!r}")
        mix.append((float(score), device, model))
    if not mix:
        raise ValueError(f"{folder / 'real2benchmark.json'}: no device maps to a benchmark "
                         f"model; the fleet needs at least one")
    mix.sort()
    down, up = [], []
    for user in sorted(users):
        row = users[user]
        if not isinstance(row, Mapping):
            raise ValueError(f"{folder / 'speed_distri.json'}: user {user!r} must be an object "
                             f"with down_u, down_sigma, up_u, up_sigma, got {row!r}")
        down.append(_mean_std(folder, user, row, "down"))
        up.append(_mean_std(folder, user, row, "up"))
    if not down:
        raise ValueError(f"{folder / 'speed_distri.json'}: lists no user; the fleet needs at "
                         f"least one")
    scores_sorted = tuple(s for s, _, _ in mix)
    return FlashPopulation(
        devices=tuple(d for _, d, _ in mix), models=tuple(m for _, _, m in mix),
        scores=scores_sorted, reference=float(np.median(scores_sorted)),
        users=tuple(sorted(users)), down=tuple(down), up=tuple(up), unknown=unknown)


def _json_object(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"FLASH device data {str(path)!r} does not load ({exc}); it ships "
                         f"with strategies/engine/flash_data/") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"FLASH device data {str(path)!r} must be a non-empty JSON object")
    return data


def _mean_std(folder: Path, user: str, row: Mapping, way: str) -> tuple[float, float]:
    mean, std = row.get(f"{way}_u"), row.get(f"{way}_sigma")
    if not (_is_number(mean) and math.isfinite(mean) and mean > 0
            and _is_number(std) and math.isfinite(std) and std >= 0):
        raise ValueError(f"{folder / 'speed_distri.json'}: user {user!r}: {way}_u must be a "
                         f"finite number > 0 and {way}_sigma one >= 0 (kbit/s), got "
                         f"{mean!r} and {std!r}")
    return float(mean), float(std)


def bandwidth_draw(mean: float, std: float, z: float) -> float:
    """A log-normal bandwidth with mean ``mean`` and standard deviation ``std`` at the
    standard normal ``z``: exp(mu + sigma z), sigma^2 = ln(1 + std^2 / mean^2),
    mu = ln mean - sigma^2 / 2 (``mean`` itself when ``std`` is 0)."""
    if std == 0:
        return float(mean)
    sigma2 = math.log1p((std / mean) ** 2)
    return float(math.exp(math.log(mean) - sigma2 / 2 + math.sqrt(sigma2) * z))


@dataclass(frozen=True)
class FlashFleet(Fleet):
    """Profiles drawn from FLASH's measured phones and networks (module docstring).

    Parameters
    ----------
    seed : int
        The run's seed: every draw is keyed by it.
    speed_noise : float
        sigma of the per-round log-normal factor on the speed (>= 0; 0 = constant).
    correlation : float
        c in [0, 1] between a partition's data size and its phone's speed (0 = independent,
        1 = the larger the partition, the faster its phone); needs ``sizes``.
    sizes : mapping, optional
        Partition id -> examples, the partitions that take part (the engine gives the sizes
        the clients report, :meth:`with_sizes`).
    availability : float
        Every device's probability to be online in a round.
    population : FlashPopulation, optional
        The data (default: the packaged copy, :func:`load_population`).
    """

    seed: int = 0
    speed_noise: float = 0.1
    correlation: float = 0.0
    sizes: Mapping[int, int] | None = None
    availability: float = 1.0
    population: FlashPopulation = field(default=None, repr=False)  # type: ignore[assignment]
    _ranks: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not (_is_number(self.speed_noise) and math.isfinite(self.speed_noise)
                and self.speed_noise >= 0):
            raise ValueError(f"speed_noise (sigma of the per-round log-normal speed factor) "
                             f"must be a finite number >= 0, got {self.speed_noise!r}")
        if not (_is_number(self.correlation) and 0.0 <= self.correlation <= 1.0):
            raise ValueError(f"correlation (between partition size and device speed) must be "
                             f"in [0, 1], got {self.correlation!r}")
        DeviceProfile(availability=self.availability)  # checks it
        if self.population is None:
            object.__setattr__(self, "population", load_population())
        if self.sizes is not None:
            sizes = {int(p): int(n) for p, n in self.sizes.items()}
            object.__setattr__(self, "sizes", sizes)
            order = sorted(sizes, key=lambda p: (sizes[p], p))
            self._ranks.update({p: (r + 0.5) / len(order) for r, p in enumerate(order)})

    @property
    def needs_sizes(self) -> bool:
        """Whether the partitions' sizes change the profiles (``correlation`` > 0)."""
        return self.correlation > 0

    def with_sizes(self, sizes: Mapping[int, int]) -> FlashFleet:
        """The same fleet ranked by ``sizes`` (partition id -> examples)."""
        return replace(self, sizes=dict(sizes))

    def assignment(self, partition_id: int) -> tuple[int, int]:
        """(index into the population's devices, index into its users) of a partition."""
        pid = int(partition_id)
        rng = np.random.default_rng([self.seed, pid, FLASH_TAG])
        z = float(rng.standard_normal())
        user = int(rng.integers(len(self.population.users)))
        latent = z
        if self.correlation > 0 and pid in self._ranks:
            c = float(self.correlation)
            latent = (c * _NORMAL.inv_cdf(self._ranks[pid])
                      + math.sqrt(max(1.0 - c * c, 0.0)) * z)
        count = len(self.population.devices)
        return min(int(_NORMAL.cdf(latent) * count), count - 1), user

    def profile(self, partition_id: int) -> DeviceProfile:
        """Partition p's mean profile: its phone's benchmark speed, its user's mean
        bandwidths (Mbit/s = kbit/s / 1000)."""
        device, user = self.assignment(partition_id)
        pop = self.population
        return DeviceProfile(pop.speed(device), pop.down[user][0] / 1000.0,
                             pop.up[user][0] / 1000.0, self.availability)

    def round_profile(self, partition_id: int, server_round: int) -> DeviceProfile:
        """Partition p's profile in round t: the speed times exp(speed_noise z_0), each
        bandwidth log-normal with the user's mean and spread (:func:`bandwidth_draw`)."""
        device, user = self.assignment(partition_id)
        pop = self.population
        z = np.random.default_rng([self.seed, int(server_round), int(partition_id),
                                   FLASH_ROUND_TAG]).standard_normal(3)
        speed = pop.speed(device)
        if self.speed_noise > 0:
            speed *= math.exp(self.speed_noise * float(z[0]))
        return DeviceProfile(speed, bandwidth_draw(*pop.down[user], float(z[1])) / 1000.0,
                             bandwidth_draw(*pop.up[user], float(z[2])) / 1000.0,
                             self.availability)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
