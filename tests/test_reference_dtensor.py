"""Independent tests of reference_kernels.dtensor.

Expected values are written out by hand, computed with torch.chunk / index arithmetic in this
file, or taken from torch's own DTensor placement splitting (Shard._split_tensor and
_StridedShard._split_tensor, which need no process group); the code under test never produces
its own expectation.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from reference_kernels.dtensor import (
    PARTIAL_OPS,
    Placement,
    all_locals,
    chunk,
    coordinate,
    local_shard,
    parse,
)


def ar(*shape: int) -> torch.Tensor:
    return torch.arange(math.prod(shape)).reshape(shape)


def values(ts) -> list:
    return [t.tolist() for t in ts]


# ------------------------------------------------------------------------------------------
# parse / str

@pytest.mark.parametrize("token, expected, canonical", [
    ("R", Placement("R"), "R"),
    ("S0", Placement("S", 0), "S0"),
    ("S1", Placement("S", 1), "S1"),
    ("S12", Placement("S", 12), "S12"),
    ("P", Placement("P", op="sum"), "P"),
    ("Psum", Placement("P", op="sum"), "P"),
    ("Pavg", Placement("P", op="avg"), "Pavg"),
    ("Pmin", Placement("P", op="min"), "Pmin"),
    ("Pmax", Placement("P", op="max"), "Pmax"),
    ("SS0sf2", Placement("SS", 0, split_factor=2), "SS0sf2"),
    ("SS1sf3", Placement("SS", 1, split_factor=3), "SS1sf3"),
    ("SS10sf16", Placement("SS", 10, split_factor=16), "SS10sf16"),
])
def test_parse_and_str_round_trip(token, expected, canonical):
    (p,) = parse(token)
    assert p == expected
    assert str(p) == canonical
    assert parse(str(p)) == [p]


def test_parse_a_list():
    assert parse("S0,R,Pmax,SS1sf2,P") == [
        Placement("S", 0), Placement("R"), Placement("P", op="max"),
        Placement("SS", 1, split_factor=2), Placement("P", op="sum")]
    text = "SS0sf4,S0,Pavg,R,S2"
    assert ",".join(map(str, parse(text))) == text


@pytest.mark.parametrize("bad", ["S", "Pfoo", "X1", "SS0", "", "r", "S-1", "SSsf2", "SS0sf",
                                 "Pprod", "S0,", "S0,,R", "S0;R", "RR"])
def test_parse_rejects_bad_tokens(bad):
    with pytest.raises(ValueError):
        parse(bad)


# once a bug: the regex saw the stripped token but the kind was read from the unstripped
# one, so " S1" silently became Replicate
@pytest.mark.parametrize("text, expected", [
    ("S0, S1", [Placement("S", 0), Placement("S", 1)]),
    ("R, P", [Placement("R"), Placement("P", op="sum")]),
    ("S0, SS0sf2", [Placement("S", 0), Placement("SS", 0, split_factor=2)]),
    (" Pmax", [Placement("P", op="max")]),
])
def test_parse_accepts_whitespace_after_commas(text, expected):
    assert parse(text) == expected


def test_parse_whitespace_around_replicate_is_fine():
    assert parse(" R , R") == [Placement("R"), Placement("R")]


# ------------------------------------------------------------------------------------------
# coordinate

@pytest.mark.parametrize("mesh, expected", [
    ((2, 2), [(0, 0), (0, 1), (1, 0), (1, 1)]),
    ((4, 2), [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1)]),
    ((2, 4), [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]),
    ((2, 2, 2), [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1),
                 (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]),
    ((3,), [(0,), (1,), (2,)]),
])
def test_coordinate_row_major_literal(mesh, expected):
    assert [coordinate(r, mesh) for r in range(math.prod(mesh))] == expected


@pytest.mark.parametrize("mesh", [(2, 3, 4), (5, 1, 2), (1, 1), (7,)])
def test_coordinate_matches_itertools_product(mesh):
    assert [coordinate(r, mesh) for r in range(math.prod(mesh))] == \
        list(itertools.product(*(range(m) for m in mesh)))


@pytest.mark.parametrize("rank, mesh", [(-1, (2, 2)), (4, (2, 2)), (8, (4, 2)), (100, (2,)),
                                        (8, (2, 2, 2))])
def test_coordinate_out_of_range(rank, mesh):
    with pytest.raises(ValueError):
        coordinate(rank, mesh)


# ------------------------------------------------------------------------------------------
# literal examples

@pytest.mark.parametrize("length, n, expected", [
    (5, 4, [[0, 1], [2, 3], [4], []]),
    (6, 4, [[0, 1], [2, 3], [4, 5], []]),        # torch.chunk gives only 3 pieces here
    (10, 4, [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]),
    (2, 4, [[0], [1], [], []]),
    (0, 3, [[], [], []]),
    (8, 4, [[0, 1], [2, 3], [4, 5], [6, 7]]),
    (7, 1, [[0, 1, 2, 3, 4, 5, 6]]),
    (9, 2, [[0, 1, 2, 3, 4], [5, 6, 7, 8]]),
])
def test_shard_1d_literal(length, n, expected):
    x = torch.arange(length)
    got = values(local_shard(x, (n,), "S0", (i,)) for i in range(n))
    assert got == expected
    assert values(all_locals(x, (n,), "S0")) == expected
    assert values(chunk(x, n, i, 0) for i in range(n)) == expected


def test_shard_dim1_uneven_literal():
    x = ar(2, 5)
    assert values(all_locals(x, (2,), "S1")) == [[[0, 1, 2], [5, 6, 7]], [[3, 4], [8, 9]]]
    assert values(all_locals(x, (4,), "S1")) == [
        [[0, 1], [5, 6]], [[2, 3], [7, 8]], [[4], [9]], [[], []]]
    assert [tuple(t.shape) for t in all_locals(x, (4,), "S1")] == [(2, 2), (2, 2), (2, 1),
                                                                   (2, 0)]


@pytest.mark.parametrize("length, n, sf, expected", [
    (8, 4, 2, [[0, 4], [1, 5], [2, 6], [3, 7]]),
    (9, 4, 2, [[0, 1, 5], [2, 3, 6], [4, 7], [8]]),          # the torch docstring example
    (8, 2, 2, [[0, 1, 4, 5], [2, 3, 6, 7]]),
    (12, 2, 3, [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7, 10, 11]]),
    (6, 3, 1, [[0, 1], [2, 3], [4, 5]]),                     # sf=1 is a plain shard
    (5, 2, 2, [[0, 1, 3], [2, 4]]),
    (3, 2, 4, [[0, 1, 2], []]),
])
def test_strided_shard_literal(length, n, sf, expected):
    x = torch.arange(length)
    assert values(all_locals(x, (n,), f"SS0sf{sf}")) == expected


def test_strided_shard_dim1_literal():
    x = ar(2, 8)
    assert values(all_locals(x, (2,), "SS1sf2")) == [
        [[0, 1, 4, 5], [8, 9, 12, 13]], [[2, 3, 6, 7], [10, 11, 14, 15]]]


def test_2d_mesh_literal():
    x = ar(4, 4)
    assert values(all_locals(x, (2, 2), "S0,S1")) == [
        [[0, 1], [4, 5]], [[2, 3], [6, 7]], [[8, 9], [12, 13]], [[10, 11], [14, 15]]]
    # mesh dim 0 splits columns, mesh dim 1 splits rows
    assert values(all_locals(x, (2, 2), "S1,S0")) == [
        [[0, 1], [4, 5]], [[8, 9], [12, 13]], [[2, 3], [6, 7]], [[10, 11], [14, 15]]]
    assert values(all_locals(x, (2, 2), "R,S0")) == [
        [[0, 1, 2, 3], [4, 5, 6, 7]], [[8, 9, 10, 11], [12, 13, 14, 15]]] * 2


def test_nested_shard_uneven_literal():
    # (S0, S0) chunks the local piece again: 5 -> [0,1,2],[3,4] -> [0,1],[2] / [3],[4]
    assert values(all_locals(torch.arange(5), (2, 2), "S0,S0")) == [[0, 1], [2], [3], [4]]
    assert values(all_locals(torch.arange(6), (2, 2), "S0,S0")) == [[0, 1], [2], [3, 4], [5]]


def test_partial_literal():
    x = torch.tensor([2.0, -4.0, 6.0])
    assert values(all_locals(x, (2,), "P")) == [[1.0, -2.0, 3.0]] * 2
    assert values(all_locals(x, (2, 2), "P,P")) == [[0.5, -1.0, 1.5]] * 4
    assert values(all_locals(x, (2, 2), "R,P")) == [[1.0, -2.0, 3.0]] * 4
    for op in ("avg", "min", "max"):
        assert values(all_locals(x, (4,), f"P{op}")) == [[2.0, -4.0, 6.0]] * 4
    assert values(all_locals(torch.tensor([[8.0, 16.0], [24.0, 32.0]]), (2, 2), "S0,P")) == [
        [[4.0, 8.0]], [[4.0, 8.0]], [[12.0, 16.0]], [[12.0, 16.0]]]


def test_replicate_is_a_copy_of_x():
    x = ar(3, 4)
    for t in all_locals(x, (2, 3), "R,R"):
        assert torch.equal(t, x)
        assert t.is_contiguous()


# ------------------------------------------------------------------------------------------
# properties: shards tile x

MESHES = [(1,), (2,), (3,), (4,), (2, 2), (4, 2), (2, 4), (3, 2), (2, 2, 2)]
SHAPES = [(0, 3, 2), (1, 1, 1), (5, 3, 2), (7, 6, 3), (8, 4, 5), (3, 9, 4)]


def expected_index(length: int, n_and_i: list[tuple[int, int]]) -> torch.Tensor:
    """The indices along one tensor dim that sequential torch.chunk splits leave."""
    idx = torch.arange(length)
    for n, i in n_and_i:
        pieces = torch.chunk(idx, n) if idx.numel() else ()
        idx = pieces[i] if i < len(pieces) else idx[:0]
    return idx


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_shard_placements_tile_x(mesh):
    tokens = ["R", "S0", "S1", "S2"]
    coords = list(itertools.product(*(range(m) for m in mesh)))  # row-major rank order
    for shape in SHAPES:
        x = torch.arange(math.prod(shape), dtype=torch.float64).reshape(shape) + 1
        for combo in itertools.product(tokens, repeat=len(mesh)):
            placements = ",".join(combo)
            locals_ = all_locals(x, mesh, placements)
            assert len(locals_) == math.prod(mesh)
            # replica groups: ranks that agree on every sharded mesh dim
            sharded = [k for k, tok in enumerate(combo) if tok != "R"]
            groups: dict[tuple, torch.Tensor] = {}
            for coord, local in zip(coords, locals_, strict=True):
                per_dim = [[(mesh[k], coord[k]) for k, tok in enumerate(combo)
                            if tok == f"S{d}"] for d in range(len(shape))]
                idx = [expected_index(shape[d], per_dim[d]) for d in range(len(shape))]
                assert tuple(local.shape) == tuple(len(i) for i in idx), (placements, coord)
                assert torch.equal(local, x[torch.meshgrid(*idx, indexing="ij")])
                # place it back: the tiles of one replica group cover x exactly once
                key = tuple(coord[k] for k in range(len(mesh)) if k not in sharded)
                canvas = groups.setdefault(key, torch.zeros(shape, dtype=torch.float64))
                region = canvas[torch.meshgrid(*idx, indexing="ij")]
                assert (region == 0).all(), "two ranks of one replica group overlap"
                canvas[torch.meshgrid(*idx, indexing="ij")] = local
            assert len(groups) == math.prod(mesh[k] for k in range(len(mesh))
                                             if k not in sharded)
            for canvas in groups.values():
                assert torch.equal(canvas, x), placements


@pytest.mark.parametrize("mesh", [(2,), (4,), (2, 2), (4, 2), (2, 2, 2)], ids=str)
def test_row_shards_concatenate_to_x_in_rank_order(mesh):
    """Sharding dim 0 over every mesh dim, rank order is row order; with an evenly divisible
    length this is torch.chunk into prod(mesh) pieces."""
    world = math.prod(mesh)
    placements = ",".join(["S0"] * len(mesh))
    for length in (world, 3 * world):
        x = ar(length, 3)
        locals_ = all_locals(x, mesh, placements)
        assert torch.equal(torch.cat(locals_), x)
        assert values(locals_) == values(torch.chunk(x, world))
    for length in (world + 1, 2 * world - 1, 1):
        x = ar(length, 2)
        assert torch.equal(torch.cat(all_locals(x, mesh, placements)), x)


def test_nested_s0_s0_on_2x2_is_chunk_into_4():
    for length in (4, 8, 12, 20):
        x = torch.randn(length, 3, generator=torch.Generator().manual_seed(length))
        locals_ = all_locals(x, (2, 2), "S0,S0")
        expected = torch.chunk(x, 4)
        assert len(locals_) == 4
        for a, b in zip(locals_, expected, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_local_shard_matches_torch_chunk_on_1d_mesh(n, dim):
    for length in range(0, 12):
        shape = [2, 3, 2]
        shape[dim] = length
        x = torch.randn(shape, generator=torch.Generator().manual_seed(length))
        pieces = torch.chunk(x, n, dim) if length else ()
        for i in range(n):
            got = local_shard(x, (n,), f"S{dim}", (i,))
            if i < len(pieces):
                assert torch.equal(got, pieces[i])
            else:
                assert got.shape[dim] == 0
                assert got.shape[:dim] == x.shape[:dim]
                assert got.shape[dim + 1:] == x.shape[dim + 1:]


# ------------------------------------------------------------------------------------------
# properties: Partial

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mesh, placements, partial_dims", [
    ((2,), "P", [0]),
    ((4,), "Psum", [0]),
    ((8,), "P", [0]),
    ((2, 4), "P,S1", [0]),
    ((4, 2), "S0,P", [1]),
    ((2, 2), "P,P", [0, 1]),
    ((2, 2, 2), "R,P,S0", [1]),
    ((2, 2, 2), "P,S1,P", [0, 2]),
])
def test_partial_sum_locals_sum_back_to_x(dtype, mesh, placements, partial_dims):
    g = torch.Generator().manual_seed(0)
    x = (torch.randint(-16, 16, (4, 6), generator=g) * 8).to(dtype)
    locals_ = all_locals(x, mesh, placements)
    coords = list(itertools.product(*(range(m) for m in mesh)))
    sums: dict[tuple, torch.Tensor] = {}
    for coord, local in zip(coords, locals_, strict=True):
        assert local.dtype == dtype
        key = tuple(c for k, c in enumerate(coord) if k not in partial_dims)
        sums[key] = local.clone() if key not in sums else sums[key] + local
    # the summed locals, per remaining coordinate, are x cut down by the Shard placements only
    tokens = placements.split(",")
    assert len(sums) == math.prod(m for k, m in enumerate(mesh) if k not in partial_dims)
    for key, total in sums.items():
        coord = list(key)
        for k in sorted(partial_dims):
            coord.insert(k, 0)
        idx = [expected_index(x.shape[d], [(mesh[k], coord[k]) for k, tok in enumerate(tokens)
                                           if tok == f"S{d}"]) for d in range(x.dim())]
        expected = x[torch.meshgrid(*idx, indexing="ij")]
        assert torch.equal(total.reshape(-1).view(torch.uint8),
                           expected.reshape(-1).view(torch.uint8)), (key, total, expected)


@pytest.mark.parametrize("op, reduce", [("avg", lambda ts: torch.stack(ts).mean(0)),
                                        ("min", lambda ts: torch.stack(ts).amin(0)),
                                        ("max", lambda ts: torch.stack(ts).amax(0))])
def test_partial_avg_min_max_keep_x(op, reduce):
    # integer values, so the mean of identical copies is exact
    x = torch.randint(-50, 50, (3, 5), generator=torch.Generator().manual_seed(1)).float()
    locals_ = all_locals(x, (3,), f"P{op}")
    for t in locals_:
        assert torch.equal(t, x)
    assert torch.equal(reduce(locals_), x)
    assert values(all_locals(x, (2, 2), f"S1,P{op}")) == values(
        [x[:, :3], x[:, :3], x[:, 3:], x[:, 3:]])


# ------------------------------------------------------------------------------------------
# against torch's own DTensor placement splitting (no process group needed)

def torch_split(placement, t: torch.Tensor, n: int) -> list[torch.Tensor]:
    shards, pads = placement._split_tensor(t, n, with_padding=False)
    assert len(shards) == n
    assert not pads or not any(pads)
    return shards


def test_against_torch_shard_split_tensor():
    placement_types = pytest.importorskip("torch.distributed.tensor.placement_types")
    for dim, base in ((0, (1, 2)), (1, (3, 1))):
        for length in range(0, 14):
            shape = list(base)
            shape.insert(dim, length)
            x = torch.arange(math.prod(shape)).reshape(shape)
            for n in range(1, 8):
                shards = torch_split(placement_types.Shard(dim), x, n)
                for i in range(n):
                    assert torch.equal(local_shard(x, (n,), f"S{dim}", (i,)), shards[i]), \
                        (dim, length, n, i)


def test_against_torch_strided_shard_split_tensor():
    placement_types = pytest.importorskip("torch.distributed.tensor.placement_types")
    strided = placement_types._StridedShard
    for dim in (0, 1):
        for length in range(0, 19):
            shape = [2, 2]
            shape[dim] = length
            x = torch.arange(math.prod(shape)).reshape(shape)
            for n in range(1, 7):
                for k in range(1, 6):
                    shards = torch_split(strided(dim, split_factor=k), x, n)
                    for i in range(n):
                        got = local_shard(x, (n,), f"SS{dim}sf{k}", (i,))
                        assert torch.equal(got, shards[i]), (dim, length, n, k, i)


def test_torch_docstring_strided_example_via_torch():
    placement_types = pytest.importorskip("torch.distributed.tensor.placement_types")
    shards = torch_split(placement_types._StridedShard(0, split_factor=2), torch.arange(9), 4)
    assert values(shards) == [[0, 1, 5], [2, 3, 6], [4, 7], [8]]


# ------------------------------------------------------------------------------------------
# errors

@pytest.mark.parametrize("mesh, placements, coord", [
    ((2, 2), "S0", (0, 0)),              # too few placements
    ((2,), "S0,R", (0,)),                # too many placements
    ((2, 2), "S0,R", (0,)),              # too few coordinates
    ((2,), "S0", (0, 0)),                # too many coordinates
    ((2,), "S2", (0,)),                  # shard dim out of range for a 2-d x
    ((2, 2), "R,S5", (0, 1)),
    ((2,), "SS2sf2", (0,)),
    ((2,), "S0", (2,)),                  # coordinate outside the mesh
    ((2,), "S0", (-1,)),
    ((2, 4), "R,S1", (1, 4)),
    ((2, 2), "R,R", (2, 0)),
])
def test_local_shard_errors(mesh, placements, coord):
    with pytest.raises(ValueError):
        local_shard(ar(4, 4), mesh, placements, coord)


def test_unknown_partial_op_is_rejected():
    assert "prod" not in PARTIAL_OPS
    with pytest.raises(ValueError):
        local_shard(ar(2, 2).float(), (2,), [Placement("P", op="prod")], (0,))


def test_placement_objects_are_accepted_like_text():
    x = ar(6, 4)
    assert values(all_locals(x, (3, 2), [Placement("S", 0), Placement("S", 1)])) == \
        values(all_locals(x, (3, 2), "S0,S1"))
