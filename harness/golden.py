"""Stored golden results: what the reference produced, kept in the repository.

A golden is the reference's output for one case at one world size, made on the CPU from the
deterministic inputs, one safetensors file per ``(case, world size)`` holding every rank's
outputs. An output of at most ``WHOLE_MAX_BYTES`` is stored whole; a bigger one as a
*fingerprint*: its values at ``SAMPLES`` fixed positions plus float64 sums, absolute sums and
sums of squares over chunks of ``CHUNK`` elements. ``manifest.json`` beside the files holds,
per entry, the file, its sha256, shapes, dtypes, and the input-generator and torch versions.

A run compares every implementation with the golden as well as with the live reference, so a
change of the reference itself (an edit, a new torch) cannot move the goal posts unseen.
A fingerprint is checked soundly: each sampled element must meet the tolerance's elementwise
part, and each chunk sum must lie within the largest difference the tolerance allows over
that chunk (``_sum_bound``), plus float64 summation slack.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness import compare

SCHEMA = 1
MANIFEST = "manifest.json"
ENV_VAR = "HARNESS_GOLDEN_DIR"
#: outputs up to this size are stored whole, bigger ones as a fingerprint
WHOLE_MAX_BYTES = 64 << 10
#: sampled positions of a fingerprint (besides the first and the last element)
SAMPLES = 512
#: elements per fingerprint chunk sum
CHUNK = 1 << 16
#: chunks converted to float64 at once when summing (bounds the temporary memory)
_SUM_BLOCK = 64

_EPS64 = 2.0**-52


class GoldenError(Exception):
    """A golden that cannot be used (missing, corrupt, stale); the message names the file."""


# ------------------------------------------------------------------------------ locations
def default_dir() -> Path:
    """``$HARNESS_GOLDEN_DIR``, else ``golden/`` inside the suites package."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    spec = importlib.util.find_spec("suites")
    if spec is None or not spec.submodule_search_locations:
        raise GoldenError(f"the suites package is not importable: set {ENV_VAR} to a golden dir")
    return Path(next(iter(spec.submodule_search_locations))) / "golden"


def entry_key(case_id: str, world_size: int) -> str:
    """Manifest key of a case at a world size: ``w4:allreduce[...]``."""
    return f"w{world_size}:{case_id}"


def relative_file(family: str, op: str, case_id: str, world_size: int) -> str:
    """Where an entry's file lives under the golden dir: readable, and unique by a hash."""
    stem = "".join(c if c.isalnum() or c in "._=-" else "_" for c in case_id.split("[", 1)[-1])
    digest = hashlib.sha256(entry_key(case_id, world_size).encode()).hexdigest()[:10]
    return f"{family}/{op}/{stem.strip('_')[:80]}-w{world_size}-{digest}.safetensors"


