"""CodedReduce: Example 2, Theorem 1's load, exact tree decoding under every arrival pattern, Theorem 2."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradcode.common.codes import make_code
from gradcode.common.codes.coded_reduce import (
    DEFAULT_SEED,
    CodedReduceCode,
    CodedReduceTree,
    CompAllocCode,
    coded_reduce_latency_bounds,
    expected_order_statistic,
    gradient_coding_latency,
    harmonic,
    optimal_load,
    simulate_coded_reduce,
    simulate_coded_reduce_latency,
    uncoded_latency,
)
from gradcode.common.codes.cyclic import draw_cyclic_repetition
from gradcode.common.codes.numerics import DEFAULT_MAX_DECODE_ERROR, equilibrated_decoding_weights
from gradcode.common.exceptions import NotDecodableError

TOLERANCE = 1e-9

# Example 2 / eq. (4) (the same pair as Tandon et al.'s Fig. 1b): row f of A decodes when child f straggles.
PAPER_A = np.array([[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, -1.0, 0.0]])
PAPER_B = np.array([[0.5, 1.0, 0.0], [0.0, 1.0, -1.0], [0.5, 0.0, 1.0]])


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def closed_form_load(n: int, L: int, s: int) -> Fraction:
    """Eq. (5) through the geometric-series closed form (independent of the module's sum)."""
    q = Fraction(n, s + 1)
    return Fraction(1, L) if q == 1 else (q - 1) / (q * (q**L - 1))


def arrival_patterns(tree: CodedReduceTree, rng: np.random.Generator) -> Iterator[dict[int, list[int]]]:
    """Every choice, per parent, of a decodable-size set of surviving children (in a random order)."""
    n, s = tree.n, tree.s
    options = {
        parent: [c for size in range(n - s, n + 1) for c in itertools.combinations(tree.node(parent).children, size)]
        for parent in tree.parents
    }
    for choice in itertools.product(*options.values()):
        yield {parent: [int(c) for c in rng.permutation(kids)] for parent, kids in zip(options, choice, strict=True)}


# ---- Example 2 ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def example2() -> CodedReduceTree:
    """The (3, 2)-regular tree, s = 1, with the paper's B (eq. (4))."""
    return CodedReduceTree(3, 1, 2, encoding=PAPER_B)


def test_example2_load_and_shape(example2: CodedReduceTree) -> None:
    assert example2.load == Fraction(4, 15)
    assert example2.num_workers == 12
    assert example2.num_partitions == 15  # D^{T(1,1)} cut into 5 subsets of 2/15 each
    for node in example2.nodes[1:]:
        assert example2.node_load(node.id) == Fraction(4, 15)


def test_example2_allocation_of_subtree_1_1(example2: CodedReduceTree) -> None:
    def blocks(*pairs: tuple[Sequence[int], float]) -> np.ndarray:
        v = np.zeros(15)
        for parts, c in pairs:
            v[list(parts)] += c
        return v

    # D^{T(1,1)} = 1/2 D_1 u D_2 with D_1, D_2 the first two thirds; its five 2/15-subsets in order:
    d_t = [
        blocks(([0, 1], 0.5)),
        blocks(([2, 3], 0.5)),
        blocks(([4], 0.5), ([5], 1.0)),
        blocks(([6, 7], 1.0)),
        blocks(([8, 9], 1.0)),
    ]
    node_1_1 = example2.node_at(1, 0)
    np.testing.assert_array_equal(example2.subtree_vector(node_1_1.id), blocks((range(5), 0.5), (range(5, 10), 1.0)))
    np.testing.assert_array_equal(example2.local_vector(node_1_1.id), d_t[0] + d_t[1])
    c1, c2, c3 = (example2.local_vector(c) for c in node_1_1.children)
    np.testing.assert_array_equal(c1, 0.5 * d_t[2] + d_t[3])
    np.testing.assert_array_equal(c2, d_t[3] - d_t[4])
    np.testing.assert_array_equal(c3, 0.5 * d_t[2] + d_t[4])


def test_example2_decoding_vectors_are_the_papers(example2: CodedReduceTree) -> None:
    for straggler, a_row in enumerate(PAPER_A):
        survivors = [i for i in range(3) if i != straggler]
        decoding = example2.code.decode(survivors)
        np.testing.assert_allclose(decoding.weights, a_row[survivors], atol=1e-12)


def test_example2_worked_messages(example2: CodedReduceTree) -> None:
    g = np.random.default_rng(2).standard_normal((15, 4))
    g_d1, g_d2, g_d3 = g[0:5].sum(0), g[5:10].sum(0), g[10:15].sum(0)
    node_1_1 = example2.node_at(1, 0)
    m = {c: example2.local_vector(c) @ g for c in node_1_1.children}
    c1, c2, _ = node_1_1.children
    # m_(1,1) = [2, -1, 0] [m_(2,1); m_(2,2); m_(2,3)] + g_D(1,1) = 1/2 g_D1 + g_D2 (third row of A).
    m_1_1 = 2 * m[c1] - m[c2] + example2.local_vector(node_1_1.id) @ g
    assert relative_error(m_1_1, 0.5 * g_d1 + g_d2) <= TOLERANCE
    # The master from (1,1) and (1,3) with [1, 0, 1]: (1/2 g_D1 + g_D2) + (1/2 g_D1 + g_D3) = g_D.
    first, _, third = example2.nodes[0].children
    want = g.sum(axis=0)
    root = simulate_coded_reduce(example2, g, {0: [first, third], node_1_1.id: [c1, c2]})
    assert relative_error(root, want) <= TOLERANCE
    assert relative_error(example2.subtree_vector(first) @ g, 0.5 * g_d1 + g_d2) <= TOLERANCE
    assert relative_error(example2.subtree_vector(third) @ g, 0.5 * g_d1 + g_d3) <= TOLERANCE


def test_example2_any_two_children_per_parent(example2: CodedReduceTree) -> None:
    rng = np.random.default_rng(7)
    g = rng.standard_normal((example2.num_partitions, 5))
    want = g.sum(axis=0)
    count = 0
    for arrivals in arrival_patterns(example2, rng):
        assert relative_error(simulate_coded_reduce(example2, g, arrivals), want) <= TOLERANCE, arrivals
        count += 1
    assert count == 4**4  # 4 parents, each: 3 pairs or all three children


# ---- Theorem 1 -----------------------------------------------------------------------------------

TREE_PARAMS = [(n, L, s) for n in range(1, 7) for L in range(1, 4) for s in range(n)]


@pytest.mark.parametrize(("n", "L", "s"), TREE_PARAMS)
def test_theorem1_load_matches_allocation(n: int, L: int, s: int) -> None:
    tree = CodedReduceTree(n, s, L)
    r = closed_form_load(n, L, s)
    assert optimal_load(n, L, s) == r
    assert math.isclose(float(r), 1 / sum((n / (s + 1)) ** level for level in range(1, L + 1)), rel_tol=1e-12)
    assert tree.num_workers == sum(n**level for level in range(1, L + 1))
    for node in tree.nodes[1:]:
        assert tree.node_load(node.id) == r, node
        if node.is_leaf:  # leaves keep whatever reached them: eq. (13) with |D^{T(L,i)}| = r d
            assert tree.leaf_load(node.id) == r
    assert tree.node_load(0) == 0


@pytest.mark.parametrize(("n", "L", "s"), TREE_PARAMS)
def test_columns_of_every_parent_code_are_its_super_partitions(n: int, L: int, s: int) -> None:
    tree = CodedReduceTree(n, s, L)
    ones = np.ones(n)
    for parent in tree.parents:
        pieces = tree.super_partitions(parent)
        for child in tree.node(parent).children:
            slot = tree.node(child).slot
            np.testing.assert_allclose(tree.subtree_vector(child), tree.code.B[slot] @ pieces, atol=1e-12)
        np.testing.assert_allclose(tree.subtree_vector(parent), tree.local_vector(parent) + ones @ pieces, atol=1e-12)
    np.testing.assert_array_equal(tree.subtree_vector(0), np.ones(tree.num_partitions))


def test_remark2_three_layers_cut_the_load_sevenfold() -> None:
    # alpha = 1/2 with n/(s+1) = 2 exactly: r = 1/2 for one layer, 1/(2 + 4 + 8) for three.
    assert optimal_load(4, 1, 1) / optimal_load(4, 3, 1) == 7


def test_tree_structure() -> None:
    tree = CodedReduceTree(3, 1, 3)
    assert [node.id for node in tree.nodes] == list(range(1 + 3 + 9 + 27))
    for node in tree.nodes:
        assert tree.node_at(node.layer, node.index) is node
        for slot, child in enumerate(node.children):
            assert tree.node(child).parent == node.id
            assert tree.node(child).slot == slot
            assert tree.node(child).layer == node.layer + 1
            assert tree.node(child).index == 3 * node.index + slot
        assert node.is_leaf == (node.layer == 3)
    assert tree.nodes[0].is_master and tree.nodes[0].partitions == ()
    assert len(tree.parents) == 1 + 3 + 9


# ---- CR.Execute: exact decoding bottom-up --------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "s", "L"),
    [
        (2, 1, 2),
        (3, 1, 2),
        (2, 0, 3),
        *(pytest.param(*p, marks=pytest.mark.slow) for p in [(3, 2, 2), (2, 1, 3), (4, 1, 2)]),
    ],
)
def test_every_combination_of_surviving_children(n: int, s: int, L: int) -> None:
    tree = CodedReduceTree(n, s, L)
    rng = np.random.default_rng(11)
    g = rng.standard_normal((tree.num_partitions, 3))
    want = g.sum(axis=0)
    worst = max(
        relative_error(simulate_coded_reduce(tree, g, arrivals), want) for arrivals in arrival_patterns(tree, rng)
    )
    assert worst <= TOLERANCE


