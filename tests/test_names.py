"""Pairing saved state names with a rebuilt model's (checkpoints and .keras files)."""

from __future__ import annotations

import subprocess
import sys

from gradpipe.names import match_saved_names, matched_layout


def slots(*paths: str) -> list[str]:
    return [f"slots/1_adam/mu/{p}" for p in paths]


def test_equal_names_pair_with_themselves():
    names = slots("sequential.dense.kernel", "sequential.dense_1.kernel")
    assert match_saved_names(names, names) == {n: n for n in names}


def test_numbering_pairs_layers_in_creation_order_even_where_names_coincide():
    """Saved dense_1, dense_2 into a model whose layers are dense_2, dense_3: equal
    names would pair the saved second layer with the new first one."""
    saved = slots("dense_1.kernel", "dense_2.kernel")
    expected = slots("dense_2.kernel", "dense_3.kernel")
    assert match_saved_names(expected, saved) == dict(zip(saved, expected))


def test_a_second_instance_in_the_same_process():
    saved = slots("sequential.dense.kernel", "sequential.dense_1.kernel")
    expected = slots("sequential_1.dense_2.kernel", "sequential_1.dense_3.kernel")
    assert match_saved_names(expected, saved) == dict(zip(saved, expected))


def test_numbers_are_compared_component_by_component():
    """Two models in one optimizer: sequential.dense_1 and sequential_1.dense both
    carry one number; the component it belongs to tells them apart."""
    saved = slots("sequential.dense_1.kernel", "sequential_1.dense.kernel")
    expected = slots("sequential_2.dense_3.kernel", "sequential_3.dense_4.kernel")
    assert match_saved_names(expected, saved) == dict(zip(saved, expected))


def test_a_unique_dot_boundary_suffix_matches():
    """Keras may rebuild sequential_3.dense.kernel as dense.kernel."""
    saved = slots("sequential_3.dense.kernel")
    assert match_saved_names(slots("dense.kernel"), saved) == dict(zip(saved,
                                                                      slots("dense.kernel")))


def test_an_ambiguous_suffix_or_another_transform_does_not_match():
    saved = slots("dense.kernel")
    expected = slots("a.dense.kernel", "b.dense.kernel", "a.dense.bias")
    assert match_saved_names(expected, saved) == {}
    assert match_saved_names(["slots/0_sgd/momentum/dense.kernel"], saved) == {}


def test_matched_layout_names_what_still_differs():
    expected = {"iterations": [], "slots/1_adam/mu/dense_2.kernel": [3, 2]}
    saved = {"iterations": [], "slots/1_adam/mu/dense.kernel": [3, 4],
             "slots/1_adam/nu/dense.kernel": [3, 4]}
    matched, difference = matched_layout(expected, saved)
    assert matched["slots/1_adam/mu/dense.kernel"] == "slots/1_adam/mu/dense_2.kernel"
    assert difference == ("saved but not in this pipeline: slots/1_adam/nu/dense.kernel; "
                          "different shapes: slots/1_adam/mu/dense_2.kernel [3, 4] saved "
                          "vs [3, 2]")


def test_no_tensorflow_needed():
    code = "import sys, gradpipe.names; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr
