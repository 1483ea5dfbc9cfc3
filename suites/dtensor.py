"""DTensor redistribution (torch.distributed.tensor) on 1-D, 2-D and 3-D device meshes.

Every rank starts from its local tensor of a global ``x`` under the source placements (made
by the reference ``local_shard``; a Partial source's locals then differ by rank,
``uneven_partials``), the implementation redistributes it, and the check is
twofold: this rank's new local tensor against ``local_shard`` under the target placements,
and the full tensor gathered back from the result against ``x`` (the round trip). Values are
multiples of 8 with small magnitudes, so Partial(sum) locals (x / n) and every reduction are
exact: the checks are bitwise. Cases with ``values=random`` hold float32 values of full
mantissa instead, whose Partial(sum) reductions round: checked within the rounding of the
mesh's sums (a reduction through bf16, a compressed all-reduce, fails there).

A case runs at the world size its mesh needs. Placements are written ``R``, ``S<d>``,
``P[sum|avg|min|max]`` and ``SS<d>sf<k>`` (_StridedShard), one per mesh dim: ``S0,R``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from itertools import combinations, product
from typing import Any

import torch

from harness.api import (
    OpSpec,
    Work,
    allclose,
    dtype_from_name,
    exact,
    generate,
    plant_specials,
    seed_from,
)
from reference_kernels import dtensor as ref
from suites._grid import unique

FAMILY = "dtensor"


def mesh_shape(params: Mapping[str, Any]) -> tuple[int, ...]:
    return tuple(int(n) for n in str(params["mesh"]).split("x"))


def global_tensor(params: Mapping[str, Any]) -> torch.Tensor:
    """x: multiples of 8 in [-128, 128], so x / n (n <= 8) and sums over ranks are exact; with
    ``values=random``, uniform in [-1, 1); with ``values=special``, -0.0, subnormals, +-inf
    and NaN among them (a redistribution that moves data moves bits: a gather done as a sum
    of zero-padded buffers turns -0.0 into 0.0)."""
    seed = seed_from("dtensor", *map(str, params["shape"]), params["dtype"])
    if params.get("values") == "random":
        return generate(tuple(params["shape"]), dtype_from_name(params["dtype"]),
                        seed=seed + 1, dist="uniform", low=-1.0, high=1.0)
    ints = generate(tuple(params["shape"]), torch.int32, seed=seed, dist="int", low=-16,
                    high=16)
    x = (ints * 8).to(dtype_from_name(params["dtype"]))
    return plant_specials(x, every=3) if params.get("values") == "special" else x


def redistribute_inputs(params: Mapping[str, Any], rank: int, world_size: int
                        ) -> dict[str, Any]:
    shape = mesh_shape(params)
    x = global_tensor(params)
    coord = ref.coordinate(rank, shape)
    local = uneven_partials(ref.local_shard(x, shape, params["src"], coord), shape,
                            params["src"], coord,
                            unit=2.0**-3 if params.get("values") == "random" else 8.0)
    return {"local": local, "global_shape": tuple(x.shape), "mesh_shape": shape,
            "src": params["src"], "dst": params["dst"]}


def uneven_partials(local: torch.Tensor, shape: Sequence[int], placements: str,
                    coord: Sequence[int], unit: float = 8.0) -> torch.Tensor:
    """``local`` with every Partial mesh dim's locals made to differ by rank, still reducing
    to the same global value: for sum and avg, plus u * s * (2c - (n - 1)) (s in {-1, 0, 1}
    by element; the terms cancel over the n coordinates c); for max, minus u * ((c + i) % n),
    which is 0 on one coordinate per element i (plus, for min), u = ``unit``. Identical
    locals (x / n, or x) would let a kernel pass that reduces nothing, one that multiplies
    its own local by n, or one that swaps min and max. Multiples of 8 below 64: every sum
    stays exact (random values: within their rounding)."""
    t = local.clone()
    index = torch.arange(t.numel()).reshape(t.shape)
    for k, (n, p, c) in enumerate(zip(shape, ref.parse(placements), coord, strict=True)):
        if p.kind != "P" or n == 1:
            continue
        if p.op in ("sum", "avg"):
            t += (unit * ((index + k) % 3 - 1) * (2 * c - (n - 1))).to(t.dtype)
        else:
            step = (unit * ((c + index + k) % n)).to(t.dtype)
            t += -step if p.op == "max" else step
    return t


def redistribute_expected(params: Mapping[str, Any], rank: int, world_size: int
                          ) -> dict[str, torch.Tensor]:
    shape = mesh_shape(params)
    x = global_tensor(params)
    return {"local": ref.local_shard(x, shape, params["dst"], ref.coordinate(rank, shape)),
            "full": x}


# ---------------------------------------------------------------- implementations
_MESHES: dict[tuple[str, tuple[int, ...]], Any] = {}


def device_mesh(world: Any, shape: tuple[int, ...]) -> Any:
    """The DeviceMesh of this shape over all ranks (made once: creating one is collective)."""
    from torch.distributed.device_mesh import init_device_mesh

    world.group  # noqa: B018  (makes sure the default process group exists)
    key = (world.device.type, shape)
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh(world.device.type, shape)
    return _MESHES[key]


def torch_placements(placements: Sequence[ref.Placement] | str, *, strided_as_plain=False):
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if isinstance(placements, str):
        placements = ref.parse(placements)
    out = []
    for p in placements:
        if p.kind == "R":
            out.append(Replicate())
        elif p.kind == "S" or (p.kind == "SS" and strided_as_plain):
            out.append(Shard(p.dim))
        elif p.kind == "SS":
            out.append(_StridedShard(p.dim, split_factor=p.split_factor))
        else:
            out.append(Partial(p.op))
    return out


def _source(world: Any, local: torch.Tensor, global_shape: Sequence[int],
            mesh_shape: tuple[int, ...], src: str, *, strided_as_plain: bool = False) -> Any:
    from torch.distributed.tensor import DTensor

    mesh = device_mesh(world, mesh_shape)
    stride = tuple(math.prod(global_shape[d + 1:]) for d in range(len(global_shape)))
    return DTensor.from_local(local, mesh, torch_placements(src,
                              strided_as_plain=strided_as_plain),
                              run_check=False, shape=torch.Size(global_shape), stride=stride)


def _redistribute(world: Any, local, global_shape, mesh_shape, src, dst, *, graph: bool,
                  strided_as_plain: bool = False):
    from torch.distributed.tensor._redistribute import (
        _gen_transform_infos,
        use_min_cost_redistribution_plan,
    )

    source = _source(world, local, global_shape, mesh_shape, src,
                     strided_as_plain=strided_as_plain)
    mesh = device_mesh(world, mesh_shape)
    # the planner caches plans by spec: clear it so each planner makes its own
    _gen_transform_infos.cache_clear()
    target = torch_placements(dst)
    with use_min_cost_redistribution_plan(graph):
        if any(t.is_partial() and t != p for t, p in zip(target, source.placements,
                                                         strict=True)):
            result = _to_partial(source, mesh, target)
        else:
            result = source.redistribute(mesh, target)
        full = result.full_tensor()
    _gen_transform_infos.cache_clear()
    # torch 2.11's full_tensor() of a Shard(1) gathered unevenly is a padded view (strides
    # (8, 1) for 5 columns): the outputs are dense, as a consumer reading rows expects
    return result.to_local().contiguous(), full.contiguous()


def _to_partial(source: Any, mesh: Any, target: list) -> Any:
    """Replicate -> Partial is refused by the public ``redistribute`` ("for internal use
    only"); torch's own tests reach it through the planner directly, as here."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._redistribute import redistribute_local_tensor

    spec = DTensorSpec(mesh, tuple(target), tensor_meta=source._spec.tensor_meta)
    local = redistribute_local_tensor(source._local_tensor, source._spec, spec)
    return DTensor(local, spec, requires_grad=False)


def redistribute_torch(world, local, global_shape, mesh_shape, src, dst):
    """DTensor.redistribute with the default (greedy) planner."""
    return _redistribute(world, local, global_shape, mesh_shape, src, dst, graph=False)


def redistribute_torch_graph(world, local, global_shape, mesh_shape, src, dst):
    """DTensor.redistribute with the min-cost graph (Dijkstra) planner."""
    return _redistribute(world, local, global_shape, mesh_shape, src, dst, graph=True)


def redistribute_floor_chunks(world, local, global_shape, mesh_shape, src, dst):
    """Bug: shards sized with floor(L / n) (the last rank takes the remainder) instead of
    torch.chunk's ceil. Right whenever every sharded length divides evenly."""
    full = _source(world, local, global_shape, mesh_shape, src).full_tensor()
    t = full
    coord = ref.coordinate(world.rank, mesh_shape)
    for n, p, i in zip(mesh_shape, ref.parse(dst), coord, strict=True):
        if p.kind == "P" and p.op == "sum":
            t = t / n
        elif p.kind == "S":
            size = t.shape[p.dim] // n
            stop = t.shape[p.dim] if i == n - 1 else (i + 1) * size
            t = t.narrow(p.dim, i * size, stop - i * size)
    return t.contiguous(), full


# the moves each control makes with its own code (its bug), by mesh shape, placements and
# dtype; outside them it hands the move to torch's greedy planner (``_torch_planner_outside``)
def _gathers_as_sum(mesh: tuple[int, ...], src: str, dst: str, dtype: torch.dtype) -> bool:
    return len(mesh) == 1 and ref.parse(src)[0].kind == "S" and dst == "R"


def _divides_to_partial(mesh: tuple[int, ...], src: str, dst: str, dtype: torch.dtype
                        ) -> bool:
    return len(mesh) == 1 and src == "R" and dst.startswith("P")


def _reduces_in_bf16(mesh: tuple[int, ...], src: str, dst: str, dtype: torch.dtype) -> bool:
    return dtype == torch.float32 and any(p.kind == "P" for p in ref.parse(src))


def _takes_strided_as_plain(mesh: tuple[int, ...], src: str, dst: str, dtype: torch.dtype
                            ) -> bool:
    return any(p.kind == "SS" for p in ref.parse(src))


def redistribute_gather_as_sum(world, local, global_shape, mesh_shape, src, dst):
    """Bug: Shard -> Replicate on a 1-D mesh done as a SUM all-reduce of zero-padded buffers
    (each rank's shard written into zeros of the global shape): data moved by arithmetic,
    right on every value but a negative zero (-0.0 + 0.0 is 0.0)."""
    import torch.distributed as dist

    if not _gathers_as_sum(mesh_shape, src, dst, local.dtype):
        return redistribute_torch(world, local, global_shape, mesh_shape, src, dst)
    [p] = ref.parse(src)
    length, n = global_shape[p.dim], mesh_shape[0]
    start = min(length, world.rank * -(-length // n))  # torch.chunk's ceil-sized shards
    full = torch.zeros(global_shape, dtype=local.dtype, device=local.device)
    full.narrow(p.dim, start, local.shape[p.dim]).copy_(local)
    if n > 1:
        dist.all_reduce(full, group=world.group)
    return full.clone(), full


def redistribute_to_partial_divided(world, local, global_shape, mesh_shape, src, dst):
    """Bug: Replicate -> Partial on a 1-D mesh as x / n whatever the op (right for sum; avg,
    min and max keep x on every rank)."""
    if _divides_to_partial(mesh_shape, src, dst, local.dtype):
        return local / mesh_shape[0], local.clone()
    return redistribute_torch(world, local, global_shape, mesh_shape, src, dst)


def redistribute_partial_in_bf16(world, local, global_shape, mesh_shape, src, dst):
    """Bug: a float32 Partial source reduced through bf16 (a compressed all-reduce): exact on
    the integer-valued cases (multiples of 8 below 2048), off on random values."""
    if _reduces_in_bf16(mesh_shape, src, dst, local.dtype):
        res, full = _redistribute(world, local.to(torch.bfloat16), global_shape, mesh_shape,
                                  src, dst, graph=False)
        return res.float(), full.float()
    return _redistribute(world, local, global_shape, mesh_shape, src, dst, graph=False)


def redistribute_strided_as_plain(world, local, global_shape, mesh_shape, src, dst):
    """Bug: a _StridedShard source is taken for a plain Shard of the same dim, so its pieces
    are stitched back in the wrong order."""
    return _redistribute(world, local, global_shape, mesh_shape, src, dst, graph=False,
                         strided_as_plain=True)


def _torch_planner_outside(own: Callable[[tuple[int, ...], str, str, torch.dtype], bool],
                           needs: str) -> Callable[..., str | None]:
    """A control's ``skip_reason``: on a case outside ``own`` (the moves its own code makes)
    it hands the move to torch's greedy planner, so it is the ``torch`` implementation there,
    which the smoke run checks; its bug cannot show, and running it would only run torch."""
    def skip_reason(params: Mapping[str, Any], world_size: int, device: Any) -> str | None:
        if own(mesh_shape(params), params["src"], params["dst"],
               dtype_from_name(params["dtype"])):
            return None
        return f"torch's planner moves this case; this control's bug needs {needs}"
    return skip_reason


redistribute_gather_as_sum.skip_reason = _torch_planner_outside(  # type: ignore[attr-defined]
    _gathers_as_sum, "a Shard -> Replicate move on a 1-D mesh")
redistribute_to_partial_divided.skip_reason = _torch_planner_outside(  # type: ignore[attr-defined]
    _divides_to_partial, "a Replicate -> Partial move on a 1-D mesh")
redistribute_partial_in_bf16.skip_reason = _torch_planner_outside(  # type: ignore[attr-defined]
    _reduces_in_bf16, "a float32 Partial source")
redistribute_strided_as_plain.skip_reason = _torch_planner_outside(  # type: ignore[attr-defined]
    _takes_strided_as_plain, "a _StridedShard source")


def gloo_on_cuda(params: Mapping[str, Any], world_size: int, device: Any, *,
                 backend: str = "") -> str | None:
    """Why DTensor cannot run on CUDA tensors over gloo (ranks sharing a GPU). gloo's
    collectives under DTensor's functional all-gather crashed every rank with SIGSEGV there
    (an H200, torch 2.11: S0->R, R->S0, P->S0 and S0->S1 at 4 ranks; P->R, an allreduce,
    passed), and torch's maintainers call most collectives on CUDA tensors unsupported by
    gloo (pytorch/pytorch#132709)."""
    if torch.device(device).type == "cuda" and backend == "gloo":
        return ("DTensor on CUDA tensors needs nccl, one GPU per rank: over gloo (ranks "
                "sharing a GPU) its all-gather crashes the ranks")
    return None


#: the first torch whose planner takes a _StridedShard whose split factor is no product of
#: mesh sizes (sf=2 on a 1-D mesh): pytorch/pytorch#178735, merged after 2.11 was cut
STRIDED_SHARD_TORCH = (2, 12)


def strided_shard_refusal(params: Mapping[str, Any], torch_version: str = torch.__version__
                          ) -> str | None:
    """Why this torch cannot redistribute the case's _StridedShard, or None: one whose split
    factor is no product of mesh sizes (torch's own example: sf=2 on a 1-D mesh). torch
    2.11 raised "use_strided_shard_as_shard_order is True, but placements ... unable to be
    interpreted" for every such case on an H200 (torch 2.13 passes them)."""
    sizes = mesh_shape(params)
    products = {math.prod(c) for r in range(1, len(sizes) + 1)
                for c in combinations(sizes, r)}
    strided = [p for p in ref.parse(params["src"]) + ref.parse(params["dst"]) if p.kind == "SS"]
    if all(p.split_factor in products for p in strided):
        return None
    major, minor = (int(x) for x in torch_version.split("+")[0].split(".")[:2])
    if (major, minor) >= STRIDED_SHARD_TORCH:
        return None
    return (f"torch {torch_version} cannot redistribute a _StridedShard whose split factor is "
            f"no product of mesh sizes (pytorch/pytorch#178735, in torch "
            f"{'.'.join(map(str, STRIDED_SHARD_TORCH))}+)")


def dtensor_refusal(params: Mapping[str, Any], world_size: int, device: Any, *,
                    backend: str = "") -> str | None:
    """The op's ``requires``: gloo on CUDA, then a torch too old for the case."""
    return (gloo_on_cuda(params, world_size, device, backend=backend)
            or strided_shard_refusal(params))


# ---------------------------------------------------------------- grids
def _case(mesh: str, src: str, dst: str, shape: Sequence[int], dtype: str = "f32",
          values: str | None = None) -> dict:
    case = {"mesh": mesh, "src": src, "dst": dst, "shape": tuple(shape), "dtype": dtype}
    return {**case, "values": values} if values else case


def tolerance(params: Mapping[str, Any], world_size: int) -> Any:
    """Bitwise; for random values, the rounding of sums over the mesh: each of W partials of
    magnitude below 1 + u (W - 1) adds one float32 rounding of a sum up to W of them."""
    if params.get("values") != "random":
        return exact()
    eps = 2.0**-24
    return allclose(rtol=world_size * eps, atol=world_size**2 * eps)


#: Partial(sum) sources of random values: reductions that round
RANDOM = [_case("4", "P", "R", (13, 5), values="random"),
          _case("2x2", "P,P", "S0,R", (9, 7), values="random")]
#: Replicate -> Partial of every op: x / n for sum, x itself for avg, min and max
TO_PARTIAL = [_case("4", "R", f"P{op}", (9, 5)) for op in ("avg", "min", "max")]
#: Partial avg, max and min on one dim of a 2-D mesh: reduced over that dim's ranks with
#: its own op (not the world's ranks, not a sum); and a _StridedShard destination
PARTIAL_2D = [_case("2x2", "Pavg,R", "R,R", (9, 7)), _case("2x2", "R,Pavg", "R,S0", (9, 7)),
              _case("2x2", "Pmax,S0", "R,R", (9, 7)), _case("2x2", "R,Pmin", "S1,R", (9, 7)),
              _case("2x2", "R,R", "SS0sf2,S0", (8, 3))]
#: moves of special values (no Partial source: a sum of them is no move), on a 2-D mesh too
#: (a gather done as a sum of zero-filled buffers turns -0.0 into +0.0)
SPECIAL = [_case("4", s, d, (13, 5), values="special")
           for s, d in (("S0", "R"), ("R", "S0"), ("S0", "S1"), ("S1", "S0"))]
SPECIAL += [_case("2x2", "S0,S1", "R,R", (9, 7), values="special")]
#: Partial(sum) sources on one mesh dim to a Shard, rounding (a float32 partial sent as bf16);
#: Replicate to a Partial on a mesh whose dims differ (x / 2 on the dim of 2, not x / 4)
RANDOM += [_case("4", "P", "S1", (13, 5), values="random")]
TO_PARTIAL += [_case("4x2", "R,R", "R,P", (9, 7))]


def _one_d(n: int, lengths: Sequence[int] | None = None) -> list[dict]:
    """torch's 1-D cases: S<->R, P->R, P->S, S0<->S1, R->P, the no-op, every partial op,
    strided-shard sources; lengths n*k, n*k+1, n*k+2 and L < n by default."""
    mesh = str(n)
    lengths = sorted(set(lengths or (n * 3, n * 3 + 1, n * 3 + 2, max(1, n - 1))))
    cases = []
    for length in lengths:
        shape = (length, 5)
        cases += [_case(mesh, "S0", "R", shape), _case(mesh, "R", "S0", shape),
                  _case(mesh, "P", "R", shape), _case(mesh, "P", "S0", shape),
                  _case(mesh, "S0", "S1", shape), _case(mesh, "S1", "S0", (5, length)),
                  _case(mesh, "R", "P", shape), _case(mesh, "S0", "S0", shape)]
    shape = (n * 2 + 1, 3)
    cases += [_case(mesh, f"P{op}", dst, shape) for op in ("avg", "min", "max")
              for dst in ("R", "S0")]
    cases += [_case(mesh, "SS0sf2", dst, (n * 4 + 2, 3)) for dst in ("R", "S0", "S1")]
    cases += [_case(mesh, "S0", "R", (n * 3 + 1, 5), "bf16")]
    return cases


def _two_d_exhaustive(mesh: str, shape: Sequence[int]) -> list[dict]:
    """{R, S0, S1, P}^2 -> {R, S0, S1}^2."""
    src = [",".join(p) for p in product(("R", "S0", "S1", "P"), repeat=2)]
    dst = [",".join(p) for p in product(("R", "S0", "S1"), repeat=2)]
    return [_case(mesh, s, d, shape) for s in src for d in dst]


def _special() -> list[dict]:
    """Nested sharding, the 3-D mesh, strided-shard sources on 2-D meshes, uneven shapes."""
    return [
        _case("2x2", "S0,S0", "R,S0", (9, 4)), _case("4x2", "S0,S0", "R,S0", (17, 3)),
        _case("2x4", "S0,S0", "R,S0", (7, 5)),                    # L < product of the mesh
        _case("2x2", "SS0sf2,S0", "R,R", (8, 3)), _case("2x2", "SS0sf2,S0", "S0,R", (10, 3)),
        _case("4x2", "SS0sf2,S0", "R,S1", (18, 4)), _case("2x4", "SS1sf4,S1", "R,R", (3, 34)),
        _case("2x2x2", "S0,S1,R", "R,R,S0", (9, 7)), _case("2x2x2", "P,S0,S1", "S1,R,S0", (8, 6)),
        _case("2x2x2", "S0,S0,S0", "R,R,R", (13, 2)), _case("2x2x2", "R,P,S0", "S0,S1,R", (5, 9)),
        _case("2x2x2", "SS0sf2,S0,R", "R,S1,S0", (16, 4)),
    ]


def _smoke() -> list[dict]:
    # at 8 ranks one length: 25 = 8 * 3 + 1 chunks 4 ways uneven and leaves the last rank
    # empty (L < n is the 4-rank mesh's 3); _StridedShard and bf16 at 8 ranks on the 2-D and
    # 3-D meshes below only: the 8-rank mesh is the smoke tier's costliest
    eight = [c for c in _one_d(8, [25]) if not c["src"].startswith("SS") and c["dtype"] == "f32"]
    cases = _one_d(1, [3]) + _one_d(4, [13, 3]) + eight
    # a spread of the 144 moves (16 sources x 9 targets) per mesh: 17 is prime to both, so
    # every 17th takes 9 sources and every target; the two 8-rank meshes (the smoke tier's
    # costliest: 8 ranks on 2 cores) split one such spread between them
    for mesh, shape, spread in (("2x2", (9, 7), slice(None, None, 17)),
                                ("4x2", (9, 7), slice(None, None, 34)),
                                ("2x4", (9, 7), slice(17, None, 34))):
        cases += _two_d_exhaustive(mesh, shape)[spread]
    return unique(cases + _special() + RANDOM + SPECIAL + TO_PARTIAL + PARTIAL_2D)


def _nightly() -> list[dict]:
    cases = _one_d(1) + _one_d(4) + _one_d(8)
    for mesh, shape in (("2x2", (9, 7)), ("4x2", (9, 7)), ("2x4", (9, 7))):
        cases += _two_d_exhaustive(mesh, shape)
    big = (1024 * 8 + 3, 1031)
    cases += [_case("8", s, d, big) for s, d in (("S0", "R"), ("P", "S1"), ("R", "S0"))]
    cases += [_case("4x2", s, d, big) for s, d in (("S0,R", "R,R"), ("P,R", "S1,S0"),
                                                   ("R,R", "S0,S1"))]
    cases += [_case("8", "P", "S1", big, values="random"),
              _case("4x2", "P,P", "R,S0", big, values="random")]
    return unique(cases + _special() + RANDOM + SPECIAL + TO_PARTIAL + PARTIAL_2D)


def _work(params: Mapping[str, Any], world_size: int) -> Work:
    item = dtype_from_name(params["dtype"]).itemsize
    return Work(bytes=math.prod(params["shape"]) * item)


REDISTRIBUTE = OpSpec(
    name="dtensor.redistribute", family=FAMILY, reference=ref.local_shard,
    description="DTensor.redistribute(src -> dst placements): every rank's local tensor and "
                "the gathered full tensor, bitwise.",
    make_inputs=redistribute_inputs, expected=redistribute_expected,
    tolerance=tolerance, work=_work, outputs=("local", "full"),
    grid={"smoke": _smoke(), "nightly": _nightly()},
    implementations={"torch": redistribute_torch, "torch-graph": redistribute_torch_graph},
    negative_controls={"floor_chunks": redistribute_floor_chunks,
                       "strided_as_plain": redistribute_strided_as_plain,
                       "partial_in_bf16": redistribute_partial_in_bf16,
                       "gather_as_sum": redistribute_gather_as_sum,
                       "to_partial_divided": redistribute_to_partial_divided},
    distributed=True, replicated=("full",),
    # redistributing to the placements a tensor has (or on a mesh of one) returns its input
    outputs_may_alias=True,
    world_size_of=lambda p: math.prod(mesh_shape(p)),
    requires=dtensor_refusal,
    deadline_s=120.0,
)

SPECS = [REDISTRIBUTE]
