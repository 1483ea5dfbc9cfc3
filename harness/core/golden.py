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

import copy
import fcntl
import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.core import compare
from harness.core.buffers import same_bits as same_bits_tensor
from harness.core.discovery import builtin_suite_dir
from harness.core.metrics import Metrics
from harness.core.results import scratch_beside

SCHEMA = 2  # 2: fingerprints count NaN/inf per chunk and sum finite elements only
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
    suites_dir = builtin_suite_dir()
    if suites_dir is None:
        raise GoldenError(f"the suites package is not importable: set {ENV_VAR} to a golden dir")
    return suites_dir / "golden"


def entry_key(case_id: str, world_size: int) -> str:
    """Manifest key of a case at a world size: ``w4:allreduce[...]``."""
    return f"w{world_size}:{case_id}"


def _file_tag(case_id: str, world_size: int) -> str:
    """The end of an entry's file name that makes it unique: ``w4-<hash of its key>``."""
    digest = hashlib.sha256(entry_key(case_id, world_size).encode()).hexdigest()[:10]
    return f"w{world_size}-{digest}"


def relative_file(family: str, op: str, case_id: str, world_size: int) -> str:
    """Where an entry's file lives under the golden dir: readable, and unique by a hash."""
    stem = "".join(c if c.isalnum() or c in "._=-" else "_" for c in case_id.split("[", 1)[-1])
    return f"{family}/{op}/{stem.strip('_')[:80]}-{_file_tag(case_id, world_size)}.safetensors"