@settings(max_examples=40, deadline=None)
@given(
    params=st.sampled_from([(n, s, L) for n in range(2, 6) for s in range(n) for L in (2, 3)]),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_arrivals_in_deeper_trees(params: tuple[int, int, int], seed: int) -> None:
    """The decoded sum's error is measured against the size of what was summed (the sum of the partial
    gradients' norms): against the norm of the sum alone, the chance cancellation of ~300 random vectors (a
    factor of about 17) and three levels of decoding weights took one draw past 1e-9 (n, s, L = 5, 3, 3:
    1.5e-9 of the sum, 8e-11 of the summands)."""
    n, s, L = params
    tree = CodedReduceTree(n, s, L)
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((tree.num_partitions, 4))
    arrivals = {}
    for parent in tree.parents:
        kids = list(tree.node(parent).children)
        arrivals[parent] = [int(c) for c in rng.permutation(kids)[: rng.integers(n - s, n + 1)]]
    error = np.linalg.norm(simulate_coded_reduce(tree, g, arrivals) - g.sum(axis=0))
    assert error <= TOLERANCE * np.linalg.norm(g, axis=1).sum()


def test_too_many_stragglers_under_a_used_parent_is_refused() -> None:
    tree = CodedReduceTree(4, 2, 2)
    g = np.random.default_rng(0).standard_normal((tree.num_partitions, 2))
    first = tree.nodes[0].children[0]
    only_one = {first: [tree.node(first).children[0]]}
    with pytest.raises(NotDecodableError):
        simulate_coded_reduce(tree, g, only_one)
    # The same parent straggling itself does not matter: the master never needs its message.
    rest = list(tree.nodes[0].children[1:])
    result = simulate_coded_reduce(tree, g, {**only_one, 0: rest})
    assert relative_error(result, g.sum(axis=0)) <= TOLERANCE


def test_parent_stops_at_the_first_decodable_moment() -> None:
    tree = CodedReduceTree(3, 1, 2)
    g = np.random.default_rng(3).standard_normal((tree.num_partitions, 2))
    decoder = tree.code.decoder()
    assert not decoder.add(0)
    assert decoder.add(2)
    assert decoder.decoding().rows == (0, 2)
    # The late third child is dropped: the result is bit-for-bit the one without it.
    first, second, third = tree.nodes[1].children
    late = simulate_coded_reduce(tree, g, {1: [first, third, second]})
    absent = simulate_coded_reduce(tree, g, {1: [first, third]})
    np.testing.assert_array_equal(late, absent)
    assert relative_error(late, g.sum(axis=0)) <= TOLERANCE


def test_simulation_refuses_bad_input() -> None:
    tree = CodedReduceTree(2, 1, 2)
    g = np.zeros((tree.num_partitions, 2))
    with pytest.raises(ValueError, match="partial_gradients"):
        simulate_coded_reduce(tree, np.zeros((tree.num_partitions + 1, 2)))
    with pytest.raises(ValueError, match="not a child"):
        simulate_coded_reduce(tree, g, {0: [3]})
    with pytest.raises(ValueError, match="has no children"):
        simulate_coded_reduce(tree, g, {3: [1]})


# ---- the registered master's view ----------------------------------------------------------------


def test_registered_one_layer_tree_is_an_ordinary_gradient_code() -> None:
    code = make_code("coded_reduce", n=5, s=2)
    assert isinstance(code, CodedReduceCode)
    assert (code.n, code.k, code.s, code.L) == (5, 5, 2, 1)
    np.testing.assert_array_equal(code.B, code.tree.code.B)
    assert np.all(np.count_nonzero(code.B, axis=1) == 3)
    assert CodedReduceCode.for_stragglers(5, 2).B.tolist() == code.B.tolist()


def test_registered_deep_tree_rows_are_subtree_messages() -> None:
    code = make_code("coded_reduce", n=3, s=1, L=3)
    tree = code.tree
    assert code.k == tree.num_partitions
    np.testing.assert_allclose(code.B, tree.code.B @ tree.super_partitions(0), atol=0)
    for i, child in enumerate(tree.nodes[0].children):
        np.testing.assert_array_equal(code.B[i], tree.subtree_vector(child))
    g = np.random.default_rng(5).standard_normal((code.k, 3))
    decoding = code.decode([2, 0])
    got = decoding.combine({r: code.B[r] @ g for r in decoding.rows})
    assert relative_error(got, g.sum(axis=0)) <= TOLERANCE
    assert repr(code) == "<CodedReduceCode(n=3, s=1, L=3, seed=2019)>"


def test_draw_is_deterministic_and_seeded() -> None:
    assert np.array_equal(CompAllocCode(6, 2).B, CompAllocCode(6, 2).B)
    assert not np.array_equal(CompAllocCode(6, 2, seed=1).B, CompAllocCode(6, 2).B)
    np.testing.assert_array_equal(CompAllocCode(4, 0).B, np.eye(4))
    np.testing.assert_array_equal(CompAllocCode(4, 3).B, np.ones((4, 4)))


@pytest.mark.parametrize(("n", "s", "seed"), [(6, 2, DEFAULT_SEED), (9, 4, 1), (5, 1, 0), (12, 5, 3)])
def test_per_parent_code_is_the_shared_checked_cyclic_draw(n: int, s: int, seed: int) -> None:
    # One implementation of Algorithm 2 (gradcode.common.codes.cyclic), with its decode-error guard.
    accepted = draw_cyclic_repetition(n, s, seed=seed)
    assert accepted.measured_decode_error <= DEFAULT_MAX_DECODE_ERROR
    code = CompAllocCode(n, s, seed=seed)
    np.testing.assert_array_equal(code.B, accepted.B)
    survivors = list(range(s, n))
    np.testing.assert_array_equal(
        code.decode(survivors).weights, equilibrated_decoding_weights(accepted.B[survivors], independent=True)
    )


def test_custom_encoding_decodes_from_more_than_n_minus_s_children(example2: CodedReduceTree) -> None:
    decoding = example2.code.decode([2, 0, 1])  # every child: a least-squares solve over dependent rows
    np.testing.assert_allclose(decoding.weights @ PAPER_B[list(decoding.rows)], np.ones(3), atol=1e-12)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"n": 0, "s": 0, "L": 1}, "Argument 'n'"),
        ({"n": 3, "s": 3, "L": 1}, "Argument 's'.*not 3"),
        ({"n": 3, "s": -1, "L": 1}, "Argument 's'"),
        ({"n": 3, "s": 1, "L": 0}, "Argument 'L'.*not 0"),
        ({"n": 3, "s": 1, "L": 1.5}, "Argument 'L'"),
        ({"n": 3, "s": True, "L": 1}, "Argument 's'"),
        ({"n": 3, "s": 1, "L": 2, "seed": -1}, "Argument 'seed'"),
    ],
)
def test_invalid_parameters(params: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_code("coded_reduce", **params)
    tree_params = {k: v for k, v in params.items() if k != "seed"}
    if "seed" not in params:
        with pytest.raises(ValueError, match=match):
            CodedReduceTree(**tree_params)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=match):
            optimal_load(**tree_params)  # type: ignore[arg-type]