# ----------------------------------------------------------------------------- encodings
@dataclass
class Fingerprint:
    """Sampled values and float64 chunk sums of one large output."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    positions: torch.Tensor  # int64 flat indices
    values: torch.Tensor  # the output's dtype
    sums: torch.Tensor  # float64 per chunk
    abs_sums: torch.Tensor
    sq_sums: torch.Tensor

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


Stored = torch.Tensor | Fingerprint


def sample_positions(numel: int, key: str) -> torch.Tensor:
    """``SAMPLES`` distinct flat indices fixed by ``key``, plus the first and last element."""
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    picks = rng.choice(numel, size=min(SAMPLES, numel), replace=False)
    return torch.from_numpy(np.unique(np.concatenate([picks, [0, numel - 1]])).astype(np.int64))


def chunk_sums(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float64 sum, absolute sum and sum of squares of each ``CHUNK`` of ``flat`` (on its
    device), converted a block of chunks at a time."""
    n = flat.numel()
    n_chunks = max(1, -(-n // CHUNK))
    out = [torch.empty(n_chunks, dtype=torch.float64, device=flat.device) for _ in range(3)]
    for first in range(0, n_chunks, _SUM_BLOCK):
        last = min(n_chunks, first + _SUM_BLOCK)
        block = flat[first * CHUNK : last * CHUNK].to(torch.float64)
        full = (block.numel() // CHUNK) * CHUNK
        rows = [block[:full].view(-1, CHUNK)] if full else []
        parts = [(r.sum(1), r.abs().sum(1), (r * r).sum(1)) for r in rows]
        if block.numel() > full or not rows:  # the ragged last chunk (or an empty tensor)
            tail = block[full:]
            parts.append(tuple(v.reshape(1) for v in (tail.sum(), tail.abs().sum(),
                                                      (tail * tail).sum())))
        for k in range(3):
            out[k][first:last] = torch.cat([p[k] for p in parts])
    return out[0], out[1], out[2]


def fingerprint(t: torch.Tensor, key: str) -> Fingerprint:
    """The fingerprint of ``t``; ``key`` fixes the sample positions."""
    flat = t.detach().contiguous().reshape(-1)
    positions = sample_positions(flat.numel(), key)
    sums, abs_sums, sq_sums = chunk_sums(flat)
    return Fingerprint(tuple(t.shape), t.dtype, positions,
                       flat[positions.to(flat.device)].cpu(), sums.cpu(), abs_sums.cpu(),
                       sq_sums.cpu())


def encode(outputs: Mapping[int, Mapping[str, torch.Tensor]], key: str
           ) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """Every rank's outputs as safetensors entries, and the manifest's per-output description.

    Names are ``r{rank}/{output}`` for whole tensors and ``r{rank}/{output}/{part}`` for the
    parts of a fingerprint.
    """
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, dict[str, Any]] = {}
    for rank in sorted(outputs):
        for name, t in sorted(outputs[rank].items()):
            if t is None:
                continue
            label = f"r{rank}/{name}"
            t = t.detach().cpu().contiguous()
            info: dict[str, Any] = {"shape": list(t.shape), "dtype": str(t.dtype)[6:]}
            if t.numel() * t.element_size() <= WHOLE_MAX_BYTES:
                tensors[label] = t.clone()  # safetensors refuses tensors sharing storage
                info["kind"] = "whole"
            else:
                fp = fingerprint(t, f"{key}/{label}")
                for part in ("positions", "values", "sums", "abs_sums", "sq_sums"):
                    tensors[f"{label}/{part}"] = getattr(fp, part).contiguous()
                info.update(kind="fingerprint", chunk=CHUNK, samples=int(fp.positions.numel()))
            meta[label] = info
    return tensors, meta


def decode(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Mapping[str, Any]],
           rank: int, where: str) -> dict[str, Stored]:
    """One rank's stored outputs, by output name."""
    out: dict[str, Stored] = {}
    prefix = f"r{rank}/"
    for label, info in meta.items():
        if not label.startswith(prefix):
            continue
        name = label[len(prefix):]
        try:
            if info["kind"] == "whole":
                out[name] = tensors[label]
            else:
                parts = {p: tensors[f"{label}/{p}"]
                         for p in ("positions", "values", "sums", "abs_sums", "sq_sums")}
                out[name] = Fingerprint(shape=tuple(info["shape"]),
                                        dtype=getattr(torch, info["dtype"]), **parts)
        except KeyError as exc:
            raise GoldenError(f"golden {where} lacks tensor {exc.args[0]!r} that its manifest "
                              "entry names: regenerate it with `harness golden generate "
                              "--accept`") from exc
    return out


# ------------------------------------------------------------------------------- checking
@dataclass
class OutputCheck:
    """One output of one rank against its golden."""

    kind: str  # "whole" or "fingerprint"
    metrics: compare.Metrics
    tolerance: compare.Tolerance  # what the metrics were judged with
    sums_error: str = ""  # a fingerprint chunk sum outside its bound, else ""

    def to_dict(self) -> dict[str, Any]:
        """Mergeable JSON form (gathered across ranks)."""
        return {"kind": self.kind, "metrics": self.metrics.to_dict(),
                "tolerance": self.tolerance.to_dict(), "sums_error": self.sums_error}


#: what a fingerprint sample is held to when the tolerance has no elementwise part: nothing
#: but agreement on NaN and infinities (the norms are checked through the chunk sums)
_SPECIALS_ONLY = compare.rel_l2(math.inf)


def check_output(actual: torch.Tensor, stored: Stored, tol: compare.Tolerance, rank: int = 0
                 ) -> OutputCheck:
    """Measure ``actual`` (any device) against a stored golden under ``tol``."""
    if isinstance(stored, torch.Tensor):
        return OutputCheck("whole", compare.measure(actual, stored, tol, rank=rank), tol)
    sample_tol = tol.elementwise or _SPECIALS_ONLY
    # a golden may be wider than the output (a float32 second reference of a bf16 output)
    if tuple(actual.shape) != stored.shape:
        m = compare.Metrics(numel=max(stored.numel, 1), n_mismatch=max(stored.numel, 1),
                            shape=list(actual.shape),
                            shape_error=f"shape {tuple(actual.shape)} != golden {stored.shape}")
        return OutputCheck("fingerprint", m, sample_tol)
    flat = actual.detach().contiguous().reshape(-1)
    positions = stored.positions.to(flat.device)
    m = compare.measure(flat[positions], stored.values, sample_tol, rank=rank)
    if m.first_bad_index is not None:  # report the element's place in the output, not the sample's
        m.first_bad_index = int(stored.positions[m.first_bad_index])
    m.shape = list(actual.shape)
    sums, abs_sums, sq_sums = (s.cpu() for s in chunk_sums(flat))
    return OutputCheck("fingerprint", m, sample_tol,
                       _check_sums(stored, sums, abs_sums, sq_sums, tol))


def check_fingerprint(new: Fingerprint, old: Fingerprint, tol: compare.Tolerance
                      ) -> OutputCheck:
    """A fingerprint against another (a re-derived golden against the stored one): samples
    against samples, chunk sums against chunk sums."""
    sample_tol = tol.elementwise or _SPECIALS_ONLY
    if (new.shape, new.dtype) != (old.shape, old.dtype) or not _bits_equal(new.positions,
                                                                           old.positions):
        m = compare.Metrics(numel=1, n_mismatch=1, shape=list(new.shape),
                            shape_error=f"{new.shape} {new.dtype} != {old.shape} {old.dtype}")
        return OutputCheck("fingerprint", m, sample_tol)
    m = compare.measure(new.values, old.values, sample_tol)
    return OutputCheck("fingerprint", m, sample_tol,
                       _check_sums(old, new.sums, new.abs_sums, new.sq_sums, tol))


def _check_sums(stored: Fingerprint, sums: torch.Tensor, abs_sums: torch.Tensor,
                sq_sums: torch.Tensor, tol: compare.Tolerance) -> str:
    if sums.shape != stored.sums.shape:
        return f"{sums.numel()} chunk sums, golden has {stored.sums.numel()}"
    counts = torch.full_like(sums, float(CHUNK))
    counts[-1] = stored.numel - CHUNK * (sums.numel() - 1) if stored.numel else 0
    golden_special = ~torch.isfinite(stored.sums)
    special_ok = torch.where(golden_special,
                             (sums == stored.sums) | (torch.isnan(sums) & torch.isnan(stored.sums)),
                             torch.isfinite(sums))
    bound = _sum_bound(tol, counts, stored.abs_sums, float(stored.sq_sums.sum()),
                       float(sq_sums.sum()), stored.dtype)
    slack = counts * _EPS64 * (abs_sums + stored.abs_sums)
    diff = (sums - stored.sums).abs()
    bad = ~special_ok | (~golden_special & ~(diff <= bound + slack))
    if not bool(bad.any()):
        return ""
    c = int(bad.nonzero()[0])
    return (f"{int(bad.sum())}/{sums.numel()} chunk sums outside what {tol.describe()} allows; "
            f"first chunk {c} (elements {c * CHUNK}..): sum {float(sums[c]):.9g} vs golden "
            f"{float(stored.sums[c]):.9g}")


def _sum_bound(tol: compare.Tolerance, counts: torch.Tensor, golden_abs: torch.Tensor,
               golden_sq: float, actual_sq: float, dtype: torch.dtype) -> torch.Tensor:
    """The largest |sum(actual) - sum(golden)| over each chunk that ``tol`` permits.

    allclose: sum of atol + rtol*|g|. ulp(k): k ulps of each |g| (ulp(g) <= eps*|g|, plus the
    smallest subnormal step). cos_diff(c): |a-g|^2 <= c(|a|^2+|g|^2) over the whole output, and
    a chunk's sum of differences is at most sqrt(n) times their norm (Cauchy-Schwarz);
    rel_l2(r) likewise with |a-g| <= r|g|. all_of: every part must hold, so the tightest.
    A mismatch budget lets elements be arbitrarily far off: no bound (inf).
    """
    inf = torch.full_like(counts, math.inf)
    kind = tol.kind
    if kind == "exact":
        return torch.zeros_like(counts)
    if kind == "allclose":
        if tol.max_mismatch_frac > 0:
            return inf
        return counts * tol.atol + tol.rtol * golden_abs
    if kind == "ulp":
        if not dtype.is_floating_point:
            return torch.zeros_like(counts)
        info = torch.finfo(dtype)
        return tol.ulps * (info.eps * golden_abs + counts * info.smallest_normal * info.eps)
    if kind == "cos_diff":
        return counts.sqrt() * math.sqrt(tol.bound * (golden_sq + actual_sq))
    if kind == "rel_l2":
        return counts.sqrt() * tol.bound * math.sqrt(golden_sq)
    if kind == "all_of":
        bounds = [_sum_bound(p, counts, golden_abs, golden_sq, actual_sq, dtype)
                  for p in tol.parts]
        return torch.stack(bounds).min(0).values if bounds else inf
    return inf


def same_bits(a: Stored, b: Stored) -> bool:
    """Whether two stored goldens are identical (both whole, or both fingerprints)."""
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        return False
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        return _bits_equal(a, b)
    assert isinstance(b, Fingerprint)
    return (a.shape == b.shape and a.dtype == b.dtype
            and all(_bits_equal(getattr(a, p), getattr(b, p))
                    for p in ("positions", "values", "sums", "abs_sums", "sq_sums")))


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                       b.contiguous().reshape(-1).view(torch.uint8))


