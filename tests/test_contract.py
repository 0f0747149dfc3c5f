"""Every built-in component passes the public contract suite (gradpipe.testing)."""

from __future__ import annotations

import pytest

from conftest import register_transform
from gradpipe.testing import check_component, contract_cases


@pytest.mark.slow
@pytest.mark.parametrize("kind, name", contract_cases(dist="gradpipe"))
def test_builtin_contract(kind, name):
    check_component(kind, name)


def _register(name, update, init=None, **options):
    """Register an in-process third-party transform from ``update`` (and ``init``)."""
    from gradpipe.plugin import Transform, no_state

    register_transform(name, lambda cfg: Transform(init or no_state, update), **options)


def test_suite_catches_a_changed_gradient_structure():
    from gradpipe.testing import ContractError

    _register("drops_one", lambda grads, state, variables: (list(grads)[:-1], state))
    with pytest.raises(ContractError, match="must return one update per variable"):
        check_component("transform", "drops_one")


def test_suite_catches_numpy_inside_the_step():
    from gradpipe.testing import ContractError

    def update(grads, state, variables):
        scale = float(grads[0].numpy().max())  # host sync: breaks under tf.function
        return [None if g is None else g * scale for g in grads], state

    _register("calls_numpy", update)
    with pytest.raises(ContractError, match=r"(?s)failed inside tf.function.*no \.numpy\(\)"):
        check_component("transform", "calls_numpy")


def test_a_transform_whose_finite_gradients_overflow_passes_because_the_step_is_skipped():
    """Nothing to declare, so nothing to declare falsely: 1/g overflows for tiny
    finite gradients, and the engine skips those steps (the suite checks that no
    non-finite value is left)."""
    def update(grads, state, variables):
        return [None if g is None else 1.0 / (g * 1e-30) for g in grads], state

    _register("overflows", update)
    check_component("transform", "overflows")


def test_suite_catches_a_kernel_that_differs_from_update():
    from gradpipe.testing import ContractError

    def update(grads, state, variables):
        return [None if g is None else g * 0.1 for g in grads], state

    def kernel(config):
        def apply(grads, slots, variables):
            return [v.assign_sub(g * 0.2) for g, v in zip(grads, variables) if g is not None]
        return apply

    _register("sloppy_kernel", update, kernel=kernel, capabilities={"update_rule": True})
    with pytest.raises(ContractError, match=r"its kernel and update\(\) disagree"):
        check_component("transform", "sloppy_kernel")


def test_a_stateful_transform_keeps_its_state_on_skipped_steps_on_every_path():
    """A counter that must not move on a skipped step: the engine keeps every
    transform's state on the compiled path too, with no declaration."""
    def update(grads, state, variables):
        return [None if g is None else g * 0.1 for g in grads], state + 1

    _register("counts", update, init=lambda variables: 0.0)
    check_component("transform", "counts")


def test_contract_cases_fail_loudly_for_a_broken_or_misspelt_distribution(fake_dists):
    """An empty parametrize list would make pytest skip the contract tests and pass
    green; a plugin that failed to load, or a misspelt name, is an error instead."""
    fake_dists.add("gradpipe-broken", "0.1", {"broken": "gp_broken"},
                   {"gp_broken": "import not_a_module_anywhere\n"})
    code = """
        from gradpipe.testing import ContractError, contract_cases
        for dist in ("gradpipe-broken", "gradpipe-brokne", "gradpipe-agc"):
            try:
                print(dist, "->", contract_cases(dist=dist))
            except ContractError as error:
                print(dist, "->", error)
    """
    out = fake_dists.run(code).stdout
    assert ("gradpipe-broken -> distribution 'gradpipe-broken' provides no components: "
            "its plugin") in out
    assert "gp_broken.py:1" in out and "not_a_module_anywhere" in out
    assert ("gradpipe-brokne -> no installed plugin comes from distribution "
            "'gradpipe-brokne' (did you mean 'gradpipe-broken'?)") in out
    assert "gradpipe-agc -> [('transform', 'agc')]" in out


def test_a_wrong_name_index_fails_the_contract_and_is_shown_by_plugins(fake_dists):
    """The `gradpipe.components` index only makes loading lazy, so a wrong entry
    breaks nothing visibly; the contract suite and `gradpipe plugins` name it."""
    fake_dists.add("gradpipe-halver", "0.1", {"halver": "gp_halver"}, {"gp_halver": """
        import attrs
        import gradpipe.plugin as gp

        @attrs.frozen(kw_only=True)
        class HalveConfig:
            pass

        def halve(config):
            return gp.GradientTransform(init=lambda params: (),
                                        update=lambda g, s, p=None: ([x / 2 for x in g], s))

        @gp.hookimpl
        def gradpipe_register_transforms(register):
            register("halve", halve, HalveConfig)
    """})
    info = fake_dists.root / "gradpipe_halver-0.1.dist-info" / "entry_points.txt"
    info.write_text(info.read_text() + '\n[gradpipe.components]\n'
                    'transforms.halve = gp_halver\ntransform.double = gp_halver\n')
    code = """
        from gradpipe.testing import ContractError, contract_cases
        try:
            contract_cases(dist="gradpipe-halver")
        except ContractError as error:
            print(error)
    """
    out = fake_dists.run(code).stdout
    assert "index entry 'transforms.halve' is not \"kind.name\" with kind one of transform" in out
    assert "index lists transform 'double', which the plugin does not register" in out
    assert "index does not list transform 'halve'" in out
    listed = fake_dists.run("from gradpipe.cli import main; main(['plugins'])").stdout
    assert "warning: index entry 'transforms.halve'" in listed


def test_suite_names_python_state_where_eager_and_traced_steps_differ():
    """A counter kept in Python is read once, when the step is traced: the suite says
    where such a value belongs."""
    from gradpipe.testing import ContractError

    calls = []

    def update(grads, state, variables):
        calls.append(None)
        return [None if g is None else g * float(len(calls)) for g in grads], state

    _register("python_counter", update)
    with pytest.raises(ContractError, match=r"(?s)differ.*read once when the step is traced: "
                                                r"keep it in the transform's state"):
        check_component("transform", "python_counter")