def test_invalid_custom_encoding() -> None:
    with pytest.raises(ValueError, match="3 x 3"):
        CodedReduceTree(3, 1, 2, encoding=np.ones((3, 2)))
    with pytest.raises(ValueError, match="exactly s \\+ 1 = 2 non-zeros"):
        CodedReduceTree(3, 1, 2, encoding=np.ones((3, 3)))
    with pytest.raises(ValueError, match="span"):  # 0/1 cyclic band: rows 0, 1 give (a, a + b, b) != 1
        CodedReduceTree(3, 1, 2, encoding=np.array([[1.0, 1, 0], [0, 1, 1], [1, 0, 1]]))


def test_tree_lookups_refuse_bad_ids() -> None:
    tree = CodedReduceTree(2, 1, 2)
    with pytest.raises(ValueError, match="node_id"):
        tree.node(7)
    with pytest.raises(ValueError, match="index"):
        tree.node_at(1, 2)
    with pytest.raises(ValueError, match="leaf"):
        tree.super_partitions(3)


# ---- Theorem 2's latency model --------------------------------------------------------------------


def test_harmonic_and_order_statistics_by_hand() -> None:
    assert harmonic(0) == 0
    assert harmonic(3) == pytest.approx(11 / 6)
    assert expected_order_statistic(2, 1, shift=0.0, mean=1.0) == pytest.approx(0.5)  # min of two Exp(1)
    assert expected_order_statistic(3, 3, shift=2.0, mean=3.0) == pytest.approx(2 + 3 * 11 / 6)