# --------------------------------------------------------------------------------- store
def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class GoldenStore:
    """A golden directory: its manifest and files. Reads are lazy and cached."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else default_dir()
        self._manifest: dict[str, Any] | None = None

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST

    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest (``{"schema", "entries": {key: entry}}``); empty when there is none."""
        if self._manifest is None:
            path = self.manifest_path
            if not path.exists():
                self._manifest = {"schema": SCHEMA, "entries": {}}
            else:
                try:
                    data = json.loads(path.read_text(encoding="utf-8"))
                    entries = data["entries"]
                    assert isinstance(entries, dict)
                except (OSError, ValueError, KeyError, AssertionError) as exc:
                    raise GoldenError(f"golden manifest {path} is unreadable ({exc}): restore "
                                      "it from git or rerun `harness golden generate`") from exc
                if int(data.get("schema", 0)) > SCHEMA:
                    raise GoldenError(f"golden manifest {path} has schema v{data['schema']}, "
                                      f"newer than this harness (v{SCHEMA}): upgrade it")
                self._manifest = data
        return self._manifest

    def entry(self, case_id: str, world_size: int) -> dict[str, Any] | None:
        """The manifest entry of a case, or None when it has no golden."""
        return self.manifest["entries"].get(entry_key(case_id, world_size))

    def path_of(self, entry: Mapping[str, Any]) -> Path:
        return self.root / entry["file"]

    def load(self, case_id: str, world_size: int, rank: int) -> tuple[Path, dict[str, Stored]]:
        """One rank's stored outputs; GoldenError naming the file when missing or corrupt."""
        entry = self.entry(case_id, world_size)
        if entry is None:
            raise GoldenError(f"no golden for {entry_key(case_id, world_size)} in "
                              f"{self.manifest_path}: run `harness golden generate`")
        path = self.path_of(entry)
        tensors = self.read_file(path, entry)
        return path, decode(tensors, entry["outputs"], rank, str(path))

    def read_file(self, path: Path, entry: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Every tensor of an entry's file, after checking its sha256 against the manifest."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        if not path.is_file():
            raise GoldenError(f"golden file {path} is missing (named in {self.manifest_path}): "
                              "restore it from git or rerun `harness golden generate`")
        digest = file_sha256(path)
        if digest != entry["sha256"]:
            raise GoldenError(f"golden file {path} does not match its manifest sha256 "
                              f"({digest[:12]} != {entry['sha256'][:12]}): it was edited or is "
                              "corrupt; restore it from git, or regenerate it with "
                              "`harness golden generate --accept`")
        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError) as exc:
            raise GoldenError(f"golden file {path} is not a readable safetensors file ({exc}): "
                              "restore it from git or regenerate it") from exc

    def write(self, key: str, rel: str, tensors: Mapping[str, torch.Tensor],
              entry: dict[str, Any]) -> None:
        """Write an entry's file (atomically) and record it in the in-memory manifest."""
        from safetensors.torch import save_file

        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        save_file(dict(tensors), str(tmp), metadata={"entry": key})
        os.replace(tmp, path)
        entry = dict(entry, file=rel, sha256=file_sha256(path))
        self.manifest["entries"][key] = entry

    def save_manifest(self) -> None:
        """Write the manifest atomically, entries sorted so diffs stay small."""
        data = dict(self.manifest)
        data["schema"] = SCHEMA
        data["entries"] = dict(sorted(data["entries"].items()))
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.manifest_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, self.manifest_path)