# ----------------------------------------------------------------------------- encodings
@dataclass
class Fingerprint:
    """Sampled values and float64 chunk sums of one large output."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    positions: torch.Tensor  # int64 flat indices
    values: torch.Tensor  # the output's dtype
    sums: torch.Tensor  # float64 per chunk, over its finite elements
    abs_sums: torch.Tensor
    sq_sums: torch.Tensor
    specials: torch.Tensor  # int64 [chunks, 3]: NaN, +inf and -inf counts per chunk
    #: sum of squares of this output over every rank (the norms cos_diff and rel_l2 are judged
    #: on are merged across ranks); None: this fingerprint's own
    total_sq: float | None = None

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


def chunk_stats(flat: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per ``CHUNK`` of ``flat``, in one pass on its device: the float64 sum, absolute sum and
    sum of squares of the finite elements, and [chunks, 3] int64 counts of NaN, +inf and -inf
    (on the CPU). Blocks of chunks are converted to float64 at a time; the last may be
    ragged."""
    n = flat.numel()
    n_chunks = max(1, -(-n // CHUNK))
    out = torch.empty(n_chunks, 6, dtype=torch.float64, device=flat.device)
    for first in range(0, n_chunks, _SUM_BLOCK):
        last = min(n_chunks, first + _SUM_BLOCK)
        block = flat[first * CHUNK : last * CHUNK].to(torch.float64)
        full = (block.numel() // CHUNK) * CHUNK
        parts = [_stats(block[:full].view(-1, CHUNK))] if full else []
        if block.numel() > full or not full:  # the ragged last chunk (or an empty tensor)
            parts.append(_stats(block[full:].view(1, -1)))
        out[first:last] = torch.cat(parts)
    cols = out.t().contiguous()  # each row with stride 1
    return cols[0], cols[1], cols[2], cols[3:].t().to(torch.int64).cpu()


def _stats(rows: torch.Tensor) -> torch.Tensor:
    # the counts stay exact in float64 (a chunk holds 2**16 elements)
    finite = torch.where(torch.isfinite(rows), rows, torch.zeros_like(rows))
    return torch.stack([finite.sum(1), finite.abs().sum(1), (finite * finite).sum(1),
                        torch.isnan(rows).sum(1), (rows == math.inf).sum(1),
                        (rows == -math.inf).sum(1)], 1)


def chunk_sums(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The float64 sums, absolute sums and sums of squares of ``chunk_stats``."""
    sums, abs_sums, sq_sums, _ = chunk_stats(flat)
    return sums, abs_sums, sq_sums


def fingerprint(t: torch.Tensor, key: str) -> Fingerprint:
    """The fingerprint of ``t``; ``key`` fixes the sample positions."""
    flat = t.detach().contiguous().reshape(-1)
    positions = sample_positions(flat.numel(), key)
    sums, abs_sums, sq_sums, specials = chunk_stats(flat)
    return Fingerprint(tuple(t.shape), t.dtype, positions,
                       flat[positions.to(flat.device)].cpu(), sums.cpu(), abs_sums.cpu(),
                       sq_sums.cpu(), specials)


_PARTS = ("positions", "values", "sums", "abs_sums", "sq_sums", "specials")


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
                # a fresh standard-strided copy: safetensors refuses tensors sharing storage
                tensors[label] = t.clone(memory_format=torch.contiguous_format)
                info["kind"] = "whole"
            else:
                fp = fingerprint(t, f"{key}/{label}")
                for part in _PARTS:
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
                parts = {p: tensors[f"{label}/{p}"] for p in _PARTS}
                out[name] = Fingerprint(shape=tuple(info["shape"]),
                                        dtype=getattr(torch, info["dtype"]),
                                        total_sq=_total_sq(tensors, meta, name), **parts)
        except KeyError as exc:
            raise GoldenError(f"golden {where} lacks tensor {exc.args[0]!r} that its manifest "
                              "entry names: regenerate it with `harness golden generate "
                              "--accept`") from exc
    return out


def _total_sq(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Mapping[str, Any]],
              name: str) -> float:
    """Sum of squares of the finite elements of output ``name`` over every rank in a file."""
    total = 0.0
    for label, info in meta.items():
        if label.split("/", 1)[1] != name:
            continue
        if info["kind"] == "whole":
            t = tensors[label].to(torch.float64)
            total += float(torch.where(torch.isfinite(t), t * t, torch.zeros_like(t)).sum())
        else:
            total += float(tensors[f"{label}/sq_sums"].sum())
    return total


# ------------------------------------------------------------------------------- checking
@dataclass
class OutputCheck:
    """One output of one rank against its golden."""

    kind: str  # "whole" or "fingerprint"
    metrics: Metrics
    tolerance: compare.Tolerance  # what the metrics were judged with
    sums_error: str = ""  # a fingerprint chunk sum outside its bound, else ""

    def to_dict(self) -> dict[str, Any]:
        """Mergeable JSON form (gathered across ranks)."""
        return {"kind": self.kind, "metrics": self.metrics.to_dict(),
                "tolerance": self.tolerance.to_dict(), "sums_error": self.sums_error}


#: what a fingerprint sample is held to when the tolerance has no elementwise part: nothing
#: but agreement on NaN and infinities (the norms are checked through the chunk sums)
_SPECIALS_ONLY = compare.rel_l2(math.inf)


def check_output(actual: torch.Tensor, stored: Stored, tol: compare.Tolerance, rank: int = 0,
                 magnitude: torch.Tensor | None = None) -> OutputCheck:
    """Measure ``actual`` (any device) against a stored golden under ``tol``; ``magnitude``:
    each element's magnitude for an allclose ``magnitude_rtol`` (made from the inputs, so
    never stored)."""
    if isinstance(stored, torch.Tensor):
        return OutputCheck("whole", compare.measure(actual, stored, tol, rank=rank,
                                                    magnitude=magnitude), tol)
    sample_tol = tol.elementwise or _SPECIALS_ONLY
    # a golden may be wider than the output (a float32 second reference of a bf16 output)
    if tuple(actual.shape) != stored.shape:
        m = Metrics(numel=max(stored.numel, 1), n_mismatch=max(stored.numel, 1),
                    shape=list(actual.shape),
                    shape_error=f"shape {tuple(actual.shape)} != golden {stored.shape}")
        return OutputCheck("fingerprint", m, sample_tol)
    flat = actual.detach().contiguous().reshape(-1)
    positions = stored.positions.to(flat.device)
    scale = None if magnitude is None else magnitude.reshape(-1).to(flat.device)
    m = compare.measure(flat[positions], stored.values, sample_tol, rank=rank,
                        magnitude=None if scale is None else scale[positions])
    if m.first_bad_index is not None:  # report the element's place in the output, not the sample's
        m.first_bad_index = int(stored.positions[m.first_bad_index])
    m.shape = list(actual.shape)
    sums, abs_sums, _, specials = chunk_stats(flat)
    magnitude_sums = None if scale is None else chunk_stats(scale.abs())[1].cpu()
    return OutputCheck("fingerprint", m, sample_tol,
                       _check_sums(stored, sums.cpu(), abs_sums.cpu(), specials, tol,
                                   actual.dtype, magnitude_sums))


def check_fingerprint(new: Fingerprint, old: Fingerprint, tol: compare.Tolerance,
                      magnitude: torch.Tensor | None = None) -> OutputCheck:
    """A fingerprint against another (a re-derived golden against the stored one): samples
    against samples, chunk sums against chunk sums; ``magnitude`` as in ``check_output``."""
    sample_tol = tol.elementwise or _SPECIALS_ONLY
    if (new.shape, new.dtype) != (old.shape, old.dtype) or not same_bits_tensor(new.positions,
                                                                           old.positions):
        m = Metrics(numel=1, n_mismatch=1, shape=list(new.shape),
                    shape_error=f"{new.shape} {new.dtype} != {old.shape} {old.dtype}")
        return OutputCheck("fingerprint", m, sample_tol)
    scale = None if magnitude is None else magnitude.detach().reshape(-1).cpu()
    m = compare.measure(new.values, old.values, sample_tol,
                        magnitude=None if scale is None else scale[new.positions])
    magnitude_sums = None if scale is None else chunk_stats(scale.abs())[1]
    return OutputCheck("fingerprint", m, sample_tol,
                       _check_sums(old, new.sums, new.abs_sums, new.specials, tol, new.dtype,
                                   magnitude_sums))


def _check_sums(stored: Fingerprint, sums: torch.Tensor, abs_sums: torch.Tensor,
                specials: torch.Tensor, tol: compare.Tolerance, dtype: torch.dtype,
                magnitude_sums: torch.Tensor | None = None) -> str:
    if sums.shape != stored.sums.shape:
        return f"{sums.numel()} chunk sums, golden has {stored.sums.numel()}"
    counts = torch.full_like(sums, float(CHUNK))
    counts[-1] = stored.numel - CHUNK * (sums.numel() - 1) if stored.numel else 0
    # NaN and infinities must sit in the same chunks in the same numbers (the samples check
    # their places); everything finite beside them is checked through the sums
    special_bad = (specials != stored.specials).any(1)
    finite = counts - stored.specials.sum(1).to(counts.dtype)
    total_sq = stored.total_sq if stored.total_sq is not None else float(stored.sq_sums.sum())
    bound = _sum_bound(tol, finite, stored.abs_sums, total_sq, dtype, stored.dtype,
                       magnitude_sums)
    # float64 rounding of two pairwise (cascade or tree) summations of n terms
    slack = 2 * (finite.clamp(min=1).log2() + 1) * _EPS64 * (abs_sums + stored.abs_sums)
    bad = special_bad | ~((sums - stored.sums).abs() <= bound + slack)
    if not bool(bad.any()):
        return ""
    c = int(bad.nonzero()[0])
    what = (f"NaN/+inf/-inf counts {specials[c].tolist()} vs golden {stored.specials[c].tolist()}"
            if bool(special_bad[c]) else
            f"sum {float(sums[c]):.9g} vs golden {float(stored.sums[c]):.9g}")
    return (f"{int(bad.sum())}/{sums.numel()} chunk sums outside what {tol.describe()} allows; "
            f"first chunk {c} (elements {c * CHUNK}..): {what}")


def _sum_bound(tol: compare.Tolerance, counts: torch.Tensor, golden_abs: torch.Tensor,
               golden_sq: float, dtype: torch.dtype, golden_dtype: torch.dtype,
               magnitude_sums: torch.Tensor | None = None) -> torch.Tensor:
    """The largest |sum(actual) - sum(golden)| over each chunk's ``counts`` finite elements that
    ``tol`` permits, for an output of ``dtype``.

    exact: 0, or one rounding to ``dtype`` of a wider golden (compare rounds it so). allclose:
    the sum of atol + rtol*|g| (+ magnitude_rtol times the chunk's magnitudes). ulp(k): k ulps
    of ``dtype`` of each |g| (ulp(g) <= eps*|g|, plus the subnormal step). rel_l2(r): the
    whole output's |a-g| <= r|g|, and a chunk's sum of differences is at most sqrt(n) times
    their norm (Cauchy-Schwarz). cos_diff(c):
    |a-g|^2 <= c(|a|^2+|g|^2) with |a| <= |g|+|a-g| gives |a-g| <= |g|(c+sqrt(c^2+2c(1-c)))/(1-c).
    The norms are over every rank (``golden_sq``), as the merged metrics are. all_of: every part
    must hold, so the tightest. A mismatch budget lets elements be arbitrarily far off: inf.
    """
    inf = torch.full_like(counts, math.inf)
    floating = dtype.is_floating_point
    kind = tol.kind
    if kind in ("exact", "ulp"):
        if not floating or (kind == "exact" and dtype == golden_dtype):
            return torch.zeros_like(counts)
        info = torch.finfo(dtype)
        ulps = tol.ulps if kind == "ulp" else 1
        return ulps * (info.eps * golden_abs + counts * info.smallest_normal * info.eps)
    if kind == "allclose":
        if tol.max_mismatch_frac > 0:
            return inf
        bound = counts * tol.atol + tol.rtol * golden_abs
        if tol.magnitude_rtol and magnitude_sums is not None:
            bound = bound + tol.magnitude_rtol * magnitude_sums
        return bound
    if kind == "rel_l2":
        return counts.sqrt() * tol.bound * math.sqrt(golden_sq)
    if kind == "cos_diff":
        c = tol.bound
        if c >= 1:
            return inf
        diff_norm = math.sqrt(golden_sq) * (c + math.sqrt(c * c + 2 * c * (1 - c))) / (1 - c)
        return counts.sqrt() * diff_norm
    if kind == "all_of":
        bounds = [_sum_bound(p, counts, golden_abs, golden_sq, dtype, golden_dtype,
                             magnitude_sums) for p in tol.parts]
        return torch.stack(bounds).min(0).values if bounds else inf
    return inf


def same_bits(a: Stored, b: Stored) -> bool:
    """Whether two stored goldens are identical (both whole, or both fingerprints)."""
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        return False
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        return same_bits_tensor(a, b)
    assert isinstance(b, Fingerprint)
    return (a.shape == b.shape and a.dtype == b.dtype
            and all(same_bits_tensor(getattr(a, p), getattr(b, p))
                    for p in _PARTS))


# --------------------------------------------------------------------------------- store
def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _well_formed(entry: object) -> bool:
    """Whether a manifest entry has what reading its golden needs."""
    return (isinstance(entry, dict) and isinstance(entry.get("file"), str)
            and isinstance(entry.get("sha256"), str) and isinstance(entry.get("outputs"), dict))


class GoldenStore:
    """A golden directory: its manifest and files. Reads are lazy and cached."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else default_dir()
        self._manifest: dict[str, Any] | None = None
        #: the entries as read from disk: ``save_manifest`` merges what differs from them
        self._read: dict[str, Any] = {}
        self._on_disk: dict[str, Path] | None = None  # ``unlisted``'s scan, made once
        #: the last ``load``: ((entry key, rank), its result)
        self._last_load: tuple[tuple[str, int], tuple[Path, dict[str, Stored]]] | None = None

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
                                      "it from git, or delete it and rerun `harness golden "
                                      "generate`") from exc
                bad = next((k for k, e in entries.items() if not _well_formed(e)), None)
                if bad is not None:
                    raise GoldenError(f"golden manifest {path}: entry {bad!r} lacks its file, "
                                      "sha256 or outputs: restore the manifest from git, or "
                                      "delete it and rerun `harness golden generate`")
                if int(data.get("schema", 0)) > SCHEMA:
                    raise GoldenError(f"golden manifest {path} has schema v{data['schema']}, "
                                      f"newer than this harness (v{SCHEMA}): upgrade it")
                self._manifest = data
            self._read = copy.deepcopy(self._manifest["entries"])
        return self._manifest

    def entry(self, case_id: str, world_size: int) -> dict[str, Any] | None:
        """The manifest entry of a case, or None when it has no golden."""
        return self.manifest["entries"].get(entry_key(case_id, world_size))

    def lost_entry(self, case_id: str, world_size: int) -> str | None:
        """Why a case without a manifest entry still has a golden, or None: its file lies in
        the directory (the manifest was lost, or edited): a golden must not silently become
        none, which would pass every output."""
        if self.entry(case_id, world_size) is not None:
            return None
        if self._on_disk is None:
            self._on_disk = {p.stem.rsplit("-", 2)[-2] + "-" + p.stem.rsplit("-", 1)[-1]: p
                             for p in self.root.rglob("*.safetensors") if p.stem.count("-") >= 2}
        path = self._on_disk.get(_file_tag(case_id, world_size))
        if path is None:
            return None
        key = entry_key(case_id, world_size)
        return (f"golden file {path} is on disk but {self.manifest_path} has no entry {key}: "
                "the manifest lost it; restore the manifest from git, or rerun `harness golden "
                "generate` to list it again")

    def path_of(self, entry: Mapping[str, Any]) -> Path:
        return self.root / entry["file"]

    def load(self, case_id: str, world_size: int, rank: int) -> tuple[Path, dict[str, Stored]]:
        """One rank's stored outputs; GoldenError naming the file when missing or corrupt."""
        entry = self.entry(case_id, world_size)
        if entry is None:
            raise GoldenError(f"no golden for {entry_key(case_id, world_size)} in "
                              f"{self.manifest_path}: run `harness golden generate`")
        # the implementations of a case run back to back: read and verify its file once
        key = (entry_key(case_id, world_size), rank)
        if self._last_load is None or self._last_load[0] != key:
            path = self.path_of(entry)
            tensors = self.read_file(path, entry)
            self._last_load = (key, (path, decode(tensors, entry["outputs"], rank, str(path))))
        return self._last_load[1]

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
        with scratch_beside(path) as tmp:  # a name of its own: another writer has another
            save_file(dict(tensors), str(tmp), metadata={"entry": key})
            os.replace(tmp, path)
        entry = dict(entry, file=rel, sha256=file_sha256(path))
        self.manifest["entries"][key] = entry
        self._last_load = None

    def save_manifest(self) -> None:
        """Merge the entries this store changed (``write``, or edited in ``manifest``) into
        the manifest on disk and write it atomically, entries sorted so diffs stay small. The
        merge happens under an exclusive flock on the golden directory itself (no lock file to
        commit), re-reading the manifest inside it: two `harness golden generate` at once in
        one directory each add their entries, and neither's are lost nor is the file ever
        half written."""
        entries = self.manifest["entries"]
        changed = {k: e for k, e in entries.items() if self._read.get(k) != e}
        removed = self._read.keys() - entries.keys()
        if not changed and not removed and self.manifest_path.exists():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        lock = os.open(self.root, os.O_RDONLY)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._manifest = None  # what other writers saved since this store read it
            data = dict(self.manifest)
            merged = {**data["entries"], **changed}
            data["entries"] = dict(sorted((k, e) for k, e in merged.items() if k not in removed))
            data["schema"] = SCHEMA
            with scratch_beside(self.manifest_path) as tmp:
                with open(tmp, "w", encoding="utf-8") as fh:
                    fh.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())  # whole on disk before it takes the name
                os.replace(tmp, self.manifest_path)
            self._manifest = data
            self._read = copy.deepcopy(data["entries"])
        finally:
            os.close(lock)  # and the lock with it


class GoldenShelf:
    """The golden stores of a run: each op's goldens in its suite's directory (a suite from
    another repository keeps its own there), or every op's in one ``override`` directory
    (``--golden-dir`` or ``$HARNESS_GOLDEN_DIR``)."""

    def __init__(self, dir_of: Callable[[str], Path | None] = lambda op: None,
                 override: Path | str | None = None) -> None:
        env = os.environ.get(ENV_VAR)
        self.override = Path(override) if override else Path(env).expanduser() if env else None
        self.dir_of = dir_of
        self._stores: dict[Path | None, GoldenStore] = {}

    def for_op(self, op: str) -> GoldenStore:
        """The store holding ``op``'s goldens (one per directory, made once)."""
        root = self.override or self.dir_of(op)
        key = Path(root).resolve() if root is not None else None
        if key not in self._stores:
            self._stores[key] = GoldenStore(root)
        return self._stores[key]

    @property
    def stores(self) -> list[GoldenStore]:
        """The stores used so far."""
        return list(self._stores.values())