def test_theorem2_by_hand_example2_tree() -> None:
    # (n, L, s) = (3, 2, 1), d = 15: every worker holds r d = 4 points; shift a r d = 4, mean r d / mu = 2.
    bounds = coded_reduce_latency_bounds(3, 2, 1, d=15, a=1, mu=2, t_c=0.5)
    computation = 4 + 2 * (harmonic(3) - harmonic(1))  # = 17/3
    assert bounds.computation == pytest.approx(17 / 3)
    assert bounds.computation == pytest.approx(computation)
    assert bounds.lower == pytest.approx(17 / 3 + (3 - 1 + 2 - 1) * 0.5)
    assert bounds.upper == pytest.approx(17 / 3 + 2 * (3 - 1) * 0.5)


def test_baselines_by_hand() -> None:
    # Uncoded, N = 2, d = 4: each worker 2 points, wait for both, two serial receptions.
    assert uncoded_latency(2, d=4, a=1, mu=1, t_c=0.5) == pytest.approx(2 + 2 * 1.5 + 2 * 0.5)
    # GC, N = 3, S = 1, d = 3: 2 points each, wait for 2 of 3: 2 + 2 (H3 - H1) + 2 t_c.
    assert gradient_coding_latency(3, 1, d=3, a=1, mu=1, t_c=1) == pytest.approx(2 + 2 * 5 / 6 + 2)


def test_latency_monte_carlo_matches_hand_computed_means() -> None:
    rng = np.random.default_rng(4)
    # One worker: T = a d + Exp(mean d / mu) + t_c, mean 1 + 2 + 0.25; sd of the mean 2 / sqrt(20000).
    single = simulate_coded_reduce_latency(1, 1, 0, d=2, a=0.5, mu=1, t_c=0.25, iterations=20_000, rng=rng)
    assert single.mean() == pytest.approx(3.25, abs=5 * 2 / math.sqrt(20_000))
    # Two workers, one straggler tolerated (r = 1): T = min(C1, C2) + t_c, mean 1 + 1 + 0.25.
    either = simulate_coded_reduce_latency(2, 1, 1, d=2, a=0.5, mu=1, t_c=0.25, iterations=20_000, rng=rng)
    assert either.mean() == pytest.approx(2.25, abs=5 * 1 / math.sqrt(20_000))
    # A chain of three (n = 1, L = 3, r = 1/3), free links: T = max of the three computations.
    chain = simulate_coded_reduce_latency(1, 3, 0, d=3, a=1, mu=1, t_c=0.0, iterations=20_000, rng=rng)
    assert chain.mean() == pytest.approx(1 + harmonic(3), abs=5 * 1.2 / math.sqrt(20_000))
    # Deterministic computation: T is pure communication, L (n - s) t_c when every child is ready at once.
    fixed = simulate_coded_reduce_latency(3, 2, 1, d=15, a=1, mu=1e12, t_c=0.5, iterations=10, rng=rng)
    np.testing.assert_allclose(fixed, 4 + 2 * 2 * 0.5, rtol=1e-9)


def test_latency_refuses_bad_parameters() -> None:
    with pytest.raises(ValueError, match="Argument 'mu'"):
        coded_reduce_latency_bounds(3, 2, 1, d=15, a=1, mu=0, t_c=0.5)
    with pytest.raises(ValueError, match="Argument 't_c'"):
        coded_reduce_latency_bounds(3, 2, 1, d=15, a=1, mu=1, t_c=-1)
    with pytest.raises(ValueError, match="Argument 's'"):
        coded_reduce_latency_bounds(3, 2, 3, d=15, a=1, mu=1, t_c=1)
    with pytest.raises(ValueError, match="Argument 'rank'"):
        expected_order_statistic(3, 4, shift=0, mean=1)
    with pytest.raises(ValueError, match="Argument 'iterations'"):
        simulate_coded_reduce_latency(2, 1, 0, d=1, a=1, mu=1, t_c=1, iterations=0)
